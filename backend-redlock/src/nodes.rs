//! The N nodes: one connection each, opened at start and, for a node that was down then, again
//! in the background whenever it is needed, so a node that comes back rejoins by itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dlock_api::{LockError, Result};
use dlock_redis::RedisConfig;
use dlock_redis::node::{Node, NodeEventHandler};

use crate::BACKEND;
use crate::config::RedlockConfig;

/// One node: its connection once it has one. A connection, once open, reconnects by itself
/// (and subscribes again); only a node that could never be reached is retried here.
pub(crate) struct Slot {
    pub(crate) index: usize,
    config: RedisConfig,
    node: OnceLock<Arc<Node>>,
    connecting: AtomicBool,
    events: NodeEventHandler,
    /// Every node's server, by `run_id`: one server under two addresses is one node.
    servers: Arc<Servers>,
}

/// The servers the nodes reached: `run_id` → the node's address.
type Servers = Mutex<HashMap<String, String>>;

impl Slot {
    fn new(
        index: usize,
        config: RedisConfig,
        events: NodeEventHandler,
        servers: Arc<Servers>,
    ) -> Self {
        Self {
            index,
            config,
            node: OnceLock::new(),
            connecting: AtomicBool::new(false),
            events,
            servers,
        }
    }

    /// The node's `host:port`.
    pub(crate) fn addr(&self) -> String {
        self.config.to_string()
    }

    /// Connects now (once at a time).
    async fn connect(&self) -> Result<()> {
        if self.node.get().is_some() {
            return Ok(());
        }
        let node = Node::connect_with_events(self.config.clone(), self.events.clone()).await?;
        // Redlock's safety rests on nodes that fail independently and never hand a key to a
        // stand-in: a replica, or a primary a replica could replace, is a deployment mistake.
        if let Some(hazard) = node.replication_hazard().await? {
            return Err(LockError::Config {
                backend: BACKEND,
                reason: format!(
                    "node {} cannot be a Redlock node: {hazard}; use independent primaries \
                     without replicas or Sentinel",
                    self.addr()
                ),
            });
        }
        // The configuration refuses a node listed twice by its text; the same server under two
        // names (`localhost` and `127.0.0.1`) would count twice towards the quorum.
        if let Some(run_id) = node.run_id().await? {
            let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
            let addr = self.addr();
            match servers.get(&run_id) {
                Some(other) if *other != addr => {
                    return Err(LockError::Config {
                        backend: BACKEND,
                        reason: format!(
                            "nodes {other} and {addr} are the same server (run_id {run_id}); \
                             each node must be an independent server"
                        ),
                    });
                }
                _ => {
                    servers.insert(run_id, addr);
                }
            }
        }
        let _ = self.node.set(Arc::new(node));
        Ok(())
    }

    /// The node's connection, if it has one. Without one it starts connecting in the background
    /// (if it is not already) and answers `Unavailable` for this call.
    pub(crate) fn get(self: &Arc<Self>) -> Result<&Arc<Node>> {
        if let Some(node) = self.node.get() {
            return Ok(node);
        }
        self.connect_in_background(None);
        Err(LockError::unavailable_because(
            BACKEND,
            format!("node {} is not connected", self.addr()),
        ))
    }

    /// Starts connecting on a task of its own, unless it is already, and sends the outcome to
    /// `report` with the node's index. An outcome nobody awaits any more is logged.
    fn connect_in_background(self: &Arc<Self>, report: Option<Outcomes>) {
        if self.connecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.connecting.store(false, Ordering::SeqCst);
            return;
        };
        // Cleared however the task ends, also when its runtime shuts down under it: else the
        // node would never be connected again.
        let connecting = ClearOnDrop(self.clone());
        runtime.spawn(async move {
            let slot = &connecting.0;
            let outcome = slot.connect().await;
            let unheard = match report {
                Some(report) => report.send((slot.index, outcome)).err().map(|e| e.0.1),
                None => Some(outcome),
            };
            match unheard {
                Some(Err(error @ LockError::Config { .. })) => {
                    tracing::error!(node = %slot.addr(), %error, "redlock: node refused");
                }
                Some(Err(error)) => {
                    tracing::debug!(node = %slot.addr(), %error, "redlock: node still unreachable");
                }
                Some(Ok(())) | None => {}
            }
        });
    }
}

