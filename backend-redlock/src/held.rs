//! The takeover signal: a holder learns that its keys went and someone took the lock, as the
//! taker takes it, not at its next renewal.
//!
//! A Redlock lock is a key with a TTL on each of N nodes. The keys can go without their
//! holder's release: the lease ran out while the holder was paused, an operator deleted them,
//! the nodes restarted without persistence. Renewal finds out at the next extend (a third of the
//! TTL: up to 10 s with the default lease), and until then two guards can say `is_held()`. So a
//! lock held longer than [`WATCH_HELD_AFTER`] marks itself watched on every node
//! (`Node::watch_held`: `CLIENT OWNER` under the name's `:watch` key), once this client has
//! subscribed there to its own channel, `PREFIX:held-by:CLIENT` (one subscription per node for
//! all the locks a client holds). Whoever takes the lock on a node over a vanished key publishes
//! `lost OWNER` there, and the holder counts the node as gone. Once more nodes are gone than
//! the quorum can spare (`N - quorum`), no quorum can be the holder's any more and the guard is
//! lost ([`LostReason::TakenOver`](dlock_api::LostReason::TakenOver)) as the message arrives. A
//! lock released sooner (most are) never pays for the marks.
//!
//! A node whose mark answers "not yours" counts as gone too (its key went before the watch
//! started), and a node whose connection dropped, whose messages were missed, is marked again
//! once it is back. A key that goes while nobody takes the lock is still found by the next
//! renewal: nobody else holds the lock meanwhile.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{
    HeldCheck, HeldWatchTiming, LeaseState, Scheduled, start_watch_after, watch_held,
};
use dlock_api::{LockError, LostReason, Result};
use dlock_redis::LockKeys;
use dlock_redis::node::{Node, NodeEvent};
use futures::future::join_all;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::Inner;

/// How long a lock is held before its holder watches it, as the single-node backend's holders do.
const WATCH_HELD_AFTER: Duration = Duration::from_millis(250);

/// A watch marks every node again well within the ten minutes a mark lives, and tries a node
/// that could not be marked (down, or its connection coming back) again a second later.
const TIMING: HeldWatchTiming = HeldWatchTiming {
    again_every: Duration::from_secs(120),
    retry_after: Duration::from_secs(1),
};

/// This client's watching holders, by owner value, and its channel on each node.
#[derive(Debug)]
pub(crate) struct Holders {
    /// Random hex digits, new for every client.
    client: String,
    watched: Mutex<HashMap<Arc<str>, Arc<Watched>>>,
    /// Per node: whether this client's channel is subscribed there.
    subscribed: Vec<AtomicBool>,
    /// Per node: taken while subscribing, so that the many watches that start together (a
    /// batch of locks held at once) send one `SUBSCRIBE`, not one each.
    subscribing: Vec<tokio::sync::Mutex<()>>,
}

/// One watching holder.
#[derive(Debug)]
struct Watched {
    state: Weak<LeaseState>,
    /// A bit per node where the key is known not to be the holder's any more.
    gone: AtomicU64,
    /// A bit per node where the mark stands (cleared when the node's connection drops).
    marked: AtomicU64,
    /// Nodes that can be gone before no quorum is left: `N - quorum`.
    spare: u32,
    /// Notified when a node's connection drops: mark it again.
    wake: Notify,
}

impl Watched {
    /// Counts `nodes` as gone; loses the guard once more than the spare nodes are.
    fn gone(&self, nodes: u64) -> bool {
        let gone = self.gone.fetch_or(nodes, Ordering::SeqCst) | nodes;
        let lost = gone.count_ones() > self.spare;
        if lost {
            if let Some(state) = self.state.upgrade() {
                if !state.is_closed() {
                    state.mark_lost(LostReason::TakenOver);
                }
            }
        }
        lost
    }
}

impl Holders {
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            client: dlock_api::raw::random_owner(),
            watched: Mutex::new(HashMap::new()),
            subscribed: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
            subscribing: (0..nodes).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Watched>>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A node's message or lost connection.
    pub(crate) fn on_event(&self, node: usize, event: NodeEvent<'_>) {
        match event {
            NodeEvent::HolderLost { owner } => {
                let watched = self.watched().get(owner).cloned();
                if let Some(watched) = watched {
                    watched.gone(1 << node);
                }
            }
            NodeEvent::Disconnected => {
                if let Some(flag) = self.subscribed.get(node) {
                    flag.store(false, Ordering::SeqCst);
                }
                for watched in self.watched().values() {
                    watched.marked.fetch_and(!(1 << node), Ordering::SeqCst);
                    watched.wake.notify_waiters();
                }
            }
            _ => {}
        }
    }
}

