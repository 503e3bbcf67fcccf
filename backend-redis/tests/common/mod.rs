//! The Redis conformance harness: a deployment started by dlock-test-servers (or named by
//! `DLOCK_TEST_REDIS_URL`), fresh clients, and a fault hook that deletes a holder's key.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::{Amnesia, Deployment, Fault, Faults, Harness, OwnServer, ProxyTarget};
use dlock_redis::{LockKeys, RedisConfig, RedisLock};
use dlock_test_servers::{RedisCluster, RedisSentinel, RedisServer, subscribed_client_ids};

pub mod amnesia;
pub mod proxied;

pub struct RedisHarness {
    deployment: Deployment,
}

const SINGLE_URL_VAR: &str = "DLOCK_TEST_REDIS_URL";
const SENTINEL_URL_VAR: &str = "DLOCK_TEST_REDIS_SENTINEL_URL";
const CLUSTER_URL_VAR: &str = "DLOCK_TEST_REDIS_CLUSTER_URL";

fn joined(addrs: &[std::net::SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl RedisHarness {
    /// A harness of the deployment at `url`, which child processes reach through `url_var`.
    pub fn at(label: &'static str, url: String, url_var: &'static str) -> Self {
        Self {
            deployment: Deployment::at(label, url_var, url),
        }
    }

    /// One node: `DLOCK_TEST_REDIS_URL` if set, else a private redis-server.
    pub fn single() -> Self {
        let deployment = Deployment::from_env_or_start("redis", SINGLE_URL_VAR, || {
            RedisServer::start().map(|server| (server.url(), server))
        });
        Self { deployment }
    }

    /// A primary, a replica and three Sentinels (or `DLOCK_TEST_REDIS_SENTINEL_URL`).
    pub fn sentinel() -> Self {
        let deployment = Deployment::from_env_or_start("redis-sentinel", SENTINEL_URL_VAR, || {
            let sentinel = RedisSentinel::start()?;
            Ok((sentinel_url(&sentinel), sentinel))
        });
        Self { deployment }
    }

    /// Three primaries, each with a replica (or `DLOCK_TEST_REDIS_CLUSTER_URL`).
    pub fn cluster() -> Self {
        let deployment = Deployment::from_env_or_start("redis-cluster", CLUSTER_URL_VAR, || {
            RedisCluster::start().map(|cluster| {
                (
                    format!("redis+cluster://{}", joined(&cluster.addrs())),
                    cluster,
                )
            })
        });
        Self { deployment }
    }

    pub fn url(&self) -> &str {
        self.deployment.url()
    }
}

#[async_trait]
impl Harness for RedisHarness {
    fn label(&self) -> &str {
        self.deployment.label()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(RedisLock::connect_url(self.url()).await?))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        self.deployment.child_env()
    }

    /// A Cluster's line is 250: its debug-build client, on two cores loaded by another build,
    /// does not keep 1,000 waiters' presence refreshes within the 2 s command timeout (the
    /// release build serves 1,000; see `dlock bench --scale`).
    fn line_at_scale(&self) -> usize {
        if self.url().starts_with("redis+cluster") {
            250
        } else {
            1_000
        }
    }

    /// The lock key, the waiter queue and the waiters' records of each name (the fence counter
    /// stays by design).
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let config = RedisConfig::from_url(self.url()).map_err(text)?;
        // One EXISTS per name (its keys share a hash tag, so a Cluster slot), one connection.
        let commands = names.iter().map(|name| {
            let keys = LockKeys::new(&config.prefix, name);
            let mut exists = redis::cmd("EXISTS");
            exists.arg(&keys.lock).arg(&keys.queue).arg(&keys.waiters);
            (name, exists)
        });
        let mut left = Vec::new();
        let mut conn = NodeConn::open(self.url()).await?;
        for (name, exists) in commands {
            let found: i64 = conn.query(&exists).await?;
            if found > 0 {
                left.push(format!("{found} keys of {name}"));
            }
        }
        Ok(left)
    }
}

