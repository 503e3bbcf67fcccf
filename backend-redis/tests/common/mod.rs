//! The Redis conformance harness: a deployment started by dlock-test-servers (or named by
//! `DLOCK_TEST_REDIS_URL`), fresh clients, and a fault hook that deletes a holder's key.
#![allow(dead_code, unreachable_pub)]

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::{Faults, Harness};
use dlock_redis::{LockKeys, RedisConfig, RedisLock};
use dlock_test_servers::{RedisCluster, RedisSentinel, RedisServer};

pub struct RedisHarness {
    label: &'static str,
    url: String,
    /// Keeps the servers alive as long as the harness.
    _servers: Box<dyn Any + Send + Sync>,
}

fn started<T>(what: &str, result: dlock_test_servers::Result<T>) -> T {
    result.unwrap_or_else(|e| panic!("cannot start {what} for the Redis tests: {e}"))
}

impl RedisHarness {
    /// One node: `DLOCK_TEST_REDIS_URL` if set, else a private redis-server.
    pub fn single() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_REDIS_URL") {
            return Self {
                label: "redis",
                url,
                _servers: Box::new(()),
            };
        }
        let server = started("redis-server", RedisServer::start());
        Self {
            label: "redis",
            url: server.url(),
            _servers: Box::new(server),
        }
    }

    /// A primary, a replica and three Sentinels (or `DLOCK_TEST_REDIS_SENTINEL_URL`).
    pub fn sentinel() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_REDIS_SENTINEL_URL") {
            return Self {
                label: "redis-sentinel",
                url,
                _servers: Box::new(()),
            };
        }
        let sentinel = started("a Redis Sentinel deployment", RedisSentinel::start());
        let hosts: Vec<String> = sentinel
            .sentinel_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        let url = format!(
            "redis+sentinel://{}/{}",
            hosts.join(","),
            sentinel.master_name()
        );
        Self {
            label: "redis-sentinel",
            url,
            _servers: Box::new(sentinel),
        }
    }

    /// Three primaries, each with a replica (or `DLOCK_TEST_REDIS_CLUSTER_URL`).
    pub fn cluster() -> Self {
        if let Ok(url) = std::env::var("DLOCK_TEST_REDIS_CLUSTER_URL") {
            return Self {
                label: "redis-cluster",
                url,
                _servers: Box::new(()),
            };
        }
        let cluster = started("a Redis Cluster", RedisCluster::start());
        let hosts: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
        let url = format!("redis+cluster://{}", hosts.join(","));
        Self {
            label: "redis-cluster",
            url,
            _servers: Box::new(cluster),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait]
impl Harness for RedisHarness {
    fn label(&self) -> &str {
        self.label
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(RedisLock::connect_url(&self.url).await?))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        let var = match self.label {
            "redis-sentinel" => "DLOCK_TEST_REDIS_SENTINEL_URL",
            "redis-cluster" => "DLOCK_TEST_REDIS_CLUSTER_URL",
            _ => "DLOCK_TEST_REDIS_URL",
        };
        Some(vec![(var.to_owned(), self.url.clone())])
    }
}

#[async_trait]
impl Faults for RedisHarness {
    /// Deletes the lock key, as a restart without persistence or a failover to a replica that
    /// missed the write would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let config = RedisConfig::from_url(&self.url).map_err(|e| e.to_string())?;
        let keys = LockKeys::new(&config.prefix, name);
        delete_key(&self.url, &keys.lock).await
    }
}

/// `DEL key` on whichever node owns it.
pub async fn delete_key(url: &str, key: &str) -> std::result::Result<(), String> {
    let deleted: i64 = if let Some(hosts) = url.strip_prefix("redis+cluster://") {
        let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        let client = redis::cluster::ClusterClient::new(nodes).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?
    } else if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        let (hosts, master) = rest.split_once('/').ok_or("no master")?;
        let sentinel = redis::Client::open(format!(
            "redis://{}",
            hosts.split(',').next().unwrap_or(hosts)
        ))
        .map_err(|e| e.to_string())?;
        let mut s = sentinel
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let (host, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async(&mut s)
            .await
            .map_err(|e| e.to_string())?;
        let client =
            redis::Client::open(format!("redis://{host}:{port}")).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?
    } else {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?
    };
    if deleted == 1 {
        Ok(())
    } else {
        Err(format!("key {key} was not there"))
    }
}
