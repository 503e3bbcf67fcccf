//! Bad input fails with `InvalidArgument` before any network call.

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockName, LockOptions, Renewal};

use crate::{CaseResult, Ctx, ensure};

fn invalid<T: std::fmt::Debug>(result: &Result<T, LockError>) -> bool {
    matches!(result, Err(LockError::InvalidArgument { .. }))
}

/// Empty, over-long and NUL-carrying names are refused.
pub async fn bad_names_rejected(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let too_long = "z".repeat(LockName::MAX_BYTES + 1);
    for bad in ["", too_long.as_str(), "a\0b"] {
        let got = client.acquire_str(bad, &LockOptions::new()).await;
        ensure!(
            invalid(&got),
            "acquire_str({:?}…) returned {got:?}",
            &bad[..bad.len().min(8)]
        );
        let got = client.try_acquire_str(bad, &LockOptions::new()).await;
        ensure!(invalid(&got), "try_acquire_str returned {got:?}");
    }
    Ok(())
}

/// A zero TTL, an absurd TTL and a renewal interval longer than the TTL are refused.
pub async fn bad_options_rejected(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let name = ctx.name("lock");
    let bad = [
        LockOptions::new().with_ttl(Duration::ZERO),
        LockOptions::new().with_ttl(Duration::from_secs(10 * 365 * 24 * 3600)),
        LockOptions::new()
            .with_ttl(Duration::from_secs(1))
            .with_renewal(Renewal::every(Duration::from_secs(5))),
        LockOptions::new().with_max_hold(Duration::ZERO),
    ];
    for opts in bad {
        let got = client.acquire(&name, &opts).await;
        ensure!(invalid(&got), "acquire with {opts:?} returned {got:?}");
        let got = client.try_acquire(&name, &opts).await;
        ensure!(invalid(&got), "try_acquire with {opts:?} returned {got:?}");
    }
    // Nothing was taken by the refused calls.
    let guard = client.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(guard.is_some(), "a refused call left the lock held");
    Ok(())
}
