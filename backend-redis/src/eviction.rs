//! The server's eviction policy, asked once at connect.
//!
//! A lock key carries a TTL, so a server with a memory limit and any policy but `noeviction` may
//! delete a *held* lock to make room (`volatile-*` picks exactly the keys with a TTL; `allkeys-*`
//! may also drop the fencing counter, so tokens restart). Nothing tells the holder: a second
//! client then acquires while the first still believes it holds. The connect-time check turns
//! that silent hazard into a warning, or a refusal for deployments that want one.

use std::collections::HashMap;

use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::config::{EvictionCheck, RedisConfig, Topology};
use crate::conn::{Conn, PushHandler};

/// Why the server's settings let it evict lock keys, or `None` when they do not.
fn eviction_hazard(settings: &HashMap<String, String>) -> Option<String> {
    let limit: u64 = settings.get("maxmemory")?.parse().ok()?;
    let policy = settings.get("maxmemory-policy")?;
    (limit > 0 && policy != "noeviction").then(|| {
        format!(
            "the server may evict held locks: maxmemory {limit} with maxmemory-policy {policy} \
             (set maxmemory-policy noeviction, or maxmemory 0)"
        )
    })
}

/// Connects as `config` says, then asks the server whether it may evict lock keys and acts on
/// `config.eviction_check`: every connection a lock or a node makes goes through here.
pub(crate) async fn connect_checked(config: &RedisConfig, push: PushHandler) -> Result<Conn> {
    let conn = Conn::connect(config, push).await?;
    if let Topology::Single { node } = &config.topology {
        refuse_cluster_node(&conn, node, config.command_timeout).await?;
    }
    check(&conn, config.eviction_check, config.command_timeout).await?;
    Ok(conn)
}

/// A `redis://` URL naming one node of a Redis Cluster would work for the names whose slot that
/// node serves and fail with `MOVED` for the others: refused at connect instead.
async fn refuse_cluster_node(conn: &Conn, node: &str, timeout: std::time::Duration) -> Result<()> {
    // A server that denies INFO cannot be judged; its first MOVED will say it.
    let Some(info) = conn.info(timeout, "cluster").await? else {
        return Ok(());
    };
    if info.lines().any(|line| line.trim() == "cluster_enabled:1") {
        return Err(LockError::Config {
            backend: BACKEND,
            reason: format!(
                "{node} is a Redis Cluster node: connect with redis+cluster:// (or \
                 rediss+cluster://), which follows the cluster's slots"
            ),
        });
    }
    Ok(())
}

/// Asks the server (in a Cluster, every primary) for its memory limit and policy, and acts on
/// `check`. A server that denies `CONFIG` (managed services often rename it) cannot be judged:
/// that is logged, never refused, since refusing would lock those users out.
pub(crate) async fn check(
    conn: &Conn,
    check: EvictionCheck,
    timeout: std::time::Duration,
) -> Result<()> {
    if check == EvictionCheck::Off {
        return Ok(());
    }
    // `maxmemory*` rather than two names: Redis 6 takes one parameter per CONFIG GET.
    let asked = redis::cmd("CONFIG").arg("GET").arg("maxmemory*").clone();
    let every: Vec<(String, HashMap<String, String>)> =
        match conn.query_every_primary(timeout, &asked).await {
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

    fn settings(limit: &str, policy: &str) -> HashMap<String, String> {
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
