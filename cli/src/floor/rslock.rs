//! The crate a Rust user would pick instead of dlock for a lock on Redis or on Redlock's nodes:
//! [rslock](https://crates.io/crates/rslock), driven as its documentation shows
//! (`LockManager::lock`, then `unlock`), on the nodes the floors use, through the same
//! measuring loops. It hands out no fencing token, so dlock's fenced pairs are measured against
//! a peer that does less.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use rslock::LockManager;

use super::redis::RunKeys;
use crate::floor::{Measured, Pairs, Throughput, many, pairs_of};

/// What the peer's pair is, for the report.
pub(super) const PEER_PAIR: &str = "rslock 0.10: LockManager::lock + unlock (no fencing token)";

/// The lease each peer lock asks for: as dlock's default TTL, long enough that no pair's lock
/// runs out before its unlock.
const TTL: Duration = Duration::from_secs(30);

/// rslock's lock manager over `nodes` (one multiplexed connection per node, made at its first
/// pair), with a key per task.
pub(super) struct RslockPairs {
    manager: LockManager,
    keys: Vec<String>,
}

impl RslockPairs {
    fn new(nodes: Vec<redis::Client>, keys: Vec<String>) -> Self {
        Self {
            manager: LockManager::from_clients(nodes),
            keys,
        }
    }
}

impl Pairs for RslockPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let lock = self
            .manager
            .lock(self.keys[task].as_bytes(), TTL)
            .await
            .map_err(|e| LockError::unavailable("rslock", e))?;
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

/// The peer's uncontended pairs on `nodes`, on one key of this run, for `duration`.
pub(super) async fn pairs(
    nodes: Vec<redis::Client>,
    keys: &RunKeys,
    duration: Duration,
) -> Result<Measured> {
    let pairs = RslockPairs::new(nodes, vec![keys.key("rslock")]);
    pairs_of(&pairs, duration).await
}

/// The peer's pairs in `tasks` tasks sharing one lock manager, a key each, for `duration`.
pub(super) async fn parallel(
    nodes: Vec<redis::Client>,
    keys: &RunKeys,
    tasks: usize,
    duration: Duration,
) -> Result<Throughput> {
    let pairs = RslockPairs::new(nodes, keys.parallel("rslock", tasks));
    many(Arc::new(pairs), tasks, duration).await
}
