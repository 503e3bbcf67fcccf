//! Bounded waiting and wake-up on release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::{LockError, LockOptions, RetryPolicy};
use tokio::time::Instant;

use super::inspect::until;
use crate::{CaseResult, Ctx, Failure, ensure};

/// `try_acquire` on a held name returns `None` without waiting.
pub async fn try_acquire_on_held_returns_none(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &LockOptions::new()).await?;
    let started = Instant::now();
    let got = ctx
        .within(
            "try_acquire on a held name",
            b.try_acquire(&name, &LockOptions::new()),
        )
        .await??;
    ensure!(got.is_none(), "try_acquire got a guard for a held name");
    let bound = ctx.timing().short_ttl;
    ensure!(
        started.elapsed() < bound,
        "try_acquire waited {:?}",
        started.elapsed()
    );
    guard.release().await?;
    Ok(())
}

/// `acquire` with a wait timeout returns `Timeout` after about that long.
pub async fn acquire_times_out_within_bound(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &LockOptions::new()).await?;
    let wait = Duration::from_millis(500);
    // Every core busy, as on a CI machine running another build: a server's timed wait that
    // ends early by the client's clock (a rounded `GET_LOCK`, say) shows then, not by luck.
    let neighbour = BusyNeighbour::start();
    let started = Instant::now();
    let got = ctx
        .within(
            "acquire with a wait timeout",
            b.acquire(&name, &LockOptions::new().with_wait_timeout(wait)),
        )
        .await?;
    let waited = started.elapsed();
    drop(neighbour);
    ensure!(
        matches!(got, Err(LockError::Timeout { .. })),
        "expected Timeout, got {got:?}"
    );
    ensure!(
        waited >= wait,
        "gave up after {waited:?}, before the {wait:?} wait timeout"
    );
    guard.release().await?;
    Ok(())
}

/// A thread per core spinning until dropped: load from another process's build.
struct BusyNeighbour {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyNeighbour {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for BusyNeighbour {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A release wakes a waiting `acquire` long before the holder's lease would end.
pub async fn release_wakes_waiter(ctx: Ctx) -> CaseResult {
    // A lease far longer than the bound: only a release can let the waiter in.
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    let waiting = long.clone().with_wait_timeout(ctx.timing().bound);
    release_lets_waiter_in(&ctx, long, waiting, "the waiter after release").await
}

/// One client holds a name with `held`, another waits for it with `waiting`; the holder
/// releases, and the waiter must hold the lock within the case's bound (`what` names the wait).
async fn release_lets_waiter_in(
    ctx: &Ctx,
    held: LockOptions,
    waiting: LockOptions,
    what: &str,
) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &held).await?;
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move { b.acquire(&name, &waiting).await })
    };
    tokio::task::yield_now().await;
    guard.release().await?;
    let got = ctx
        .within(what, waiter)
        .await?
        .map_err(|e| Failure(e.to_string()))??;
    got.release().await?;
    Ok(())
}

/// Five waiters on one name each get the lock in turn; none is stranded.
pub async fn waiters_acquire_in_turn(ctx: Ctx) -> CaseResult {
    let holder = ctx.client().await?;
    let name = ctx.name("lock");
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().bound.saturating_mul(4))
        .with_wait_timeout(ctx.timing().bound);
    let first = holder.acquire(&name, &opts).await?;
    let mut waiters = Vec::new();
    for _ in 0..5 {
        let client = ctx.client().await?;
        let (name, opts) = (name.clone(), opts.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire(&name, &opts).await?;
            tokio::task::yield_now().await;
            guard.release().await
        }));
    }
    first.release().await?;
    for waiter in waiters {
        ctx.within("a waiter", waiter)
            .await?
            .map_err(|e| Failure(e.to_string()))??;
    }
    Ok(())
}

/// A backend that promises `wake_on_release` hands the lock to a waiter on release, not at its
/// next poll: the waiter's retry policy puts any poll after the case's bound, so only a wake-up
/// by the server (or the release itself) lets it in within that bound.
pub async fn release_wakes_waiter_without_polling(ctx: Ctx) -> CaseResult {
    let bound = ctx.timing().bound;
    let never_polls_in_time =
        RetryPolicy::exponential(bound.saturating_mul(2), bound.saturating_mul(2))
            .with_jitter(false);
    let long = LockOptions::new()
        .with_ttl(bound.saturating_mul(4))
        .with_retry(never_polls_in_time);
    let waiting = long.clone().with_wait_timeout(bound.saturating_mul(3));
    release_lets_waiter_in(
        &ctx,
        long,
        waiting,
        "the waiter after release (the backend claims wake_on_release, and a poll would come after the bound)",
    )
    .await
}

/// A backend that promises `fifo` serves waiters in the order they started waiting: four
/// waiters, each started once the server counts the one before it, get the lock in that order.
pub async fn waiters_acquire_in_arrival_order(ctx: Ctx) -> CaseResult {
    let holder = ctx.client().await?;
    let name = ctx.name("lock");
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().bound.saturating_mul(4))
        .with_wait_timeout(ctx.timing().bound.saturating_mul(2));
    let first = holder.acquire(&name, &opts).await?;
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for arrival in 0..4usize {
        let client = ctx.client().await?;
        let (own_name, opts, served) = (name.clone(), opts.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire(&own_name, &opts).await?;
            served
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(arrival);
            guard.release().await
        }));
        let queued = until(
            &ctx,
            holder.as_ref(),
            &name,
            "the server to count the new waiter",
            |seen| seen.waiters.is_none_or(|count| count > arrival),
        )
        .await?;
        ensure!(
            queued.waiters.is_some(),
            "the backend claims fifo and inspect, but its inspection does not count waiters, so the case cannot tell arrival order"
        );
    }
    first.release().await?;
    for waiter in waiters {
        ctx.within("a waiter", waiter)
            .await?
            .map_err(|e| Failure(e.to_string()))??;
    }
    let served = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        served == [0, 1, 2, 3],
        "waiters were served in the order {served:?}, not in the order they started waiting"
    );
    Ok(())
}

/// A waiter whose server connection is killed keeps waiting within its wait timeout: it
/// reconnects and takes the lock when the holder releases, rather than failing with
/// `Unavailable` (contract item 5: only a server that stays unreachable ends a wait early).
pub async fn waiter_survives_killed_connection(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let holder = a.acquire(&name, &LockOptions::new()).await?;
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move {
            let guard = b.acquire(&name, &wait).await?;
            guard.release().await
        })
    };
    let faults = ctx.require_faults()?;
    let killed = faults.kill_waiters(&name).await.map_err(Failure)?;
    ensure!(killed > 0, "the harness killed no waiting connection");
    ensure!(
        holder.is_held(),
        "the holder lost its lock when only waiters were killed"
    );
    holder.release().await?;
    let outcome = ctx
        .within("the waiter after the holder released", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiting task panicked: {e}")))?;
    outcome.map_err(|e| {
        Failure(format!(
            "the waiter gave up after its connection was killed: {e:?}"
        ))
    })?;
    Ok(())
}
