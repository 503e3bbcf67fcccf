//! Only the holder can release or extend; a stale guard never touches the new holder's lock.

use dlock_api::{DistributedLock, LockError, LockGuard, LockOptions, Renewal};

use crate::{CaseResult, Ctx, Failure, ensure};

/// A holder whose short lease ran out, and a new holder that took over.
async fn stale_and_new(
    ctx: &Ctx,
) -> Result<(LockGuard, LockGuard, std::sync::Arc<dyn DistributedLock>), Failure> {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let short = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::Off);
    let stale = a.acquire(&name, &short).await?;
    ctx.within("the short lease to end", stale.lost()).await?;
    let new = b
        .acquire(
            &name,
            &LockOptions::new().with_wait_timeout(ctx.timing().bound),
        )
        .await?;
    Ok((stale, new, ctx.client().await?))
}

fn is_stale_error(result: &Result<(), LockError>) -> bool {
    matches!(
        result,
        Err(LockError::Lost { .. } | LockError::NotHeld { .. })
    )
}

/// Releasing a stale guard fails with `Lost`/`NotHeld`, and the new holder keeps the lock.
pub async fn stale_guard_cannot_release(ctx: Ctx) -> CaseResult {
    let (stale, new, third) = stale_and_new(&ctx).await?;
    let released = stale.release().await;
    ensure!(
        is_stale_error(&released),
        "stale release returned {released:?}"
    );
    let intruder = third.try_acquire(new.name(), &LockOptions::new()).await?;
    ensure!(
        intruder.is_none(),
        "the stale release freed the new holder's lock"
    );
    new.release().await?;
    Ok(())
}

/// Extending a stale guard fails with `Lost`/`NotHeld`, and the new holder keeps the lock.
pub async fn stale_guard_cannot_extend(ctx: Ctx) -> CaseResult {
    let (stale, new, third) = stale_and_new(&ctx).await?;
    let extended = stale.extend(ctx.timing().bound).await;
    ensure!(
        is_stale_error(&extended),
        "stale extend returned {extended:?}"
    );
    let intruder = third.try_acquire(new.name(), &LockOptions::new()).await?;
    ensure!(
        intruder.is_none(),
        "someone else acquired the new holder's lock"
    );
    new.release().await?;
    drop(stale);
    Ok(())
}

/// A holder killed on the server (its key deleted, its session ended) whose guard has not
/// noticed cannot extend the next holder's lock. Unlike a stale guard's, whose lease ran out
/// locally and which is refused before any request, this `extend` reaches the backend: its
/// owner check must refuse it with `Lost`/`NotHeld`, and the new holder keeps the lock.
pub async fn killed_holder_cannot_extend_the_next_holders_lock(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("lock");
    // Unrenewed and far longer than the case: the guard learns of the kill only from the server.
    let long = LockOptions::new()
        .with_ttl(ctx.timing().bound.saturating_mul(4))
        .with_renewal(Renewal::Off);
    let killed = a.acquire(&name, &long).await?;
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    let new = ctx
        .within(
            "the lock after its holder was killed",
            b.acquire(&name, &long.clone().with_wait_timeout(ctx.timing().bound)),
        )
        .await??;
    let extended = killed.extend(ctx.timing().bound.saturating_mul(4)).await;
    ensure!(
        is_stale_error(&extended),
        "the killed holder's extend returned {extended:?}"
    );
    let intruder = c.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(
        intruder.is_none(),
        "someone else acquired the new holder's lock"
    );
    new.release().await?;
    // Its error is expected: the lock is not the killed guard's.
    let _ = killed.release().await;
    Ok(())
}

/// A released lock can be taken at once by another client, and releasing is final.
pub async fn release_frees_for_others(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let guard = a.acquire(&name, &LockOptions::new()).await?;
    ensure!(guard.is_held(), "a fresh guard reports not held");
    guard.release().await?;
    let next = b.try_acquire(&name, &LockOptions::new()).await?;
    let Some(next) = next else {
        return Err(Failure("the released lock was still busy".into()));
    };
    next.release().await?;
    Ok(())
}