#[async_trait]
impl Faults for RedisHarness {
    /// Deletes the lock key, as a restart without persistence or a failover to a replica that
    /// missed the write would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let config = RedisConfig::from_url(self.url()).map_err(|e| e.to_string())?;
        let keys = LockKeys::new(&config.prefix, name);
        delete_key(self.url(), &keys.lock).await
    }

    fn supports(&self, fault: Fault) -> bool {
        match fault {
            // The lock key deleted: the client's other locks stay.
            Fault::KillHolder | Fault::KillOneHold | Fault::KillWaiters => true,
            // A deployment of the case's own, crashed, restarted and frozen whole.
            Fault::OwnServer => true,
            // Sentinel and Cluster: each member behind a proxy (see `proxied`).
            Fault::ProxyLink => self.deployment.url_var() != SINGLE_URL_VAR,
            Fault::Amnesia => self.deployment.url_var() != CLUSTER_URL_VAR,
            Fault::AmnesiaMitigated => self.deployment.url_var() != CLUSTER_URL_VAR,
            _ => false,
        }
    }

    /// A private redis-server (persistence off, as in the tests' shared one); for Sentinel and
    /// Cluster, a deployment of the same shape, whose every process the case crashes, restarts
    /// and freezes at once.
    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        let (label, url_var) = (self.deployment.label(), self.deployment.url_var());
        let harness_for =
            move |url| -> Arc<dyn Harness> { Arc::new(RedisHarness::at(label, url, url_var)) };
        match url_var {
            SENTINEL_URL_VAR => OwnServer::start(RedisSentinel::start, harness_for).await,
            CLUSTER_URL_VAR => OwnServer::start(RedisCluster::start, harness_for).await,
            _ => OwnServer::start(RedisServer::start, harness_for).await,
        }
    }

    /// A single node: a server of the case's own. Sentinel and Cluster: the shared deployment,
    /// each of its members behind a proxy of the case's own.
    async fn proxy_target(&self) -> std::result::Result<ProxyTarget, String> {
        let (label, url_var) = (self.deployment.label(), self.deployment.url_var());
        if url_var == SINGLE_URL_VAR {
            return Ok(self.own_server().await?.into());
        }
        let url = self.url().to_owned();
        let direct = Arc::new(RedisHarness::at(label, url.clone(), url_var));
        proxied::proxy_target(label, url, url_var, direct).await
    }

    /// A single node evicts the lock key; a Sentinel deployment fails over to a replica that
    /// never received the grant.
    async fn amnesia(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        if self.deployment.url_var() == SENTINEL_URL_VAR {
            Ok(Box::new(amnesia::FailoverWithoutTheGrant::start().await?))
        } else {
            Ok(Box::new(
                amnesia::EvictingNode::start("volatile-ttl").await?,
            ))
        }
    }

    /// A single node under `noeviction`, filled up the same way; a Sentinel deployment whose
    /// clients `WAIT` for the replica (`wait_replicas=1`), failed over with the link up.
    async fn amnesia_mitigated(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        if self.deployment.url_var() == SENTINEL_URL_VAR {
            Ok(Box::new(
                amnesia::FailoverWithoutTheGrant::start_mitigated().await?,
            ))
        } else {
            Ok(Box::new(amnesia::EvictingNode::start("noeviction").await?))
        }
    }

    /// Once a waiter is queued for `name`, `CLIENT KILL`s the connections of waiting clients, as
    /// a proxy or network reset would: those with a channel subscription (a dlock client
    /// subscribes only while one of its tasks waits). Clients that only hold locks keep their
    /// connections. The server cannot say whose subscription is for `name`, so every waiting
    /// client's goes: the suite runs this case alone.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let config = RedisConfig::from_url(self.url()).map_err(text)?;
        let keys = LockKeys::new(&config.prefix, name);
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&keys.queue);
        let give_up = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        while query_for_key::<i64>(self.url(), &exists).await? == 0 {
            if tokio::time::Instant::now() >= give_up {
                return Err(format!("no waiter queued for {name} after 30 s"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let mut killed = 0;
        for node in node_urls(self.url()).await? {
            let client = redis::Client::open(node).map_err(text)?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(text)?;
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut conn)
                .await
                .map_err(text)?;
            for id in subscribed_client_ids(&list) {
                let n: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(id)
                    .query_async(&mut conn)
                    .await
                    .map_err(text)?;
                killed += n as usize;
            }
        }
        Ok(killed)
    }
}

/// The `redis+sentinel://` URL of `deployment`.
fn sentinel_url(deployment: &RedisSentinel) -> String {
    format!(
        "redis+sentinel://{}/{}",
        joined(&deployment.sentinel_addrs()),
        deployment.master_name()
    )
}

/// The URL of every data node of the deployment `url` names (the primary, for Sentinel).
async fn node_urls(url: &str) -> std::result::Result<Vec<String>, String> {
    // Client options (`?wait_replicas=1`) are not part of any node's address.
    let url = url
        .split_once('?')
        .map_or(url, |(deployment, _options)| deployment);
    if let Some(hosts) = url.strip_prefix("redis+cluster://") {
        return Ok(hosts.split(',').map(|h| format!("redis://{h}")).collect());
    }
    match url.strip_prefix("redis+sentinel://") {
        Some(rest) => Ok(vec![primary_url(rest).await?]),
        None => Ok(vec![url.to_owned()]),
    }
}

fn text(e: impl ToString) -> String {
    e.to_string()
}

/// A connection that sends a one-key command to whichever node owns the key.
enum NodeConn {
    Cluster(redis::cluster_async::ClusterConnection),
    Node(redis::aio::MultiplexedConnection),
}

impl NodeConn {
    async fn open(url: &str) -> std::result::Result<Self, String> {
        if url.starts_with("redis+cluster://") {
            let client = redis::cluster::ClusterClient::new(node_urls(url).await?).map_err(text)?;
            Ok(Self::Cluster(
                client.get_async_connection().await.map_err(text)?,
            ))
        } else {
            let node = node_urls(url).await?.remove(0);
            let client = redis::Client::open(node).map_err(text)?;
            Ok(Self::Node(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(text)?,
            ))
        }
    }

    async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &redis::Cmd,
    ) -> std::result::Result<T, String> {
        match self {
            Self::Cluster(conn) => cmd.query_async(conn).await.map_err(text),
            Self::Node(conn) => cmd.query_async(conn).await.map_err(text),
        }
    }
}

