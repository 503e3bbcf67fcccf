//! The watchdog keeps a live holder's lock past its TTL and stops at release.

use dlock_api::{LockError, LockOptions, LostReason, Renewal};
use tokio::time::sleep;

use crate::{CaseResult, Ctx, Failure, ensure};

/// With renewal, a lock outlives several TTLs; after release it is free at once.
pub async fn keeps_lock_past_ttl_and_stops_at_release(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let ttl = ctx.timing().short_ttl;
    let guard = a
        .acquire(
            &name,
            &LockOptions::new()
                .with_ttl(ttl)
                .with_renewal(Renewal::auto()),
        )
        .await?;
    // Waiting out the TTL is the behaviour under test, not a timing assumption.
    sleep(ttl.saturating_mul(3)).await;
    ensure!(
        guard.is_held(),
        "the renewed guard was lost: {:?}",
        guard.lost_reason()
    );
    let busy = b.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(
        busy.is_none(),
        "another client acquired a renewed lock after 3 TTLs"
    );
    guard.release().await?;
    let next = b.try_acquire(&name, &LockOptions::new()).await?;
    let Some(next) = next else {
        return Err(Failure("the lock was busy after release".into()));
    };
    next.release().await?;
    Ok(())
}

/// `extend` moves the deadline: the lock outlives its first TTL without the watchdog.
pub async fn extend_moves_the_deadline(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let ttl = ctx.timing().short_ttl;
    let guard = a
        .acquire(
            &name,
            &LockOptions::new().with_ttl(ttl).with_renewal(Renewal::Off),
        )
        .await?;
    let before = guard.valid_until();
    guard.extend(ttl.saturating_mul(4)).await?;
    ensure!(
        guard.valid_until() > before,
        "valid_until did not move: {before:?} -> {:?}",
        guard.valid_until()
    );
    sleep(ttl.saturating_mul(2)).await;
    ensure!(guard.is_held(), "the extended guard was lost");
    let busy = b.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(busy.is_none(), "another client acquired an extended lock");
    guard.release().await?;
    Ok(())
}

/// A maximum hold time ends the lock even while renewal runs, and frees it for others.
pub async fn max_hold_time_releases(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().bound.saturating_mul(4))
        .with_max_hold(ctx.timing().short_ttl);
    let guard = a.acquire(&name, &opts).await?;
    let reason = ctx.within("the max hold time", guard.lost()).await?;
    ensure!(reason == LostReason::MaxHoldExceeded, "lost for {reason:?}");
    let next = ctx
        .within(
            "the lock after max hold",
            b.acquire(
                &name,
                &LockOptions::new().with_wait_timeout(ctx.timing().bound),
            ),
        )
        .await??;
    next.release().await?;
    let _ = guard.release().await;
    Ok(())
}

/// On a backend without extendable leases, `extend` is refused with `Unsupported` at once, and
/// the lock stays held: what the backend cannot do is asserted, not skipped.
pub async fn extend_refused_where_unsupported(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &LockOptions::new()).await?;
    let refused = ctx
        .within(
            "extend on a lease that cannot extend",
            guard.extend(ctx.timing().short_ttl),
        )
        .await?;
    ensure!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "extend returned {refused:?}, expected Unsupported"
    );
    ensure!(guard.is_held(), "the refused extend lost the lock");
    let busy = b.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(
        busy.is_none(),
        "another client acquired the lock after a refused extend"
    );
    guard.release().await?;
    Ok(())
}

/// When the lock of one guard among many renewed together is gone from the server, that guard
/// alone is lost: the others' renewals, sent with its own, keep theirs.
pub async fn one_lost_lock_in_a_batch_loses_only_its_guard(ctx: Ctx) -> CaseResult {
    use futures::{StreamExt, TryStreamExt};
    const HELD: usize = 200;
    let a = ctx.client().await?;
    let ttl = ctx.timing().short_ttl;
    let opts = LockOptions::new()
        .with_ttl(ttl)
        .with_renewal(Renewal::auto());
    let names: Vec<_> = (0..HELD).map(|i| ctx.name(&format!("batch/{i}"))).collect();
    let acquire = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let (a, opts) = (a.clone(), opts.clone());
            async move { a.acquire(&name, &opts).await }
        })
        .buffered(32)
        .try_collect::<Vec<_>>();
    let mut guards = ctx.within("acquiring the locks", acquire).await??;
    let victim = guards.remove(HELD / 2);
    ctx.require_faults()?
        .kill_one_hold(victim.name())
        .await
        .map_err(Failure)?;
    let reason = ctx
        .within("the guard whose lock was killed to be lost", victim.lost())
        .await?;
    // Two more renewal rounds of the others, the first of which had the killed lock with them.
    sleep(ttl.saturating_mul(2)).await;
    let lost: Vec<_> = guards
        .iter()
        .filter(|guard| !guard.is_held())
        .map(|guard| (guard.name().clone(), guard.lost_reason()))
        .collect();
    ensure!(
        lost.is_empty(),
        "besides the killed lock (lost: {reason:?}), {} guards were lost, the first {:?}",
        lost.len(),
        lost.first()
    );
    for guard in guards {
        guard.release().await?;
    }
    drop(victim);
    Ok(())
}
