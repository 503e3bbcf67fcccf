//! A client outlives the tokio runtime it was made on, as a client kept in a `static` and shared
//! by `#[tokio::test]`s (each on a runtime of its own) does; and one of the runtimes sharing it
//! at once ends without failing the others, as when cargo runs those tests in parallel.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{
    DistributedLock, Fencing, FencingToken, LeaseKind, LockError, LockGuard, LockName, LockOptions,
};

use crate::{CaseResult, Ctx, Failure, ensure};

/// Runs `work` on a current-thread runtime of its own (on a blocking thread of the caller's),
/// which shuts down when it returns: as each `#[tokio::test]` runs on a runtime of its own.
/// Before the runtime ends it awaits [`dlock_api::settle`], as a program or test should: a
/// runtime drops the background work still running on it, such as Redlock's deletes on the
/// nodes that answered after a release's quorum, whose keys would then stay until their TTL.
///
/// # Panics
/// If the runtime cannot be built, or `work` panics.
pub async fn on_a_runtime_of_its_own<T, F>(work: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async {
            let done = work().await;
            dlock_api::settle().await;
            done
        })
    })
    .await
    .expect("the runtime's thread panicked")
}

/// A client made, and used, on a runtime that then shut down works on the next one: it takes a
/// free lock at once (with a higher fencing token), waits for a held one and gets it when it is
/// released, and a guard it held across the runtime's end either still holds (its release frees
/// the lock) or says it is lost (and the lock is free): never a lock nobody can release. Twice,
/// as a `static` client goes from test to test.
pub async fn client_outlives_the_runtime_that_made_it(ctx: Ctx) -> CaseResult {
    let (free, held) = (ctx.name("free"), ctx.name("held"));
    let other = ctx.client().await?;
    let made = ctx.clone();
    let (kept, mut last) = on_a_runtime_of_its_own(move || async move {
        let kept = made.client().await?;
        let guard = kept
            .acquire(&made.name("free"), &LockOptions::new())
            .await?;
        let token = guard.fencing_token();
        guard.release().await?;
        Ok::<_, Failure>((kept, token))
    })
    .await?;
    for round in 1..=2 {
        // A guard taken on a runtime that shuts down while it is held.
        let (keeper, name) = (kept.clone(), held.clone());
        let across: LockGuard = on_a_runtime_of_its_own(move || async move {
            keeper.acquire(&name, &LockOptions::new()).await
        })
        .await?;

        last = pairs_on_every_connection(&ctx, round, &kept, &free, last).await?;

        settle_across(&ctx, round, across, &*other).await?;

        hand_off_to(&ctx, round, &kept, &*other).await?;
    }
    Ok(())
}

/// Pairs on the kept client from several tasks at once, so that a client with several
/// connections uses each: every one must succeed, and `free`'s token must rise. Returns it.
async fn pairs_on_every_connection(
    ctx: &Ctx,
    round: u32,
    kept: &Arc<dyn DistributedLock>,
    free: &LockName,
    last: FencingToken,
) -> Result<FencingToken, Failure> {
    let bound = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let mut tasks = Vec::new();
    for task in 0..4 {
        let (kept, bound) = (kept.clone(), bound.clone());
        let name = if task == 0 {
            free.clone()
        } else {
            ctx.name(&format!("free-{task}"))
        };
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for _ in 0..3 {
                let guard = kept.acquire(&name, &bound).await?;
                tokens.push(guard.fencing_token());
                guard.release().await?;
            }
            Ok::<_, LockError>(tokens)
        }));
    }
    let mut first = Vec::new();
    for (task, done) in tasks.into_iter().enumerate() {
        let tokens = ctx
            .within(&format!("round {round}: the kept client's pairs"), done)
            .await?
            .map_err(|e| Failure(format!("a task panicked: {e}")))?
            .map_err(|e| {
                Failure(format!(
                    "round {round}: a pair on the kept client failed after the runtime that \
                     made it shut down: {e}"
                ))
            })?;
        if task == 0 {
            first = tokens;
        }
    }
    if kept.capabilities().fencing != Fencing::None {
        let mut previous = last;
        for token in &first {
            ensure!(
                *token > previous,
                "round {round}: token {token:?} is not above the one before, {previous:?}"
            );
            previous = *token;
        }
    }
    Ok(first.last().copied().unwrap_or(last))
}