/// Runs a one-key command on whichever node owns the key.
async fn query_for_key<T: redis::FromRedisValue>(
    url: &str,
    cmd: &redis::Cmd,
) -> std::result::Result<T, String> {
    NodeConn::open(url).await?.query(cmd).await
}

/// `DEL key` on whichever node owns it.
pub async fn delete_key(url: &str, key: &str) -> std::result::Result<(), String> {
    let mut del = redis::cmd("DEL");
    del.arg(key);
    let deleted: i64 = query_for_key(url, &del).await?;
    if deleted == 1 {
        Ok(())
    } else {
        Err(format!("key {key} was not there"))
    }
}

/// The current primary's URL, asked of the first Sentinel in `SENTINELS/MASTER`.
async fn primary_url(sentinels_and_master: &str) -> std::result::Result<String, String> {
    let (hosts, master) = sentinels_and_master
        .split_once('/')
        .ok_or("no master name")?;
    let first = hosts.split(',').next().unwrap_or(hosts);
    let sentinel = redis::Client::open(format!("redis://{first}")).map_err(text)?;
    let mut conn = sentinel
        .get_multiplexed_async_connection()
        .await
        .map_err(text)?;
    let (host, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(&mut conn)
        .await
        .map_err(text)?;
    Ok(format!("redis://{host}:{port}"))
}
