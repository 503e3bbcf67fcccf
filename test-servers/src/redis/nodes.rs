//! [`RedisNodes`]: independent nodes, as Redlock needs.

use std::time::Instant;

use super::{KIND, RedisServer, free_port_for, start_all};
use crate::error::Result;

/// `n` independent Redis nodes, as Redlock needs. Dropping it stops them all.
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` independent nodes in parallel.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start(n: usize) -> Result<Self> {
        Self::start_configured(n, "")
    }

    /// Starts `n` independent nodes that write every change to their append-only file before
    /// answering (`appendonly yes`, `appendfsync always`): a [`restart`](RedisServer::restart)
    /// keeps their keys.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_durable(n: usize) -> Result<Self> {
        Self::start_configured(n, "appendonly yes\nappendfsync always\n")
    }

    fn start_configured(n: usize, extra_config: &str) -> Result<Self> {
        let begun = Instant::now();
        let nodes = (0..n)
            .map(|_| RedisServer::prepare(KIND, free_port_for(KIND)?, extra_config))
            .collect::<Result<Vec<_>>>()?;
        start_all(&nodes)?;
        eprintln!(
            "dlock-test-servers: {n} redis nodes ready in {:.2?}",
            begun.elapsed()
        );
        Ok(RedisNodes { nodes })
    }

    /// The nodes' URLs, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i` (panics when out of range).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}
