//! The Redlock conformance harness: five independent redis-servers started by dlock-test-servers
//! (or the nodes `DLOCK_TEST_REDLOCK_URL` names), fresh clients, a residue check that reads every
//! node, and fault hooks that delete a holder's key everywhere and cut waiters' connections.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::history::{Count, Expect};
use dlock_conformance::{Amnesia, Deployment, Fault, Faults, Harness, ProxyTarget};
use dlock_redis::LockKeys;
use dlock_redlock::{Redlock, RedlockConfig};
use dlock_test_servers::{RedisNodes, subscribed_client_ids};

pub const URL_VAR: &str = "DLOCK_TEST_REDLOCK_URL";

pub struct RedlockHarness {
    deployment: Deployment,
}

/// `redlock://h1:p1,h2:p2,…` for the nodes' `redis://` URLs, with `query` appended.
pub fn redlock_url(nodes: &RedisNodes, query: &str) -> String {
    let hosts: Vec<String> = nodes.nodes().iter().map(|n| n.addr().to_string()).collect();
    format!("redlock://{}{query}", hosts.join(","))
}

pub fn start_nodes(n: usize) -> RedisNodes {
    RedisNodes::start(n).unwrap_or_else(|e| panic!("cannot start {n} redis nodes: {e}"))
}

impl RedlockHarness {
    /// Five nodes: `DLOCK_TEST_REDLOCK_URL` if set, else five private redis-servers.
    pub fn five() -> Self {
        let deployment = Deployment::from_env_or_start("redlock-5", URL_VAR, || {
            RedisNodes::start(5).map(|nodes| (redlock_url(&nodes, ""), nodes))
        });
        Self { deployment }
    }

    pub fn url(&self) -> &str {
        self.deployment.url()
    }
}

fn text(e: impl ToString) -> String {
    e.to_string()
}

/// A plain connection to every node of `url`.
pub async fn node_conns(
    url: &str,
) -> std::result::Result<Vec<redis::aio::MultiplexedConnection>, String> {
    let config = RedlockConfig::from_url(url).map_err(text)?;
    let mut conns = Vec::new();
    for node in &config.nodes {
        let client = redis::Client::open(format!("redis://{node}")).map_err(text)?;
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| format!("node {node} did not answer"))?
        .map_err(text)?;
        conns.push(conn);
    }
    Ok(conns)
}

pub fn keys(url: &str, name: &LockName) -> LockKeys {
    let config = RedlockConfig::from_url(url).expect("a valid URL");
    LockKeys::new(&config.prefix, name)
}

#[async_trait]
impl Harness for RedlockHarness {
    fn label(&self) -> &str {
        self.deployment.label()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(Redlock::connect_url(self.url()).await?))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        self.deployment.child_env()
    }

    /// The lock key of each name on every node (the fence counters stay by design; a waiter
    /// keeps a subscription, which goes with its connection, and a place in the waiting line,
    /// which it leaves or which lapses).
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let mut left = Vec::new();
        for (i, mut conn) in node_conns(self.url()).await?.into_iter().enumerate() {
            for name in names {
                let key = keys(self.url(), name).lock;
                let found: i64 = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(text)?;
                if found > 0 {
                    left.push(format!("node {i}: {key}"));
                }
            }
        }
        Ok(left)
    }
}

#[async_trait]
impl Faults for RedlockHarness {
    fn supports(&self, fault: Fault) -> bool {
        matches!(
            fault,
            Fault::KillHolder
                | Fault::KillOneHold
                | Fault::KillWaiters
                | Fault::Amnesia
                | Fault::AmnesiaMitigated
                | Fault::ProxyLink
        )
    }

    /// Five nodes of the case's own, each reached through a proxy of its own: a link fault
    /// then cuts, drops or delays the client's traffic to every node at once.
    async fn proxy_target(&self) -> std::result::Result<ProxyTarget, String> {
        let nodes = tokio::task::spawn_blocking(|| RedisNodes::start(5))
            .await
            .map_err(text)?
            .map_err(text)?;
        let upstreams: Vec<SocketAddr> = nodes.nodes().iter().map(|n| n.addr()).collect();
        let harness = Arc::new(RedlockHarness {
            deployment: Deployment::at("redlock-5", URL_VAR, redlock_url(&nodes, "")),
        });
        Ok(ProxyTarget::owned(
            upstreams,
            harness,
            |proxies: &[SocketAddr]| -> Arc<dyn Harness> {
                let hosts: Vec<String> = proxies.iter().map(SocketAddr::to_string).collect();
                Arc::new(RedlockHarness {
                    deployment: Deployment::at(
                        "redlock-5 via fault proxies",
                        URL_VAR,
                        format!("redlock://{}", hosts.join(",")),
                    ),
                })
            },
            nodes,
        ))
    }

