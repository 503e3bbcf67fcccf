//! The two ways a Redis deployment forgets a lock it granted, for the fault suite's negative
//! control (`faults::server_that_forgets_a_lock_is_caught`): a single node evicting the lock key
//! under memory pressure, and a Sentinel failover to a replica the grant never reached; and each
//! configured as the docs advise (`noeviction`; `wait_replicas` with the replication link up),
//! for the mitigated counterpart (`faults::mitigated_server_keeps_the_lock`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::LockName;
use dlock_conformance::{Amnesia, Harness};
use dlock_redis::{LockKeys, RedisConfig};
use dlock_test_servers::{FaultProxy, ProxyMode, RedisSentinel, RedisServer};

use super::{RedisHarness, text};

/// Filler values: big enough that a few hundred fill the headroom.
const FILLER_BYTES: usize = 16 * 1024;

/// Whether the lock key of `name` exists on the node at `url`.
async fn lock_key_exists(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    name: &LockName,
) -> Result<bool, String> {
    let keys = LockKeys::new(prefix, name);
    let found: i64 = redis::cmd("EXISTS")
        .arg(&keys.lock)
        .query_async(conn)
        .await
        .map_err(text)?;
    Ok(found == 1)
}

async fn connect(url: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    redis::Client::open(url)
        .map_err(text)?
        .get_multiplexed_async_connection()
        .await
        .map_err(text)
}

/// A node that is given a memory limit and `policy` once the lock is held, then filled with
/// long-lived keys: under `volatile-ttl` until it evicts the lock key (the key with the shortest
/// TTL); under `noeviction` until it refuses the filler (out of memory) with the lock key kept.
pub struct EvictingNode {
    server: RedisServer,
    harness: Arc<RedisHarness>,
    policy: &'static str,
}

impl EvictingNode {
    pub async fn start(policy: &'static str) -> Result<Self, String> {
        let server = tokio::task::spawn_blocking(RedisServer::start)
            .await
            .map_err(text)?
            .map_err(text)?;
        let harness = Arc::new(RedisHarness::at(
            "redis",
            server.url(),
            "DLOCK_TEST_REDIS_URL",
        ));
        Ok(Self {
            server,
            harness,
            policy,
        })
    }
}

#[async_trait]
impl Amnesia for EvictingNode {
    fn harness(&self) -> Arc<dyn Harness> {
        self.harness.clone()
    }

    fn hazard(&self) -> String {
        format!("maxmemory reached under maxmemory-policy {}", self.policy)
    }

    async fn forget(&self, name: &LockName) -> Result<(), String> {
        let prefix = RedisConfig::from_url(&self.server.url())
            .map_err(text)?
            .prefix;
        let mut conn = connect(&self.server.url()).await?;
        let used: u64 = self
            .server
            .info_field("memory", "used_memory")
            .map_err(text)?
            .parse()
            .map_err(text)?;
        let limit = (used + 4 * 1024 * 1024).to_string();
        for (key, value) in [("maxmemory-policy", self.policy), ("maxmemory", &limit)] {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut conn)
                .await
                .map_err(text)?;
        }
        let filler = vec![b'x'; FILLER_BYTES];
        let mut written = 0usize;
        while lock_key_exists(&mut conn, &prefix, name).await? {
            if written > 100_000 {
                return Err(format!(
                    "{written} filler keys written, the lock key is still there"
                ));
            }
            let mut fill = redis::pipe();
            for i in written..written + 64 {
                fill.cmd("SET")
                    .arg(format!("filler:{i}"))
                    .arg(&filler)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            match fill.query_async::<()>(&mut conn).await {
                Ok(()) => written += 64,
                // Full, and allowed to evict nothing: the lock key stays.
                Err(e) if e.to_string().contains("OOM") => break,
                Err(e) => return Err(text(e)),
            }
        }
        // Evict nothing more: the rest of the case runs on an ordinary server.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .query_async(&mut conn)
            .await
            .map_err(text)?;
        Ok(())
    }
}

/// A primary, a replica and three Sentinels; arming points the replica at a blackholed proxy
/// (the replication link is cut, both nodes still serve), so the grant stays on the primary;
/// forgetting kills the primary and waits for the Sentinels to promote the replica.
///
/// [`start_mitigated`](Self::start_mitigated) is the same deployment and the same failover with
/// the link left up and clients that `WAIT` for the replica before they report a grant: the
/// promoted replica then has the lock.
pub struct FailoverWithoutTheGrant {
    deployment: RedisSentinel,
    cut_link: std::sync::Mutex<Option<FaultProxy>>,
    harness: Arc<RedisHarness>,
    /// Clients wait for the replica's acknowledgement, and arming cuts nothing.
    mitigated: bool,
}

