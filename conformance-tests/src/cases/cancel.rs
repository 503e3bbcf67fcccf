//! Cancel safety: a dropped acquire leaves no lock held and no waiter behind.

use std::time::Duration;

use dlock_api::{LockName, LockOptions};
use rand::Rng;

use crate::{CaseResult, Ctx, Failure, ensure};

/// The options of every lock a case here takes: a lease far longer than the case's bound, so that
/// a lock a cancelled call left behind is still held when the case looks, rather than running
/// out on its own (at the default TTL, as long as the bound) and passing unseen.
fn outlasting(ctx: &Ctx) -> LockOptions {
    LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4))
}

/// An `acquire` dropped while waiting leaves no ghost: after the holder releases, a third client
/// acquires at once, and after that the lock is free again.
pub async fn dropped_acquire_leaves_nothing(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("lock");
    let outlasting = outlasting(&ctx);
    let holder = a.acquire(&name, &outlasting).await?;
    for _ in 0..3 {
        let waiting =
            tokio::time::timeout(Duration::from_millis(200), b.acquire(&name, &outlasting)).await;
        ensure!(
            waiting.is_err(),
            "the waiting acquire finished while the lock was held"
        );
    }
    holder.release().await?;
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let next = c
        .acquire(&name, &wait)
        .await
        .map_err(|e| Failure(format!("a cancelled waiter blocked the lock: {e}")))?;
    next.release().await?;
    let last = b.try_acquire(&name, &LockOptions::new()).await?;
    let Some(last) = last else {
        return Err(Failure("a cancelled acquire took the lock later".into()));
    };
    last.release().await?;
    Ok(())
}

/// An `acquire` dropped while the lock was free and being granted leaves no lock held.
pub async fn dropped_acquire_race_leaves_nothing(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let outlasting = outlasting(&ctx);
    // Drop acquires after ever later points: before the request, in flight, after the reply.
    for micros in [0u64, 50, 100, 200, 400, 800, 1600, 3200] {
        let attempt =
            tokio::time::timeout(Duration::from_micros(micros), a.acquire(&name, &outlasting))
                .await;
        if let Ok(guard) = attempt {
            guard?.release().await?;
        }
    }
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let free = b
        .acquire(&name, &wait)
        .await
        .map_err(|e| Failure(format!("a cancelled acquire left the lock held: {e}")))?;
    free.release().await?;
    Ok(())
}

