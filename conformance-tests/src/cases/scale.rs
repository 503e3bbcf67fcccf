//! Behaviour at scale: what must still hold when one client holds many locks, or many waiters
//! line up on one name. Speed at scale is `dlock bench --scale`'s; these cases check that nothing
//! is lost, skipped or served out of turn once the numbers grow.

use std::sync::{Arc, Mutex};

use dlock_api::{DistributedLock, LockGuard, LockName, LockOptions, LockStatus};
use futures::{StreamExt, TryStreamExt};

use crate::{CaseResult, Ctx, Failure, ensure};

/// How many locks the held case keeps on one client.
const HELD: usize = 10_000;
/// Over how many clients the waiters are dealt.
const CLIENTS: usize = 8;
/// In how many groups the waiters of a FIFO backend arrive (each group counted by the server
/// before the next starts), so arrival order is known without one inspection per waiter.
const GROUPS: usize = 10;
/// Acquires and releases in flight at once, as a batch job would run them.
const IN_FLIGHT: usize = 16;

/// One client takes 10,000 locks and keeps every one through three renewal intervals (on TTL
/// backends each is renewed three times; on session backends the session keeps them all), then
/// releases each as its owner: none is lost, suspended or released by anyone else meanwhile.
pub async fn ten_thousand_held_locks_are_all_kept(ctx: Ctx) -> CaseResult {
    let (client, other) = (ctx.client().await?, ctx.client().await?);
    // Long enough that renewing every lock once per interval is light work even on a busy
    // machine; the case is about none of them being dropped, not about a short lease.
    let ttl = ctx.timing().short_ttl.saturating_mul(3);
    let options = LockOptions::new()
        .with_ttl(ttl)
        .with_wait_timeout(ctx.timing().bound);
    let names: Vec<LockName> = (0..HELD).map(|i| ctx.name(&format!("held-{i}"))).collect();
    let guards: Vec<LockGuard> = ctx
        .within_for(
            "10,000 acquires",
            ctx.timing().bound.saturating_mul(4),
            futures::stream::iter(names.clone())
                .map(|name| {
                    let (client, options) = (client.clone(), options.clone());
                    async move { client.acquire(&name, &options).await }
                })
                .buffer_unordered(IN_FLIGHT)
                .try_collect(),
        )
        .await??;
    let intervals = options.renewal_interval().unwrap_or(ttl).saturating_mul(3);
    // The scenario itself is time held: three renewal intervals, and a little more.
    tokio::time::sleep(intervals.saturating_add(ttl.checked_div(4).unwrap_or_default())).await;
    let not_held: Vec<(usize, LockStatus)> = guards
        .iter()
        .enumerate()
        .filter(|(_, guard)| !matches!(guard.status(), LockStatus::Held { .. }))
        .map(|(at, guard)| (at, guard.status()))
        .take(5)
        .collect();
    ensure!(
        not_held.is_empty(),
        "after three renewal intervals, some of the 10,000 locks are not held (first few: {not_held:?})"
    );
    // The server agrees: another client finds them taken (a sample of them, spread).
    for name in names.iter().step_by(HELD / 16) {
        let taken = other.try_acquire(name, &LockOptions::new()).await?;
        ensure!(
            taken.is_none(),
            "another client acquired {name}, one of 10,000 held, after three renewal intervals"
        );
    }
    let released: Vec<()> = ctx
        .within_for(
            "10,000 releases",
            ctx.timing().bound.saturating_mul(4),
            futures::stream::iter(guards)
                .map(|guard| async move { guard.release().await })
                .buffer_unordered(IN_FLIGHT)
                .try_collect(),
        )
        .await??;
    ensure!(
        released.len() == HELD,
        "released {} of {HELD}",
        released.len()
    );
    Ok(())
}

/// A thousand waiters on one name (the harness's
/// [`line_at_scale`](crate::Harness::line_at_scale)), over eight clients, behind one holder:
/// each is served once and none is left behind. Where the backend promises `fifo` (and can
/// count its waiters), they arrive in ten groups, each counted by the server before the next
/// starts, and no waiter is served before one of an earlier group.
pub async fn thousand_waiters_are_all_served_in_turn(ctx: Ctx) -> CaseResult {
    let holder = ctx.client().await?;
    let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(ctx.client().await?);
    }
    let caps = holder.capabilities();
    let ordered = caps.fifo && caps.inspect;
    let name = ctx.name("queue");
    let bound = ctx.timing().bound;
    // Every waiter may wait out the whole line.
    let options = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl.saturating_mul(3))
        .with_wait_timeout(bound.saturating_mul(4));
    let first = holder.acquire(&name, &options).await?;
    let served: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut waiters = tokio::task::JoinSet::new();
    let groups = if ordered { GROUPS } else { 1 };
    let waiters_asked = ctx.harness().line_at_scale();
    let per_group = waiters_asked.checked_div(groups).unwrap_or(waiters_asked);
    let line = per_group.saturating_mul(groups);
    for group in 0..groups {
        for i in 0..per_group {
            let client =
                clients[group.saturating_mul(per_group).saturating_add(i) % CLIENTS].clone();
            let (name, options, served) = (name.clone(), options.clone(), served.clone());
            waiters.spawn(async move {
                let guard = client.acquire(&name, &options).await?;
                served.lock().unwrap_or_else(|e| e.into_inner()).push(group);
                guard.release().await
            });
        }
        if ordered {
            let queued = group.saturating_add(1).saturating_mul(per_group);
            ctx.within_for(
                "the server to count the group's waiters",
                bound,
                ctx.until_waiting(holder.as_ref(), &name, queued),
            )
            .await??;
        }
    }
    first.release().await?;
    let outcomes = ctx
        .within_for("the line of waiters", bound.saturating_mul(4), async {
            let mut outcomes = Vec::new();
            while let Some(joined) = waiters.join_next().await {
                outcomes.push(joined);
            }
            outcomes
        })
        .await?;
    for outcome in outcomes {
        outcome.map_err(|e| Failure(format!("a waiter panicked: {e}")))??;
    }
    let served = served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        served.len() == line,
        "{} of {line} waiters were served",
        served.len()
    );
    if let Some(at) = served.windows(2).position(|pair| pair[1] < pair[0]) {
        return Err(Failure(format!(
            "a waiter of group {} was served after one of group {}, which arrived later (served #{at} and #{})",
            served[at.saturating_add(1)],
            served[at],
            at.saturating_add(1)
        )));
    }
    Ok(())
}
