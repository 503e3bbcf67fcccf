//! The state every guard and waiter of one `Redlock` client shares: its nodes, the wake-up hub of
//! their announcements, its watching holders, the renewal timer and the round counters.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};

use dlock_redis::node::{NodeEvent, NodeEventHandler};

use crate::config::RedlockConfig;
use crate::held::Holders;
use crate::nodes::Slot;
use crate::wake::Hub;

/// One `Redlock` client's shared state.
pub(crate) struct Inner {
    pub(crate) config: RedlockConfig,
    pub(crate) slots: Vec<Arc<Slot>>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) holders: Arc<Holders>,
    pub(crate) stats: Counters,
    /// Starts this client's watchdogs when their first renewal comes due.
    pub(crate) timer: dlock_api::raw::GuardTimer,
    /// The guards this client holds, which `close` releases.
    pub(crate) holdings: dlock_api::raw::Holdings,
    /// This client's waiters per name, of which only the first waits at the nodes.
    pub(crate) waiters: dlock_api::raw::LocalQueue,
}

/// The handler of node `node`'s messages and lost connections: it hands them to the waiters'
/// hub and to the watching holders while they live (a node's connection must not keep its
/// client alive).
pub(crate) fn node_events(hub: &Arc<Hub>, holders: &Arc<Holders>, node: usize) -> NodeEventHandler {
    let (hub, holders): (Weak<Hub>, Weak<Holders>) = (Arc::downgrade(hub), Arc::downgrade(holders));
    Arc::new(move |event: NodeEvent<'_>| {
        if let Some(hub) = hub.upgrade() {
            hub.on_event(node, event);
        }
        if let Some(holders) = holders.upgrade() {
            holders.on_event(node, event);
        }
    })
}

/// How this client's rounds went, for [`RedlockStats`](crate::RedlockStats).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) rounds: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) split_votes: AtomicU64,
    pub(crate) first_in_line_rounds: AtomicU64,
}