/// A guard held across its runtime's end: released if it says it still holds, else it must
/// have been told lost (its server session gone with the runtime); either way another client
/// then takes the lock.
async fn settle_across(
    ctx: &Ctx,
    round: u32,
    across: LockGuard,
    other: &dyn DistributedLock,
) -> CaseResult {
    let name = across.name().clone();
    // Nothing fails in this case: a guard that says it holds must be able to release.
    let still_held = across.is_held();
    match ctx
        .within(
            &format!("round {round}: a guard held across its runtime's end to be released"),
            across.release(),
        )
        .await?
    {
        Ok(()) => {}
        Err(LockError::Lost { .. } | LockError::NotHeld { .. }) if !still_held => {}
        Err(error) => {
            return Err(Failure(format!(
                "round {round}: a guard held across its runtime's end said it held, but its \
                 release failed: {error}"
            )));
        }
    }
    let bound = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let next = other.acquire(&name, &bound).await.map_err(|e| {
        Failure(format!(
            "round {round}: after a guard held across its runtime's end was released or lost, \
             another client could not take the lock: {e}"
        ))
    })?;
    next.release().await?;
    Ok(())
}

/// A client shared by runtimes that run at the same time, as a `static` client is by the
/// `#[tokio::test]`s cargo runs in parallel: when one of them ends, work on the others goes on
/// without an error. The runtime that ends made the client and started its connections and
/// background work (pairs from several tasks, a waiter woken by a release); the test's own
/// runtime runs pairs from several tasks while it ends, and a guard it holds meanwhile, on a
/// short lease, still holds a lease and a half later, with nothing else done on the client
/// meanwhile, and releases.
pub async fn client_shared_by_runtimes_running_at_once(ctx: Ctx) -> CaseResult {
    let bound = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let other = ctx.client().await?;
    let (client_made, made) = tokio::sync::oneshot::channel();
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (ctx, other) = (ctx.clone(), other.clone());
        tokio::spawn(on_a_runtime_of_its_own(move || async move {
            let kept = ctx.client().await?;
            pairs_on_every_connection(&ctx, 0, &kept, &ctx.name("free"), FencingToken::new(0))
                .await?;
            hand_off_to(&ctx, 0, &kept, &*other).await?;
            let across = kept
                .acquire(&ctx.name("held-first"), &LockOptions::new())
                .await?;
            let _ = client_made.send(kept);
            // The runtime goes on until the test's own is busy with the client too.
            let _ = ended.await;
            Ok::<_, Failure>(across)
        }))
    };
    let Ok(kept) = made.await else {
        let why = first.await.map_err(|e| Failure(format!("panicked: {e}")))?;
        return Err(why
            .err()
            .unwrap_or_else(|| Failure("no client was made".into())));
    };
    // On a short lease where leases run out, so that a renewal lost with the other runtime
    // shows within the case.
    let caps = kept.capabilities();
    let short = ctx.timing().short_ttl.max(caps.min_ttl.unwrap_or_default());
    let hold = if caps.lease == LeaseKind::Ttl {
        bound.clone().with_ttl(short)
    } else {
        bound.clone()
    };
    let held = kept.acquire(&ctx.name("held-second"), &hold).await?;

    let busy = Busy::start(&ctx, &kept, 4);
    ctx.within("pairs on the test's runtime to start", busy.done_each(2))
        .await?;
    let _ = end.send(());
    let across = ctx
        .within("the first runtime to end", first)
        .await?
        .map_err(|e| Failure(format!("the first runtime panicked: {e}")))??;
    let before = busy.least();
    ctx.within(
        "pairs on the test's runtime to go on after the first ended",
        busy.done_each(before.saturating_add(3)),
    )
    .await?;
    busy.stop(&ctx).await?;
    // Nothing runs on the client for longer than a lease (or session): its renewal, keep-alive
    // or heartbeat must run on a runtime that runs, not on the one that ended.
    tokio::time::sleep(
        short
            .max(ctx.timing().crash_bound)
            .saturating_mul(3)
            .checked_div(2)
            .unwrap_or_default(),
    )
    .await;

    ensure!(
        held.is_held(),
        "a guard held on a runtime that still runs said it was lost when another runtime ended"
    );
    held.release().await.map_err(|e| {
        Failure(format!(
            "a guard held on a runtime that still runs could not be released after another \
             runtime ended: {e}"
        ))
    })?;
    hand_off_to(&ctx, 1, &kept, &*other).await?;
    settle_across(&ctx, 1, across, &*other).await
}

