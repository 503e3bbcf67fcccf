//! The lost signal: it fires when the lease ends or the holder is killed, and stays observable.

use std::time::Duration;

use dlock_api::{
    DistributedLock, DistributedLockExt, LeaseKind, LockError, LockOptions, LockStatus, LostReason,
    Renewal,
};

use crate::{CaseResult, Ctx, Failure, ensure};

/// Without renewal, `lost` fires when the lease ends, and stays fired.
pub async fn fires_when_lease_ends_without_renewal(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::Off);
    let guard = client.acquire(&ctx.name("lock"), &opts).await?;
    let reason = ctx.within("lost after the TTL", guard.lost()).await?;
    ensure!(
        reason == LostReason::Expired,
        "lost for {reason:?}, expected Expired"
    );
    ensure!(!guard.is_held(), "is_held() after lost");
    // Already fired: observable again without waiting.
    let again = tokio::time::timeout(Duration::from_secs(1), guard.lost()).await;
    ensure!(
        again == Ok(LostReason::Expired),
        "second lost() gave {again:?}"
    );
    ensure!(
        guard.lost_reason() == Some(LostReason::Expired),
        "lost_reason() is {:?}",
        guard.lost_reason()
    );
    let released = guard.release().await;
    ensure!(
        matches!(released, Err(LockError::Lost { .. })),
        "release after loss returned {released:?}"
    );
    Ok(())
}

/// Killing the holder server-side fires `lost` on its guard, and frees the lock for others.
pub async fn fires_when_holder_killed(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &LockOptions::new()).await?;
    let faults = ctx.require_faults()?;
    faults.kill_holder(&name).await.map_err(Failure)?;
    let reason = ctx
        .within("lost after the holder was killed", guard.lost())
        .await?;
    ensure!(!guard.is_held(), "is_held() after lost ({reason:?})");
    let next = ctx
        .within(
            "the lock after the kill",
            b.acquire(
                &name,
                &LockOptions::new().with_wait_timeout(ctx.timing().bound),
            ),
        )
        .await??;
    let released = guard.release().await;
    ensure!(
        released.is_err(),
        "release of a killed holder's guard succeeded"
    );
    ensure!(
        b.try_acquire(&name, &LockOptions::new()).await?.is_none(),
        "the killed holder's release freed the new holder's lock"
    );
    next.release().await?;
    Ok(())
}

/// Killing the holder server-side while another client waits passes the lock to the waiter,
/// with a higher token; the killed holder's release fails, and its client takes locks again once
/// the waiter is done (a new connection, lease or session, as its backend has them).
///
/// A hold that is only a key with a TTL can be killed without anyone announcing it (a `DEL` by
/// an operator): a waiter then learns of it when the lease it saw would have ended, at the
/// latest (as a Redisson waiter does), so the holder here takes the short TTL, renewed.
pub async fn killed_holder_passes_the_lock_to_its_waiter(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let guard = a.acquire(&name, &killable_hold(&ctx, &*a)).await?;
    let waiter = crate::wait_for::spawned_acquire(ctx.timing().bound, &b, &name);
    ctx.until_queued(&*a, &name).await?;
    let faults = ctx.require_faults()?;
    faults.kill_holder(&name).await.map_err(Failure)?;
    ctx.within("lost after the holder was killed", guard.lost())
        .await?;
    let next = ctx
        .within("the waiter", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task: {e}")))??;
    ensure!(
        next.fencing_token() > guard.fencing_token(),
        "the waiter's token {} is not above the killed holder's {}",
        next.fencing_token(),
        guard.fencing_token()
    );
    ensure!(
        guard.release().await.is_err(),
        "release of a killed holder's guard succeeded"
    );
    ensure!(
        a.try_acquire(&name, &LockOptions::new()).await?.is_none(),
        "the killed holder's client took the waiter's lock"
    );
    next.release().await?;
    ctx.within(
        "the killed holder's client to lock again",
        a.acquire(&name, &wait),
    )
    .await??
    .release()
    .await?;
    Ok(())
}

/// Options for a hold the case kills on the server: on a TTL backend the short TTL, renewed, so
/// that a key deleted without an announcement is noticed within the case's bound.
pub(crate) fn killable_hold(ctx: &Ctx, client: &dyn DistributedLock) -> LockOptions {
    let caps = client.capabilities();
    if caps.lease == LeaseKind::Ttl {
        LockOptions::new().with_ttl(ctx.timing().short_ttl.max(caps.min_ttl.unwrap_or_default()))
    } else {
        LockOptions::new()
    }
}

/// A holder killed on the server while another client waits learns it as the waiter takes the
/// lock, not at its next renewal (Curator's killed-session test, ported): the lease here is long,
/// so a renewal comes only after the case's bound, and a TTL lock's key goes without anyone
/// announcing it (an operator's `DEL`). Prints how late the signal came.
pub async fn killed_holder_learns_it_when_its_waiter_takes_over(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let bound = ctx.timing().bound;
    let caps = a.capabilities();
    // Renewal first comes a third of the TTL after the grant: after the whole case.
    let ttl = bound.saturating_mul(6);
    let ttl = caps.max_ttl.map_or(ttl, |max| ttl.min(max));
    let first_renewal = ttl.checked_div(3).unwrap_or_default();
    let acquired = tokio::time::Instant::now();
    let guard = a.acquire(&name, &LockOptions::new().with_ttl(ttl)).await?;
    let waiter = crate::wait_for::spawned_acquire(bound, &b, &name);
    ctx.until_queued(&*a, &name).await?;
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    let next = ctx
        .within("the waiter", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task: {e}")))??;
    let taken_over = tokio::time::Instant::now();
    let lost = tokio::time::timeout(bound, guard.lost()).await;
    let learnt = taken_over.elapsed();
    ensure!(
        lost.is_ok(),
        "the killed holder's guard was not lost within {bound:?} of the waiter's grant"
    );
    ensure!(
        acquired.elapsed() < first_renewal,
        "the guard was lost only after its first renewal was due; the takeover signal never came"
    );
    eprintln!(
        "{}: the killed holder learnt of the takeover {learnt:?} after the waiter's grant",
        ctx.case()
    );
    ensure!(
        !guard.is_held(),
        "is_held() after lost ({:?})",
        guard.lost_reason()
    );
    next.release().await?;
    Ok(())
}

/// `with_lock` stops the work when the lock is lost and returns `Lost`.
pub async fn with_lock_stops_work_when_lost(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::Off);
    let outcome = ctx
        .within(
            "with_lock to notice the loss",
            client.with_lock(&ctx.name("lock"), &opts, |_| std::future::pending::<()>()),
        )
        .await?;
    ensure!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "with_lock returned {outcome:?}"
    );
    Ok(())
}

