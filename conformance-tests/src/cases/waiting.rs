//! Bounded waiting and wake-up on release.

use std::time::Duration;

use dlock_api::{LockError, LockOptions};
use tokio::time::Instant;

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
    let started = Instant::now();
    let got = ctx
        .within(
            "acquire with a wait timeout",
            b.acquire(&name, &LockOptions::new().with_wait_timeout(wait)),
        )
        .await?;
    let waited = started.elapsed();
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

/// A release wakes a waiting `acquire` long before the holder's lease would end.
pub async fn release_wakes_waiter(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    // A lease far longer than the bound: only a release can let the waiter in.
    let long = LockOptions::new().with_ttl(ctx.timing().bound * 4);
    let guard = a.acquire(&name, &long).await?;
    let waiter = {
        let (name, opts) = (
            name.clone(),
            long.clone().with_wait_timeout(ctx.timing().bound),
        );
        tokio::spawn(async move { b.acquire(&name, &opts).await })
    };
    tokio::task::yield_now().await;
    guard.release().await?;
    let got = ctx
        .within("the waiter after release", waiter)
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
        .with_ttl(ctx.timing().bound * 4)
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
            "the waiter gave up after its connection was killed: {e}"
        ))
    })?;
    Ok(())
}