/// `other` holds a lock that `kept` waits for: the release must wake `kept`'s waiter.
async fn hand_off_to(
    ctx: &Ctx,
    round: u32,
    kept: &Arc<dyn DistributedLock>,
    other: &dyn DistributedLock,
) -> CaseResult {
    let bound = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let waited = ctx.name("waited");
    let holder = other.acquire(&waited, &bound).await?;
    let mut waiter = {
        let (kept, name, bound) = (kept.clone(), waited.clone(), bound.clone());
        tokio::spawn(async move { kept.acquire(&name, &bound).await })
    };
    // Time to start waiting, so that the release has a waiter to wake.
    let early = tokio::time::timeout(Duration::from_millis(100), &mut waiter).await;
    ensure!(
        early.is_err(),
        "round {round}: the kept client acquired a lock another client held"
    );
    holder.release().await?;
    let guard = ctx
        .within(
            &format!("round {round}: the kept client's waiter to be granted"),
            waiter,
        )
        .await?
        .map_err(|e| Failure(format!("the waiter panicked: {e}")))??;
    guard.release().await?;
    Ok(())
}

/// Tasks that run pairs on names of their own until stopped, counting them.
struct Busy {
    counts: Arc<Vec<std::sync::atomic::AtomicU64>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Notified after every pair (and by nothing else): awaited, not polled on a timer, as
    /// paused time never moves while the tasks keep the runtime busy.
    progress: Arc<tokio::sync::Notify>,
    tasks: Vec<tokio::task::JoinHandle<Result<(), LockError>>>,
}

impl Busy {
    fn start(ctx: &Ctx, client: &Arc<dyn DistributedLock>, tasks: usize) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let counts: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(tokio::sync::Notify::new());
        let bound = LockOptions::new().with_wait_timeout(ctx.timing().bound);
        let tasks = (0..tasks)
            .map(|task| {
                let (client, bound, name) = (
                    client.clone(),
                    bound.clone(),
                    ctx.name(&format!("busy-{task}")),
                );
                let (counts, stop, progress) = (counts.clone(), stop.clone(), progress.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Acquire) {
                        let guard = client.acquire(&name, &bound).await?;
                        guard.release().await?;
                        counts[task].fetch_add(1, Ordering::AcqRel);
                        progress.notify_waiters();
                        // An in-process backend may never wait: let the runtime's other tasks run.
                        tokio::task::yield_now().await;
                    }
                    Ok(())
                })
            })
            .collect();
        Self {
            counts,
            stop,
            progress,
            tasks,
        }
    }

    /// The fewest pairs any task has done.
    fn least(&self) -> u64 {
        self.counts
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }

    /// Until every task has done `pairs` pairs, or one has stopped (its error is then told by
    /// [`stop`](Self::stop)).
    async fn done_each(&self, pairs: u64) {
        loop {
            let progress = self.progress.notified();
            if self.least() >= pairs || self.tasks.iter().any(|t| t.is_finished()) {
                return;
            }
            // A task that ended with an error makes no more progress: look again now and then.
            let _ = tokio::time::timeout(Duration::from_millis(50), progress).await;
        }
    }

    async fn stop(self, ctx: &Ctx) -> CaseResult {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for task in self.tasks {
            ctx.within("the busy tasks to stop", task)
                .await?
                .map_err(|e| Failure(format!("a busy task panicked: {e}")))?
                .map_err(|e| {
                    Failure(format!(
                        "a pair on a runtime that still runs failed when another runtime that \
                         used the client ended: {}",
                        Failure::from(e)
                    ))
                })?;
        }
        Ok(())
    }
}
