//! The waiting line on the agreed node: it orders a name's waiters, across clients, so that one
//! release wakes one waiter that goes straight to every node.
//!
//! Waiters woken together by a release take the agreed node first, so that they do not split the
//! nodes among them; that costs one round trip. The line lets the first waiter skip it: a waiter
//! checks its place (joining at the end the first time) after each round it lost, and if it is
//! first, its next round goes to every node at once. The others, once woken, wait about a round
//! trip (their last round's time, twice, at most `retry_delay`) and then take the agreed node
//! first: the first in line normally has it by then, and they stop there. Had they raced it, one
//! of them could take the agreed node while some of the other nodes' releases had not landed yet
//! when the first in line reached them, leaving nobody a quorum (a split vote). The line is only
//! an order: it grants nothing, and safety never rests on it. A stale view (a waiter that was
//! first and has not heard otherwise) costs at worst a split vote, retried after a random delay
//! as before.
//!
//! The first waiter leaves the line as it sends its round, so the waiters that lose that round
//! find the next one first when they check, one round trip later. A place is kept for as long as
//! its waiter may wait before its next round plus a margin; a waiter that vanished without leaving
//! (a killed process) lapses then, and the waiters behind it go back to taking the agreed node
//! first until it does.

use std::sync::Arc;
use std::time::Duration;

use dlock_redis::LockKeys;
use tokio::time::Instant;

use crate::client::Inner;

/// How much longer than its next expected round a waiter's place is kept.
const PRESENCE_MARGIN: Duration = Duration::from_secs(2);

/// One waiter's place in the line.
pub(crate) struct Line {
    inner: Arc<Inner>,
    keys: Arc<LockKeys>,
    /// This waiter's entry (random, one per acquire).
    waiter: String,
    /// The node the line was last checked on, where leaving goes; `None` when not in line.
    node: Option<usize>,
    /// Whether the last check found this waiter first.
    first: bool,
}

impl Line {
    pub(crate) fn new(inner: Arc<Inner>, keys: Arc<LockKeys>) -> Self {
        Self {
            inner,
            keys,
            waiter: dlock_api::raw::random_owner(),
            node: None,
            first: false,
        }
    }

    /// Whether this waiter was first in line when it last checked.
    pub(crate) fn first(&self) -> bool {
        self.first
    }

    /// Joins the line on the agreed node (the lowest-numbered node this client reaches), or
    /// keeps this waiter's place there until its next round, at `next_round`, plus a margin, and learns whether it is
    /// first. A node that does not answer within `timeout` counts as not first.
    ///
    /// # Cancel safety
    /// Cancel safe: a place taken by a dropped call is left when this `Line` drops.
    pub(crate) async fn check(&mut self, next_round: Instant, timeout: Duration) {
        self.first = false;
        let inner = self.inner.clone();
        let Some((index, node)) = inner
            .slots
            .iter()
            .find_map(|slot| slot.get().ok().map(|node| (slot.index, node)))
        else {
            return;
        };
        if self.node.is_some_and(|old| old != index) {
            self.leave();
        }
        self.node = Some(index);
        let presence = next_round
            .saturating_duration_since(Instant::now())
            .saturating_add(PRESENCE_MARGIN);
        self.first = matches!(
            node.line_check(&self.keys, &self.waiter, presence, timeout)
                .await,
            Ok(true)
        );
    }

    /// Leaves the line: sent at once, answered in the background.
    pub(crate) fn leave(&mut self) {
        self.first = false;
        let Some(index) = self.node.take() else {
            return;
        };
        let slot = self.inner.slots[index].clone();
        let (keys, waiter) = (self.keys.clone(), self.waiter.clone());
        let timeout = self.inner.config.command_timeout;
        dlock_api::raw::spawn_cleanup(async move {
            let Ok(node) = slot.get() else { return };
            if let Err(error) = node.line_leave(&keys, &waiter, timeout).await {
                tracing::debug!(node = %slot.addr(), key = %keys.queue, %error, "redlock: leaving the waiting line failed; the place lapses");
            }
        });
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        self.leave();
    }
}
