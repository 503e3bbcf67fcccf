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