impl Holders {
    /// Subscribes this client's channel on node `index` unless it is already.
    async fn subscribe(&self, index: usize, node: &Node, timeout: Duration) -> Result<()> {
        if self.subscribed[index].load(Ordering::SeqCst) {
            return Ok(());
        }
        let _one_at_a_time = self.subscribing[index].lock().await;
        if !self.subscribed[index].load(Ordering::SeqCst) {
            node.subscribe(&node.held_by_channel(&self.client), timeout)
                .await?;
            self.subscribed[index].store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// What a holder hands its watch.
pub(crate) struct HeldLock {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) state: Arc<LeaseState>,
}

/// Schedules the watch of a lock just granted, [`WATCH_HELD_AFTER`] from now on the client's
/// guard timer; dropping the handle (the lease went first) cancels it.
pub(crate) fn schedule_watch(inner: &Arc<Inner>, held: HeldLock) -> Option<Scheduled> {
    let state = held.state.clone();
    let watch = watch(Arc::downgrade(inner), held);
    start_watch_after(&inner.timer, WATCH_HELD_AFTER, &state, watch)
}

/// Runs until the guard is released, lost, or its client dropped.
async fn watch(client: Weak<Inner>, held: HeldLock) {
    let Some(registered) = Registered::new(&client, &held) else {
        return;
    };
    let mut remark_at = after(Instant::now(), TIMING.again_every);
    watch_held(&held.state, &registered.watched.wake, TIMING, || {
        // Every node again when the marks come due, else only those not marked yet.
        if Instant::now() >= remark_at {
            registered.watched.marked.store(0, Ordering::SeqCst);
            remark_at = after(Instant::now(), TIMING.again_every);
        }
        mark(&client, &registered.watched, &held)
    })
    .await;
}

/// A holder's entry in [`Holders`], removed when its watch ends.
struct Registered {
    holders: Arc<Holders>,
    owner: Arc<str>,
    watched: Arc<Watched>,
}

impl Registered {
    fn new(client: &Weak<Inner>, held: &HeldLock) -> Option<Self> {
        let inner = client.upgrade()?;
        let spare = inner
            .slots
            .len()
            .saturating_sub(inner.config.quorum())
            .try_into()
            .unwrap_or(u32::MAX);
        let watched = Arc::new(Watched {
            state: Arc::downgrade(&held.state),
            gone: AtomicU64::new(0),
            marked: AtomicU64::new(0),
            spare,
            wake: Notify::new(),
        });
        inner
            .holders
            .watched()
            .insert(held.owner.clone(), watched.clone());
        Some(Self {
            holders: inner.holders.clone(),
            owner: held.owner.clone(),
            watched,
        })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.holders.watched().remove(&self.owner);
    }
}

/// Marks the lock watched on every node not marked yet and not gone, each after subscribing
/// this client's channel there.
async fn mark(client: &Weak<Inner>, watched: &Watched, held: &HeldLock) -> Result<HeldCheck> {
    let Some(inner) = client.upgrade() else {
        return Ok(HeldCheck::Stop);
    };
    let settled = watched.gone.load(Ordering::SeqCst) | watched.marked.load(Ordering::SeqCst);
    let timeout = inner.config.command_timeout;
    let holders = &inner.holders;
    let replies = join_all(
        inner
            .slots
            .iter()
            .filter(|slot| settled & (1 << slot.index) == 0)
            .map(|slot| async move {
                let node = slot.get()?;
                holders.subscribe(slot.index, node, timeout).await?;
                let held = node
                    .watch_held(&held.keys, &held.owner, &holders.client, timeout)
                    .await?;
                Ok::<_, LockError>((slot.index, held))
            }),
    )
    .await;
    let mut failures = Vec::new();
    let mut gone = 0u64;
    for reply in replies {
        match reply {
            Ok((index, true)) => {
                watched.marked.fetch_or(1 << index, Ordering::SeqCst);
            }
            Ok((index, false)) => gone |= 1 << index,
            Err(error) => failures.push(error.to_string()),
        }
    }
    if watched.gone(gone) {
        return Ok(HeldCheck::Gone);
    }
    if failures.is_empty() {
        Ok(HeldCheck::Held)
    } else {
        Err(LockError::unavailable_because(
            BACKEND,
            format!(
                "could not watch `{}` on every node ({})",
                held.keys.lock,
                failures.join("; ")
            ),
        ))
    }
}