/// `with_lock` releases only after the work finished, and then at once.
pub async fn with_lock_releases_after_work(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let probe = b.clone();
    let probe_name = name.clone();
    let seen_busy = a
        .with_lock(&name, &LockOptions::new(), |context| async move {
            let busy = probe
                .try_acquire(&probe_name, &LockOptions::new())
                .await
                .map(|g| g.is_none());
            (busy, context.fencing_token())
        })
        .await?;
    ensure!(
        matches!(seen_busy.0, Ok(true)),
        "the lock was free during the work: {:?}",
        seen_busy.0
    );
    let after = b.try_acquire(&name, &LockOptions::new()).await?;
    let Some(after) = after else {
        return Err(Failure("the lock stayed busy after with_lock".into()));
    };
    ensure!(
        after.fencing_token() > seen_busy.1,
        "token did not rise after with_lock"
    );
    after.release().await?;
    Ok(())
}

/// A client whose session loses its connection reports its guards `Suspended` (not held, not
/// lost, the lock still its own on the server) and `Held` again once the session is back.
pub async fn suspended_guard_reports_it_and_resumes(ctx: Ctx) -> CaseResult {
    let faults = ctx.require_faults()?;
    let (client, session) = faults.session_client().await.map_err(Failure)?;
    let other = ctx.client().await?;
    let name = ctx.name("lock");
    let guard = client.acquire(&name, &LockOptions::new()).await?;
    session.suspend(ctx.timing().bound).await.map_err(Failure)?;
    ensure!(
        matches!(guard.status(), LockStatus::Suspended { .. }),
        "status while suspended: {:?}",
        guard.status()
    );
    ensure!(!guard.is_held(), "is_held() while suspended");
    ensure!(
        guard.lost_reason().is_none(),
        "lost while only suspended: {:?}",
        guard.lost_reason()
    );
    let busy = other.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(
        busy.is_none(),
        "another client took a suspended session's lock"
    );
    session.resume().await.map_err(Failure)?;
    ensure!(
        matches!(guard.status(), LockStatus::Held { .. }),
        "status after resume: {:?}",
        guard.status()
    );
    guard.release().await?;
    Ok(())
}

/// A suspension that outlasts its deadline expires the session: every guard on it is lost with
/// `SessionExpired`, and their locks go to others.
pub async fn suspension_past_its_deadline_loses_every_guard(ctx: Ctx) -> CaseResult {
    let faults = ctx.require_faults()?;
    let (client, session) = faults.session_client().await.map_err(Failure)?;
    let other = ctx.client().await?;
    let names = [ctx.name("a"), ctx.name("b")];
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.acquire(name, &LockOptions::new()).await?);
    }
    session
        .suspend(ctx.timing().short_ttl)
        .await
        .map_err(Failure)?;
    for guard in &guards {
        let reason = ctx
            .within("lost after the suspension's deadline", guard.lost())
            .await?;
        ensure!(
            reason == LostReason::SessionExpired,
            "lost for {reason:?}, expected SessionExpired"
        );
    }
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    for name in &names {
        other.acquire(name, &wait).await?.release().await?;
    }
    for guard in guards {
        let released = guard.release().await;
        ensure!(
            matches!(released, Err(LockError::Lost { .. })),
            "release after expiry returned {released:?}"
        );
    }
    Ok(())
}

/// A session the server expires loses every guard on it at once, with `SessionExpired`, and
/// the client takes locks again on a new session.
pub async fn expired_session_loses_every_guard(ctx: Ctx) -> CaseResult {
    let faults = ctx.require_faults()?;
    let (client, session) = faults.session_client().await.map_err(Failure)?;
    let names = [ctx.name("a"), ctx.name("b")];
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.acquire(name, &LockOptions::new()).await?);
    }
    session.expire().await.map_err(Failure)?;
    for guard in &guards {
        let reason = ctx.within("lost after expiry", guard.lost()).await?;
        ensure!(
            reason == LostReason::SessionExpired,
            "lost for {reason:?}, expected SessionExpired"
        );
        ensure!(
            guard.status() == LockStatus::Lost(LostReason::SessionExpired),
            "status after expiry: {:?}",
            guard.status()
        );
    }
    drop(guards);
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let again = client.acquire(&names[0], &wait).await?;
    ensure!(again.is_held(), "a new session's guard is not held");
    again.release().await?;
    Ok(())
}
