//! Bad input fails with `InvalidArgument` before any network call.

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockName, LockOptions, Renewal};

use crate::inputs::{name_suffixes, options, sample};
use crate::{CaseResult, Ctx, Failure, ensure};

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

/// An `extend` to a TTL an acquire would refuse (zero, absurd, beyond the backend's
/// `min_ttl` or `max_ttl`) is refused before any network call, and the lock stays held.
pub async fn bad_extend_rejected(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let caps = client.capabilities();
    let guard = client
        .acquire(&ctx.name("lock"), &LockOptions::new())
        .await?;
    let mut bad = vec![Duration::ZERO, Duration::from_secs(10 * 365 * 24 * 3600)];
    bad.extend(
        caps.min_ttl
            .and_then(|min| min.checked_sub(Duration::from_millis(1))),
    );
    bad.extend(
        caps.max_ttl
            .and_then(|max| max.checked_add(Duration::from_secs(1))),
    );
    for ttl in bad {
        let got = guard.extend(ttl).await;
        ensure!(invalid(&got), "extend({ttl:?}) returned {got:?}");
    }
    ensure!(guard.is_held(), "a refused extend lost the lock");
    guard.release().await?;
    Ok(())
}

/// How many random inputs one run of an `input::any_*` case draws.
const SAMPLES: usize = 32;

/// Any [`LockOptions`] (durations from zero to `Duration::MAX`, any renewal and retry policy) is
/// either refused before any network call with the error the capabilities predict, or accepted
/// and then behaves: a free name is taken and released, and an acquire on a held name waits
/// (or times out) and can be cancelled. Nothing panics.
pub async fn any_options_behave(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let caps = a.capabilities();
    let bound = ctx.timing().bound;
    for (i, opts) in sample(options(), SAMPLES).into_iter().enumerate() {
        let name = ctx.name(&format!("o{i}"));
        let got = a.try_acquire(&name, &opts).await;
        match caps.check("expected", &opts) {
            Err(expected) => {
                let matches = matches!(
                    (&expected, &got),
                    (
                        LockError::InvalidArgument { .. },
                        Err(LockError::InvalidArgument { .. })
                    ) | (
                        LockError::Unsupported { .. },
                        Err(LockError::Unsupported { .. })
                    )
                );
                ensure!(
                    matches,
                    "{opts:?}: expected {expected}, try_acquire returned {got:?}"
                );
                let waited = a.acquire(&name, &opts).await;
                ensure!(
                    waited.is_err(),
                    "{opts:?}: refused by try_acquire, accepted by acquire"
                );
            }
            Ok(()) => {
                // Free: taken (a lease this short may already be over by the release).
                let guard = got.map_err(|e| Failure(format!("{opts:?}: try_acquire: {e}")))?;
                let guard =
                    guard.ok_or_else(|| Failure(format!("{opts:?}: a free name was busy")))?;
                released_or_lost(guard.release().await, &opts)?;
                // A guard lost to a tiny maximum hold is released in the background: the name
                // is free once that is done (on a loaded machine, later than the release call).
                ctx.until_free("the background release", &*b, &name).await?;
                let guard = ctx
                    .within("acquire on a free name", a.acquire(&name, &opts))
                    .await?
                    .map_err(|e| Failure(format!("{opts:?}: acquire on a free name: {e}")))?;
                released_or_lost(guard.release().await, &opts)?;
                // Held: waits, times out or is cancelled; never gets a guard.
                let holder = b
                    .acquire(&name, &LockOptions::new().with_wait_timeout(bound))
                    .await?;
                let waiting =
                    tokio::time::timeout(Duration::from_millis(30), a.acquire(&name, &opts)).await;
                ensure!(
                    matches!(waiting, Err(_) | Ok(Err(LockError::Timeout { .. }))),
                    "{opts:?}: acquire on a held name returned {waiting:?}"
                );
                holder.release().await?;
            }
        }
    }
    Ok(())
}

fn released_or_lost(result: Result<(), LockError>, opts: &LockOptions) -> CaseResult {
    match result {
        Ok(()) | Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => Ok(()),
        Err(e) => Err(Failure(format!("{opts:?}: release: {e}"))),
    }
}

/// Any string as a name suffix (empty, NUL, 2,000 bytes, any Unicode, characters backends treat
/// specially) is either refused with `InvalidArgument` or taken and released.
pub async fn any_names_behave(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let base = ctx.name("n");
    for suffix in sample(name_suffixes(), SAMPLES) {
        let full = format!("{base}/{suffix}");
        match LockName::new(&full) {
            Err(e) => ensure!(
                matches!(e, LockError::InvalidArgument { .. }),
                "LockName::new refused with {e:?}"
            ),
            Ok(name) => {
                ctx.record(&name);
                let guard = client.try_acquire(&name, &LockOptions::new()).await?;
                let guard = guard.ok_or_else(|| Failure(format!("{name:?} was busy")))?;
                guard.release().await?;
            }
        }
    }
    Ok(())
}
