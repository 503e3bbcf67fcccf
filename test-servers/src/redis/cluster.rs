//! [`RedisCluster`]: three primaries owning every slot, optionally with replicas.

use std::net::SocketAddr;
use std::time::Instant;

use super::{CLUSTER_KIND, RedisServer, TOPOLOGY_TIMEOUT, start_all, wait_for};
use crate::error::{Result, ServerError};
use crate::ports::free_port_pair;
use crate::process::{Launch, find_program};

/// A Redis Cluster: 3 primaries owning all 16384 slots, optionally with replicas (`cluster-node-timeout 2000`).
///
/// Node ports are drawn from 20000..30000 so each node's cluster bus port (`port + 10000`) is free too.
/// [`start`](Self::start) returns once every node reports `cluster_state:ok`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
}

impl RedisCluster {
    /// Starts a cluster of three primaries without replicas.
    ///
    /// # Errors
    /// As [`RedisServer::start`]; [`ServerError::NotInstalled`] without `redis-cli`; [`ServerError::CommandFailed`]
    /// when `redis-cli --cluster create` fails; [`ServerError::Io`] when the cluster does not become ok in 60 s.
    pub fn start() -> Result<Self> {
        Self::start_with_replicas(0)
    }

    /// Starts a cluster of three primaries with `replicas` replicas each (nodes `0..3` are the primaries at
    /// creation, the rest their replicas).
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub fn start_with_replicas(replicas: usize) -> Result<Self> {
        let begun = Instant::now();
        let cli = find_program(CLUSTER_KIND, "redis-cli")?;
        let primaries = 3;
        let config =
            "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 2000\n";
        let nodes = (0..replicas.saturating_add(1).saturating_mul(primaries))
            .map(|_| {
                let port = free_port_pair(10_000)
                    .map_err(ServerError::io(CLUSTER_KIND, "cannot find free ports"))?;
                RedisServer::prepare(CLUSTER_KIND, port, config)
            })
            .collect::<Result<Vec<_>>>()?;
        start_all(&nodes)?;
        Launch::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| n.addr().to_string()))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .run(CLUSTER_KIND, TOPOLOGY_TIMEOUT)?;
        let cluster = RedisCluster { nodes, primaries };
        cluster.wait_ok()?;
        eprintln!(
            "dlock-test-servers: redis cluster of {} nodes ready in {:.2?}",
            cluster.nodes.len(),
            begun.elapsed()
        );
        Ok(cluster)
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok` and knows all nodes.
    ///
    /// # Errors
    /// [`ServerError::Io`] when that does not happen within 60 s.
    pub fn wait_ok(&self) -> Result<()> {
        let total = self.nodes.len().to_string();
        wait_for(
            CLUSTER_KIND,
            "cluster_state:ok on every node",
            TOPOLOGY_TIMEOUT,
            || {
                self.nodes
                    .iter()
                    .filter(|n| n.is_running() && !n.is_paused())
                    .all(|n| {
                        let info = n
                            .command(&["CLUSTER", "INFO"])
                            .ok()
                            .and_then(|r| r.as_text())
                            .unwrap_or_default();
                        info.contains("cluster_state:ok")
                            && info.contains(&format!("cluster_known_nodes:{total}"))
                    })
                    .then_some(())
            },
        )
    }

    /// All nodes' URLs (primaries first). Any of them is a valid seed for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// All nodes' addresses (primaries first).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// Node `i`; nodes `0..primaries()` were created as primaries.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The number of primaries at creation (3).
    pub fn primaries(&self) -> usize {
        self.primaries
    }
}

/// The whole cluster as one server, for the fault cases that crash, restart and freeze "the
/// server": every node at once, so that no failover stands in for the fault. Its URL is the
/// `redis+cluster://` one.
impl crate::ServerProcess for RedisCluster {
    fn addr(&self) -> SocketAddr {
        self.nodes[0].addr()
    }

    fn url(&self) -> String {
        let nodes: Vec<String> = self.addrs().iter().map(ToString::to_string).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    fn kill(&self) {
        for node in &self.nodes {
            node.kill();
        }
    }

    /// Restarts every node (persistence is off: they come back empty, their cluster
    /// configuration kept) and waits until the cluster is ok again.
    fn restart(&self) -> Result<()> {
        for node in &self.nodes {
            node.restart()?;
        }
        self.wait_ok()
    }

    fn pause(&self) {
        for node in &self.nodes {
            node.pause();
        }
    }

    fn resume(&self) {
        for node in &self.nodes {
            node.resume();
        }
    }
}
