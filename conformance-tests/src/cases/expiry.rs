//! Crash liveness: a vanished holder's lock frees after its lease; a dropped guard frees at once.

use dlock_api::{LockOptions, Renewal};

use crate::{CaseResult, Ctx, Failure, ensure};

/// A holder that forgets its guard (as a crashed process would) blocks others only until its TTL.
pub async fn forgotten_holder_frees_after_ttl(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let opts = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::auto());
    a.acquire(&name, &opts).await?.forget();
    let busy = b.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(busy.is_none(), "a forgotten lock was free before its TTL");
    // Half the bound past the short TTL: generous, yet short of the default TTL (as long as the
    // bound), so a backend that kept the default lease instead of the requested one fails.
    let timing = ctx.timing();
    let wait = LockOptions::new().with_wait_timeout(
        timing
            .short_ttl
            .saturating_add(timing.bound.checked_div(2).unwrap_or_default()),
    );
    let next = b.acquire(&name, &wait).await.map_err(|e| {
        Failure(format!(
            "the forgotten lock was not free within half the bound after its {:?} TTL: {e}",
            timing.short_ttl
        ))
    })?;
    next.release().await?;
    Ok(())
}

/// Dropping a guard without `release()` frees the lock long before its TTL.
pub async fn dropped_guard_frees_promptly(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    let guard = a.acquire(&name, &long).await?;
    drop(guard);
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let next = b
        .acquire(&name, &wait)
        .await
        .map_err(|e| Failure(format!("the dropped guard's lock stayed busy: {e}")))?;
    next.release().await?;
    Ok(())
}
