//! Cancel safety: a dropped acquire leaves no lock held and no waiter behind.

use std::time::Duration;

use dlock_api::LockOptions;

use crate::{CaseResult, Ctx, Failure, ensure};

/// An `acquire` dropped while waiting leaves no ghost: after the holder releases, a third client
/// acquires at once, and after that the lock is free again.
pub async fn dropped_acquire_leaves_nothing(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("lock");
    let holder = a.acquire(&name, &LockOptions::new()).await?;
    for _ in 0..3 {
        let waiting = tokio::time::timeout(
            Duration::from_millis(200),
            b.acquire(&name, &LockOptions::new()),
        )
        .await;
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
    // Drop acquires after ever later points: before the request, in flight, after the reply.
    for micros in [0u64, 50, 100, 200, 400, 800, 1600, 3200] {
        let attempt = tokio::time::timeout(
            Duration::from_micros(micros),
            a.acquire(&name, &LockOptions::new()),
        )
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