/// Many acquires cut short at random points (a `timeout` around the call, a short wait timeout,
/// an aborted task, including aborts inside `release`), against holders that come and go, leave
/// every name free: each client, and a fresh one, can take every name afterwards. Repeated in
/// rounds so that an intermittent leak cannot pass by luck.
pub async fn storm_leaves_every_name_free(ctx: Ctx) -> CaseResult {
    const CLIENTS: usize = 3;
    const NAMES: usize = 3;
    const ROUNDS: usize = 6;
    const TASKS: usize = 36;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(ctx.client().await?);
    }
    let names: Vec<LockName> = (0..NAMES).map(|i| ctx.name(&format!("n{i}"))).collect();
    let bound = ctx.timing().bound;
    for _ in 0..ROUNDS {
        let (clients, names) = (&clients, &names);
        cut_short_round(&ctx, TASKS, &outlasting(&ctx), |t, opts, hold| {
            let (client, name) = (clients[t % CLIENTS].clone(), names[t % NAMES].clone());
            async move {
                let guard = client.acquire(&name, &opts).await?;
                tokio::time::sleep(hold).await;
                guard.release().await
            }
        })
        .await?;
    }
    // A fresh client first: it sees what is left on the server; then each storm client, which
    // must not refuse a free name because of its own records.
    let fresh = ctx.client().await?;
    let wait = LockOptions::new().with_wait_timeout(bound);
    for (i, client) in std::iter::once(&fresh).chain(clients.iter()).enumerate() {
        for name in &names {
            match client.acquire(name, &wait).await {
                Ok(guard) => guard.release().await?,
                Err(e) => {
                    let who = if i == 0 {
                        "a fresh client".to_owned()
                    } else {
                        format!("storm client {}", i.saturating_sub(1))
                    };
                    let left = ctx.harness().residue(&names).await;
                    return Err(Failure(format!(
                        "after the storm, {who} could not take {name}: {e}; on the server: {left:?}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// One round of a storm: `tasks` tasks, task `t` running `work(t, options, hold)` (take, hold
/// for `hold`, give back) with `options` = `long` and a wait timeout. Every third task holds for
/// real (a wait as long as the bound); the others are cut short at a random point by a short
/// wait timeout, a `timeout` around the call, or an abort of their task. Returns once every
/// task has ended.
pub(crate) async fn cut_short_round<W, Fut>(
    ctx: &Ctx,
    tasks: usize,
    long: &LockOptions,
    work: W,
) -> Result<(), Failure>
where
    W: Fn(usize, LockOptions, Duration) -> Fut,
    Fut: std::future::Future<Output = dlock_api::Result<()>> + Send + 'static,
{
    let bound = ctx.timing().bound;
    let mut running = tokio::task::JoinSet::new();
    let mut cuts = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (hold, cut, wait) = {
            let mut rng = rand::rng();
            (
                Duration::from_micros(rng.random_range(0..3_000)),
                Duration::from_micros(rng.random_range(0..25_000)),
                Duration::from_micros(rng.random_range(1_000..40_000)),
            )
        };
        let opts = match t % 3 {
            0 => long.clone().with_wait_timeout(bound),
            _ => long.clone().with_wait_timeout(wait),
        };
        let work = work(t, opts, hold);
        match t % 3 {
            0 => {
                running.spawn(async move {
                    let _ = work.await;
                });
            }
            1 => {
                running.spawn(async move {
                    let _ = tokio::time::timeout(cut, work).await;
                });
            }
            _ => {
                let handle = running.spawn(async move {
                    let _ = work.await;
                });
                cuts.push((cut, handle));
            }
        }
    }
    cuts.sort_by_key(|(cut, _)| *cut);
    let started = tokio::time::Instant::now();
    for (cut, handle) in cuts {
        tokio::time::sleep_until(dlock_api::raw::time::after(started, cut)).await;
        handle.abort();
    }
    ctx.within("the storm's tasks to end", async {
        while running.join_next().await.is_some() {}
    })
    .await
}

/// A task aborted inside `guard.release().await`, at every point from before the request to
/// after the reply, leaves the lock free and the client able to take it again at once.
pub async fn aborted_release_leaves_client_usable(ctx: Ctx) -> CaseResult {
    const ROUNDS: u32 = 60;
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    // How long a release takes here, so the aborts spread over the whole of one.
    let mut release_time = Duration::ZERO;
    for _ in 0..5 {
        let guard = a.acquire(&name, &wait).await?;
        let started = std::time::Instant::now();
        guard.release().await?;
        release_time = release_time.max(started.elapsed());
    }
    for round in 0..ROUNDS {
        let guard = a.acquire(&name, &wait).await.map_err(|e| {
            Failure(format!(
                "round {round}: the client could not take its own released name again: {e}"
            ))
        })?;
        let releasing = tokio::spawn(async move { guard.release().await });
        // From 0 to twice a release, finer than the timer's 1 ms: before the request, in
        // flight, after the reply.
        spin_for(
            release_time
                .saturating_mul(2)
                .saturating_mul(round)
                .checked_div(ROUNDS)
                .unwrap_or_default(),
        )
        .await;
        releasing.abort();
        let _ = releasing.await;
    }
    let other = b
        .acquire(&name, &wait)
        .await
        .map_err(|e| Failure(format!("another client could not take the name: {e}")))?;
    other.release().await?;
    let again = a.acquire(&name, &wait).await.map_err(|e| {
        Failure(format!(
            "after aborted releases, the client refuses the free name: {e}"
        ))
    })?;
    again.release().await?;
    Ok(())
}

/// Once `settle()` returns, the background work of dropped guards and cut-short acquires is done:
/// another client's `try_acquire`, which does not wait, finds every name free at once. A
/// program that awaits `settle()` before it exits leaves no lock to its lease.
pub async fn settle_finishes_background_cleanup(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let (dropped, raced, queued) = (ctx.name("dropped"), ctx.name("raced"), ctx.name("queued"));
    let opts = LockOptions::new();
    let unreleased = a.acquire(&dropped, &opts).await?;
    // Cut short from before the request to after the reply; a guard that arrives is dropped.
    for micros in [0u64, 50, 100, 200, 400, 800, 1600, 3200] {
        let _ = tokio::time::timeout(Duration::from_micros(micros), a.acquire(&raced, &opts)).await;
    }
    let holder = b.acquire(&queued, &opts).await?;
    let waiting = tokio::time::timeout(Duration::from_millis(200), a.acquire(&queued, &opts)).await;
    ensure!(
        waiting.is_err(),
        "the waiting acquire finished while the lock was held"
    );
    drop(unreleased);
    ctx.settled("the background cleanups").await?;
    let mut holder = Some(holder);
    for name in [&dropped, &raced, &queued] {
        if *name == queued
            && let Some(holder) = holder.take()
        {
            holder.release().await?;
        }
        let Some(guard) = b.try_acquire(name, &opts).await? else {
            return Err(Failure(format!(
                "`{name}` was still taken after settle(): its background cleanup had not finished"
            )));
        };
        guard.release().await?;
    }
    Ok(())
}

/// Lets other tasks run for about `delay`, at a finer grain than tokio's 1 ms timer.
async fn spin_for(delay: Duration) {
    let started = std::time::Instant::now();
    while started.elapsed() < delay {
        tokio::task::yield_now().await;
    }
}