/// Where the nodes' connect tasks report: a node's index and how its connect ended.
type Outcomes = tokio::sync::mpsc::UnboundedSender<(usize, Result<()>)>;

/// Clears its slot's `connecting` when dropped.
struct ClearOnDrop(Arc<Slot>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.connecting.store(false, Ordering::SeqCst);
    }
}

/// Connects to every node in parallel, node `i`'s messages and lost connections going to
/// `events(i)`; succeeds when at least `quorum` answer. Once a quorum has, the others get one
/// per-node timeout more (time enough for a node that answers, and for its checks to refuse it)
/// and then go on connecting in the background: two frozen nodes of five (the kernel takes the
/// connection, nothing answers) cost a start that one per-node timeout, not two connect
/// timeouts.
pub(crate) async fn connect_all(
    config: &RedlockConfig,
    events: impl Fn(usize) -> NodeEventHandler,
) -> Result<Vec<Arc<Slot>>> {
    let servers = Arc::new(Servers::default());
    let slots: Vec<Arc<Slot>> = (0..config.nodes.len())
        .map(|i| {
            Arc::new(Slot::new(
                i,
                config.node_config(i),
                events(i),
                servers.clone(),
            ))
        })
        .collect();
    let results = first_answers(config, &slots).await;
    // A node the configuration refuses (its eviction policy) is a deployment mistake to name,
    // not an outage to ride out on the other nodes.
    if let Some(Some(Err(refused))) = results
        .iter()
        .find(|r| matches!(r, Some(Err(LockError::Config { .. }))))
    {
        return Err(LockError::Config {
            backend: BACKEND,
            reason: refused.to_string(),
        });
    }
    let connected = results.iter().filter(|r| matches!(r, Some(Ok(())))).count();
    if connected < config.quorum() {
        let failures: Vec<String> = slots
            .iter()
            .zip(&results)
            .filter_map(|(slot, r)| match r {
                Some(Ok(())) => None,
                Some(Err(e)) => Some(format!("{}: {}", slot.addr(), dlock_api::error_chain(e))),
                None => Some(format!("{}: no answer yet", slot.addr())),
            })
            .collect();
        return Err(LockError::unavailable_because(
            BACKEND,
            format!(
                "only {connected} of {} nodes answered, {} needed ({})",
                slots.len(),
                config.quorum(),
                failures.join("; ")
            ),
        ));
    }
    for (slot, result) in slots.iter().zip(&results) {
        match result {
            Some(Ok(())) => {}
            Some(Err(error)) => {
                tracing::warn!(node = %slot.addr(), %error, "redlock: node unreachable at start; retrying when needed");
            }
            None => {
                tracing::warn!(node = %slot.addr(), "redlock: node not answering at start; still connecting");
            }
        }
    }
    Ok(slots)
}

/// Starts every node's connect and collects the outcomes (`None`: no answer yet) until each
/// node has answered, a quorum has and the others' grace has passed, or a quorum can no longer
/// answer.
async fn first_answers(config: &RedlockConfig, slots: &[Arc<Slot>]) -> Vec<Option<Result<()>>> {
    let (report, mut outcomes) = tokio::sync::mpsc::unbounded_channel();
    for slot in slots {
        slot.connect_in_background(Some(report.clone()));
    }
    drop(report);
    let (n, quorum) = (slots.len(), config.quorum());
    let grace = config.node_timeout_for(dlock_api::LockOptions::new().ttl());
    let mut results: Vec<Option<Result<()>>> = (0..n).map(|_| None).collect();
    let mut others_until = None;
    loop {
        let next = match others_until {
            Some(until) => tokio::time::timeout_at(until, outcomes.recv())
                .await
                .ok()
                .flatten(),
            None => outcomes.recv().await,
        };
        // Every connect reported (a runtime shutting down drops them unreported), or the grace
        // has passed.
        let Some((i, outcome)) = next else { break };
        results[i] = Some(outcome);
        let connected = results.iter().filter(|r| matches!(r, Some(Ok(())))).count();
        let failed = results.iter().filter(|r| matches!(r, Some(Err(_)))).count();
        if failed > n.saturating_sub(quorum) {
            break;
        }
        if connected >= quorum && others_until.is_none() {
            others_until = Some(dlock_api::raw::time::after(
                tokio::time::Instant::now(),
                grace,
            ));
        }
    }
    results
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("addr", &self.addr())
            .field("connected", &self.node.get().is_some())
            .finish()
    }
}