    /// Five nodes of the case's own, persistence off; three of them restart (empty) at once.
    async fn amnesia(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        restarted_nodes(false).await
    }

    /// The same with every write on disk before it is answered (`appendfsync always`): the
    /// restarted nodes come back with their keys.
    async fn amnesia_mitigated(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        restarted_nodes(true).await
    }

    /// Deletes the lock key on every node, as every node restarting without persistence would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let key = keys(self.url(), name).lock;
        let mut deleted = 0;
        for mut conn in node_conns(self.url()).await? {
            let n: i64 = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(text)?;
            deleted += n;
        }
        if deleted == 0 {
            return Err(format!("{name} has no holder on any node"));
        }
        Ok(())
    }

    /// Once a client subscribes to `name`'s channel on some node (a waiter), `CLIENT KILL`s every
    /// subscribed connection on every node, as a proxy or network reset would.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let channel = keys(self.url(), name).channel;
        let mut conns = node_conns(self.url()).await?;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let mut subscribers = 0;
            for conn in &mut conns {
                let (_, n): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(conn)
                    .await
                    .map_err(text)?;
                subscribers += n;
            }
            if subscribers > 0 {
                break;
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(format!("no waiter subscribed to {name} after 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut killed = 0;
        for conn in &mut conns {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(conn)
                .await
                .map_err(text)?;
            for id in subscribed_client_ids(&list) {
                let n: i64 = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(id)
                    .query_async(conn)
                    .await
                    .map_err(text)?;
                killed += n as usize;
            }
        }
        Ok(killed)
    }
}

async fn restarted_nodes(durable: bool) -> std::result::Result<Box<dyn Amnesia>, String> {
    let nodes = tokio::task::spawn_blocking(move || {
        if durable {
            RedisNodes::start_durable(5)
        } else {
            RedisNodes::start(5)
        }
    })
    .await
    .map_err(text)?
    .map_err(text)?;
    let harness = Arc::new(RedlockHarness {
        deployment: Deployment::at("redlock-5", URL_VAR, redlock_url(&nodes, "")),
    });
    Ok(Box::new(RestartedNodes {
        nodes,
        harness,
        durable,
    }))
}

/// Redlock's crash-recovery hazard: a majority of the nodes that granted a lock restart at once.
/// With persistence off they come back empty and grant it again; with `appendfsync always` they
/// come back with it.
struct RestartedNodes {
    nodes: RedisNodes,
    harness: Arc<RedlockHarness>,
    durable: bool,
}

#[async_trait]
impl Amnesia for RestartedNodes {
    fn harness(&self) -> Arc<dyn Harness> {
        self.harness.clone()
    }

    fn hazard(&self) -> String {
        if self.durable {
            "3 of 5 nodes restart at once, each with appendfsync always".into()
        } else {
            "3 of 5 nodes restart at once without persistence (no appendfsync, no delayed restart)"
                .into()
        }
    }

    /// The restarted majority grants the lock again while its first holder still holds it: the
    /// overlap that makes a restart without persistence unsafe must show. The fence counters
    /// come back empty too, but a counter started again starts from the client's clock, above
    /// every token the old one handed out: the tokens still rise, and fencing refuses the first
    /// holder's late writes.
    fn expect(&self) -> Expect {
        Expect {
            token_issues: Count::Zero,
            ..Expect::NEGATIVE_CONTROL
        }
    }

    async fn forget(&self, _name: &LockName) -> std::result::Result<(), String> {
        let nodes = &self.nodes;
        tokio::task::block_in_place(|| {
            (0..3).try_for_each(|i| {
                let node = nodes.node(i);
                node.kill();
                node.restart().map_err(text)
            })
        })
    }
}
