//! The server's eviction policy, judged at connect and again at every Sentinel failover.
//!
//! A lock key carries a TTL, so a server with a memory limit and any policy but `noeviction` may
//! delete a *held* lock to make room (`volatile-*` picks exactly the keys with a TTL; `allkeys-*`
//! may also drop the fencing counter, so tokens restart). Nothing tells the holder: a second
//! client then acquires while the first still believes it holds. The check turns that silent
//! hazard into a warning, or a refusal for deployments that want one.
//!
//! This module only judges: the connections ask the servers (see `connect` and `conn`).

use std::collections::HashMap;
use std::future::Future;

use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::config::EvictionCheck;

/// A server's memory limit and policy, by name.
pub(crate) type MemorySettings = HashMap<String, String>;

/// The command that reads [`MemorySettings`]: `maxmemory*` rather than two names, since Redis 6
/// takes one parameter per `CONFIG GET`.
pub(crate) fn settings_query() -> redis::Cmd {
    redis::cmd("CONFIG").arg("GET").arg("maxmemory*").clone()
}

/// Why the server's settings let it evict lock keys, or `None` when they do not.
fn eviction_hazard(settings: &MemorySettings) -> Option<String> {
    let limit: u64 = settings.get("maxmemory")?.parse().ok()?;
    let policy = settings.get("maxmemory-policy")?;
    (limit > 0 && policy != "noeviction").then(|| {
        format!(
            "the server may evict held locks: maxmemory {limit} with maxmemory-policy {policy} \
             (set maxmemory-policy noeviction, or maxmemory 0)"
        )
    })
}

/// Acts on `check` for the settings `asked` reads: each server's, named by its address (empty
/// for the one server of a plain connection). A server that denies `CONFIG` (managed services
/// often rename it) cannot be judged: that is logged, never refused, since refusing would lock
/// those users out. `asked` is not awaited when the check is off.
///
/// # Errors
/// [`LockError::Config`] naming the hazard when `check` is [`EvictionCheck::Refuse`]; the error
/// of `asked` when a server did not answer ([`LockError::Unavailable`]).
pub(crate) async fn judge(
    check: EvictionCheck,
    asked: impl Future<Output = Result<Vec<(String, MemorySettings)>>>,
) -> Result<()> {
    if check == EvictionCheck::Off {
        return Ok(());
    }
    let every = match asked.await {
        Ok(every) => every,
        Err(error @ LockError::Unavailable { .. }) => return Err(error),
        Err(error) => {
            tracing::info!(%error, "redis: cannot read the eviction policy; not checked");
            return Ok(());
        }
    };
    for (node, settings) in every {
        let Some(hazard) = eviction_hazard(&settings) else {
            continue;
        };
        let hazard = if node.is_empty() {
            hazard
        } else {
            format!("node {node}: {hazard}")
        };
        if check == EvictionCheck::Refuse {
            return Err(LockError::Config {
                backend: BACKEND,
                reason: format!("{hazard}; or connect with eviction_check=warn"),
            });
        }
        tracing::warn!("redis: {hazard}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(limit: &str, policy: &str) -> MemorySettings {
        HashMap::from([
            ("maxmemory".to_owned(), limit.to_owned()),
            ("maxmemory-policy".to_owned(), policy.to_owned()),
        ])
    }

    #[test]
    fn only_a_limit_with_an_evicting_policy_is_a_hazard() {
        assert!(eviction_hazard(&settings("0", "volatile-lru")).is_none());
        assert!(eviction_hazard(&settings("2097152", "noeviction")).is_none());
        assert!(eviction_hazard(&settings("2097152", "volatile-lru")).is_some());
        assert!(eviction_hazard(&settings("2097152", "allkeys-random")).is_some());
        assert!(eviction_hazard(&HashMap::new()).is_none());
    }

    #[test]
    fn the_option_round_trips() {
        for check in [
            EvictionCheck::Warn,
            EvictionCheck::Refuse,
            EvictionCheck::Off,
        ] {
            assert_eq!(check.to_string().parse::<EvictionCheck>().unwrap(), check);
        }
        assert!(matches!(
            "never".parse::<EvictionCheck>(),
            Err(LockError::Config { .. })
        ));
    }
}
