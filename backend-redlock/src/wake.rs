//! Waking waiters on release announcements from a majority of nodes.
//!
//! A holder's release publishes `released` on the name's channel of every node it deletes its
//! key from. Each waiter of this client records *which* nodes announced since its last attempt
//! (a bit per node) and wakes once those nodes, together with the nodes its last attempt found
//! free, make a quorum: one announcement lost with a node does not strand it, and one early
//! message does not send every waiter racing N nodes for a lock still held on the others. A
//! lost connection to a node wakes every waiter to check again.
//!
//! One subscription per name per node per client, shared by the client's waiters of that name;
//! the last waiter to leave unsubscribes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::{Subscription, Subscriptions};
use dlock_redis::node::NodeEvent;
use tokio::sync::Notify;

use crate::nodes::Slot;

/// The release announcement's text.
const RELEASED: &str = "released";

#[derive(Debug, Default)]
pub(crate) struct Hub {
    channels: Arc<Subscriptions<Channel>>,
}

#[derive(Debug)]
struct Channel {
    waiters: Mutex<Vec<Arc<Cell>>>,
    /// Per node: whether this client's subscription there is live.
    subscribed: Vec<AtomicBool>,
}

/// One waiter's record of announcements.
#[derive(Debug, Default)]
struct Cell {
    /// A bit per node that announced a release since the last [`Waiting::reset`].
    freed: AtomicU64,
    /// A node's connection dropped: check again.
    recheck: AtomicBool,
    notify: Notify,
}

impl Hub {
    /// A node's message or lost connection.
    pub(crate) fn on_event(&self, node: usize, event: NodeEvent<'_>) {
        match event {
            NodeEvent::Message { channel, payload } if payload == RELEASED => {
                self.channels.with(channel, |channel| {
                    for cell in channel.cells().iter() {
                        cell.freed.fetch_or(1 << node, Ordering::SeqCst);
                        cell.notify.notify_one();
                    }
                });
            }
            NodeEvent::Disconnected => self.channels.for_each(|channel| {
                if let Some(flag) = channel.subscribed.get(node) {
                    flag.store(false, Ordering::SeqCst);
                }
                for cell in channel.cells().iter() {
                    cell.recheck.store(true, Ordering::SeqCst);
                    cell.notify.notify_one();
                }
            }),
            _ => {}
        }
    }

    /// Registers a waiter on `channel` for a client of `nodes` nodes.
    pub(crate) fn register(self: &Arc<Self>, channel: &str, nodes: usize) -> Waiting {
        let cell = Arc::new(Cell::default());
        let entry = self.channels.join(channel, || Channel {
            waiters: Mutex::new(Vec::new()),
            subscribed: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
        });
        entry.cells().push(cell.clone());
        Waiting {
            hub: self.clone(),
            channel: entry,
            cell,
            slots: Vec::new(),
            timeout: Duration::ZERO,
        }
    }
}

impl Channel {
    fn cells(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Cell>>> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One waiter's registration; dropping it unsubscribes when no waiter of the name is left.
#[derive(Debug)]
pub(crate) struct Waiting {
    hub: Arc<Hub>,
    channel: Arc<Subscription<Channel>>,
    cell: Arc<Cell>,
    slots: Vec<Arc<Slot>>,
    timeout: Duration,
}

impl Waiting {
    /// Subscribes on every reachable node where this client is not subscribed yet, in
    /// parallel, each within `timeout`; returns on how many nodes the subscription is live.
    /// Nodes that fail are tried again on the next call.
    pub(crate) async fn ensure_subscribed(
        &mut self,
        slots: &[Arc<Slot>],
        timeout: Duration,
    ) -> usize {
        if self.slots.is_empty() {
            self.slots = slots.to_vec();
            self.timeout = timeout;
        }
        let missing: Vec<&Arc<Slot>> = slots
            .iter()
            .filter(|slot| !self.channel.subscribed[slot.index].load(Ordering::SeqCst))
            .collect();
        if !missing.is_empty() {
            let _ordered = self.hub.channels.ordered().await;
            let channel = &self.channel;
            futures::future::join_all(missing.into_iter().map(|slot| async move {
                if channel.subscribed[slot.index].load(Ordering::SeqCst) {
                    return;
                }
                let Ok(node) = slot.get() else { return };
                match node.subscribe(channel.name(), timeout).await {
                    Ok(()) => channel.subscribed[slot.index].store(true, Ordering::SeqCst),
                    Err(error) => {
                        tracing::debug!(node = %slot.addr(), %error, "redlock: subscribe failed")
                    }
                }
            }))
            .await;
        }
        self.channel
            .subscribed
            .iter()
            .filter(|s| s.load(Ordering::SeqCst))
            .count()
    }

    /// Forgets the announcements seen so far: call it before each attempt, so an announcement
    /// during the attempt counts and one from before it does not.
    pub(crate) fn reset(&self) {
        self.cell.freed.store(0, Ordering::SeqCst);
        self.cell.recheck.store(false, Ordering::SeqCst);
    }

    /// Resolves once the nodes that announced a release, together with `free` (a bit per node
    /// the last attempt found free), number at least `quorum`, or the agreed node `gate`
    /// announced one, or a node's connection dropped.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub(crate) async fn freed(&self, free: u64, quorum: usize, gate: Option<usize>) {
        loop {
            let notified = self.cell.notify.notified();
            let announced = self.cell.freed.load(Ordering::SeqCst);
            if (announced | free).count_ones() as usize >= quorum
                || gate.is_some_and(|g| announced & (1 << g) != 0)
                || self.cell.recheck.load(Ordering::SeqCst)
            {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.channel.cells().retain(|c| !Arc::ptr_eq(c, &self.cell));
        let (slots, timeout) = (std::mem::take(&mut self.slots), self.timeout);
        self.hub
            .channels
            .leave(&self.channel, move |channel| async move {
                let channel = &channel;
                futures::future::join_all(slots.iter().map(|slot| async move {
                    if !channel.subscribed[slot.index].swap(false, Ordering::SeqCst) {
                        return;
                    }
                    if let Ok(node) = slot.get() {
                        if let Err(error) = node.unsubscribe(channel.name(), timeout).await {
                            tracing::debug!(node = %slot.addr(), %error, "redlock: unsubscribe failed");
                        }
                    }
                }))
                .await;
            });
    }
}