impl FailoverWithoutTheGrant {
    pub async fn start() -> Result<Self, String> {
        Self::start_with(false).await
    }

    /// Clients with `wait_replicas=1`, the replication link kept up.
    pub async fn start_mitigated() -> Result<Self, String> {
        Self::start_with(true).await
    }

    async fn start_with(mitigated: bool) -> Result<Self, String> {
        let deployment = tokio::task::spawn_blocking(RedisSentinel::start)
            .await
            .map_err(text)?
            .map_err(text)?;
        let mut url = super::sentinel_url(&deployment);
        if mitigated {
            // A second's allowance: the replica answers in a millisecond on loopback, but the
            // whole suite shares two cores.
            url.push_str("?wait_replicas=1&wait_replicas_timeout=1s");
        }
        let harness = Arc::new(RedisHarness::at(
            "redis-sentinel",
            url,
            "DLOCK_TEST_REDIS_SENTINEL_URL",
        ));
        Ok(Self {
            deployment,
            cut_link: std::sync::Mutex::new(None),
            harness,
            mitigated,
        })
    }
}

#[async_trait]
impl Amnesia for FailoverWithoutTheGrant {
    fn harness(&self) -> Arc<dyn Harness> {
        self.harness.clone()
    }

    fn hazard(&self) -> String {
        if self.mitigated {
            "the primary dies after a grant its replica acknowledged (WAIT), and Sentinel promotes the replica".into()
        } else {
            "the primary dies after a grant its replica never received, and Sentinel promotes the replica".into()
        }
    }

    async fn arm(&self) -> Result<(), String> {
        if self.mitigated {
            return Ok(());
        }
        let primary = self.deployment.primary();
        let proxy = FaultProxy::start(primary.addr()).map_err(text)?;
        proxy.set_mode(ProxyMode::Blackhole);
        let port = proxy.addr().port().to_string();
        self.deployment
            .replica()
            .command(&["REPLICAOF", "127.0.0.1", &port])
            .map_err(text)?;
        *self.cut_link.lock().unwrap() = Some(proxy);
        // Cut once the primary has let go of the replica: from then on a write stays on it.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        while primary
            .info_field("replication", "connected_slaves")
            .map_err(text)?
            != "0"
        {
            if tokio::time::Instant::now() >= give_up {
                return Err("the primary still counts its replica 10 s after the cut".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    async fn forget(&self, name: &LockName) -> Result<(), String> {
        let prefix = RedisConfig::from_url(self.harness.url())
            .map_err(text)?
            .prefix;
        let deployment = &self.deployment;
        let old = deployment.primary_addr().map_err(text)?;
        let promoted = tokio::task::block_in_place(|| deployment.kill_primary()).map_err(text)?;
        if self.mitigated {
            // `WAIT` needs a replica after the failover too: the old primary comes back as the
            // new primary's replica, as an operator's restart would make it. Sentinel would
            // reconfigure it as well, but only once it trusts the restarted server's role report
            // (8 s at least, and not at all for 30 s in TILT mode, which a stalled VM triggers).
            if let Some(server) = [deployment.primary(), deployment.replica()]
                .into_iter()
                .find(|server| server.addr() == old)
            {
                tokio::task::block_in_place(|| server.restart()).map_err(text)?;
                let (host, port) = (promoted.ip().to_string(), promoted.port().to_string());
                server.command(&["REPLICAOF", &host, &port]).map_err(text)?;
            }
            let new_primary = if deployment.primary().addr() == promoted {
                deployment.primary()
            } else {
                deployment.replica()
            };
            let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
            while new_primary
                .info_field("replication", "connected_slaves")
                .map_err(text)?
                == "0"
            {
                if tokio::time::Instant::now() >= give_up {
                    return Err("the old primary did not rejoin as a replica within 30 s".into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut conn = connect(&format!("redis://{promoted}")).await?;
        let kept = lock_key_exists(&mut conn, &prefix, name).await?;
        if self.mitigated && !kept {
            return Err(format!(
                "the promoted replica {promoted} lacks a grant it acknowledged"
            ));
        }
        if !self.mitigated && kept {
            return Err(format!(
                "the promoted replica {promoted} has the lock: the replication link was not cut in time"
            ));
        }
        Ok(())
    }
}
