//! Deleting a key on the nodes in the background, each node tried again while its connection
//! comes back: a key a node kept because its connection dropped mid-release would otherwise
//! stay until its TTL, and enough such keys on different nodes would block the name.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_redis::LockKeys;
use tokio::time::Instant;

use crate::client::Inner;
use crate::nodes::Slot;

/// The first pause before a node's release is tried again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// One round's key as it is let go, for the answers of its round that come after the round was
/// decided (a late node's `SET` may still be on its way when the key is released).
///
/// A node runs one connection's requests in the order they were sent, and a late answer was
/// sent before the release, so the release normally finds the key that answer set and deletes
/// it. Not always: when the node had to load the acquire script again (it restarted, or never
/// ran it), the `EVALSHA` fails with `NOSCRIPT` and the `SCRIPT LOAD` and `EVALSHA` that follow
/// are new requests, which a release sent meanwhile precedes; and a request waiting for its
/// connection to come back is sent in no set order with the others waiting. Left alone, such a
/// key would stay until its TTL, and on a majority it would block the name for as long.
///
/// So a late answer that set the key is undone exactly where a release of the key ended
/// without deleting it there: whichever of the two comes second sends one more release. A
/// release that deleted the key on a node ran after that node's `SET`, and nothing more is
/// sent (before, every late answer after the release cost every late node a second release).
#[derive(Debug, Default)]
pub(crate) struct LetGo {
    let_go: AtomicBool,
    /// Nodes (a bit per index) whose answer set the key after it was let go.
    taken_late: AtomicU64,
    /// Nodes where a release of the key ended without deleting it: not there (yet), or no
    /// answer.
    missed: AtomicU64,
}

impl LetGo {
    /// The key is let go: from now on a late answer that set it is undone where a release
    /// missed it.
    pub(crate) fn let_go(&self) {
        self.let_go.store(true, Ordering::SeqCst);
    }

    /// A round's answer from node `index` set the key after the round was decided: whether it
    /// must be deleted again now. Only once the key is let go (until then its release is still
    /// to be sent, after this answer), and only where a release already missed it; a node past
    /// the 64 tracked is always undone.
    pub(crate) fn taken_late(&self, index: usize) -> bool {
        if !self.let_go.load(Ordering::SeqCst) {
            return false;
        }
        let Some(bit) = node_bit(index) else {
            return true;
        };
        // Sequentially consistent on both sides: of this and `missed`, at least the second to
        // run sees the other's bit.
        self.taken_late.fetch_or(bit, Ordering::SeqCst);
        self.missed.load(Ordering::SeqCst) & bit != 0
    }

    /// A release of the key on node `index` ended without deleting it: whether a late answer
    /// there set it, so that it must be released again now.
    fn missed(&self, index: usize) -> bool {
        let Some(bit) = node_bit(index) else {
            return false;
        };
        self.missed.fetch_or(bit, Ordering::SeqCst);
        self.taken_late.load(Ordering::SeqCst) & bit != 0
    }
}

fn node_bit(index: usize) -> Option<u64> {
    u32::try_from(index).ok().and_then(|i| 1u64.checked_shl(i))
}

/// What a release of one round's key on a node learnt: `deleted` it or not (`false` also when
/// the node never answered). Where it did not and a late answer set the key there, releases it
/// once more within `budget` (untracked: that release follows the answer, so it finds the key).
pub(crate) fn release_answered(
    budget: Duration,
    slot: &Arc<Slot>,
    (keys, owner): (&Arc<LockKeys>, &Arc<str>),
    let_go: &LetGo,
    deleted: bool,
) {
    if !deleted && let_go.missed(slot.index) {
        let key = (keys.clone(), owner.clone());
        drop(spawn_release(budget, slot.clone(), key, None));
    }
}

/// Releases `owner`'s key on every node, in the background, announcing each deletion (a waiter
/// that lost the agreed node to this attempt wakes on it). Each release rides the node's
/// connection after the `SET` it undoes.
pub(crate) fn release_everywhere(
    inner: &Arc<Inner>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    let_go: &Arc<LetGo>,
) {
    for slot in &inner.slots {
        let key = (keys.clone(), owner.clone());
        release_on(inner, slot.clone(), key, Some(let_go.clone()));
    }
}

/// [`release_everywhere`], then waits, at most `bound`, until the nodes in `set_on` (a bit per
/// node index) have answered: those surely hold the key, and a failed attempt that returned
/// before their deletions would leave this client's next attempt, or another client's, to find
/// them and fail too (the peers' clients also release before they report a failure).
///
/// # Cancel safety
/// Cancel safe: the releases run in the background; dropping this only stops the wait.
pub(crate) async fn release_everywhere_waiting(
    inner: &Arc<Inner>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    let_go: &Arc<LetGo>,
    (set_on, bound): (u64, Duration),
) {
    let mut finished = Vec::new();
    for slot in &inner.slots {
        let key = (keys.clone(), owner.clone());
        let budget = inner.config.command_timeout;
        let done = spawn_release(budget, slot.clone(), key, Some(let_go.clone()));
        if slot.index < 64 && set_on & (1 << slot.index) != 0 {
            finished.push(done);
        }
    }
    // A release's task drops its sender when it ends, answered or given up.
    let _ = tokio::time::timeout(bound, futures::future::join_all(finished)).await;
}

/// Releases `owner`'s key on one node, in the background, and tries again until the node
/// answers or the client's command timeout has passed since the first try (so
/// [`settle`](dlock_api::settle) stays bounded by it). A node that stays silent longer keeps the
/// key until its TTL. With the round's [`LetGo`], what it learnt is told to it
/// ([`release_answered`]).
pub(crate) fn release_on(
    inner: &Inner,
    slot: Arc<Slot>,
    key: (Arc<LockKeys>, Arc<str>),
    let_go: Option<Arc<LetGo>>,
) {
    drop(spawn_release(
        inner.config.command_timeout,
        slot,
        key,
        let_go,
    ));
}

/// [`release_on`] within `budget`, returning a receiver that ends (its sender dropped) once the
/// release is over.
fn spawn_release(
    budget: Duration,
    slot: Arc<Slot>,
    (keys, owner): (Arc<LockKeys>, Arc<str>),
    let_go: Option<Arc<LetGo>>,
) -> tokio::sync::oneshot::Receiver<()> {
    let (over, finished) = tokio::sync::oneshot::channel::<()>();
    dlock_api::raw::spawn_cleanup(async move {
        let _over = over;
        let answered = |deleted: bool| {
            if let Some(let_go) = &let_go {
                release_answered(budget, &slot, (&keys, &owner), let_go, deleted);
            }
        };
        let until = after(Instant::now(), budget);
        let mut pause = FIRST_PAUSE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let failed = match slot.get() {
                Ok(node) => match node.release(&keys, &owner, left).await {
                    Ok(deleted) => return answered(deleted),
                    Err(error) => error,
                },
                Err(error) => error,
            };
            if until.saturating_duration_since(Instant::now()) <= pause {
                tracing::debug!(node = %slot.addr(), key = %keys.lock, error = %failed, "redlock: a node missed a release; its key ends with its TTL");
                return answered(false);
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2).min(MAX_PAUSE);
        }
    });
    finished
}

#[cfg(test)]
mod tests {
    use super::LetGo;

    #[test]
    fn a_late_grant_before_the_key_is_let_go_is_left_to_the_release() {
        let let_go = LetGo::default();
        assert!(
            !let_go.taken_late(1),
            "its release is still to come, after it"
        );
        let_go.let_go();
        assert!(
            !let_go.missed(1),
            "the late grant came before the key was let go"
        );
    }

    #[test]
    fn a_late_grant_and_a_missed_release_meet_whichever_comes_second() {
        let first = LetGo::default();
        first.let_go();
        assert!(!first.taken_late(2), "no release has missed yet");
        assert!(first.missed(2), "the release missed the key set there");

        let second = LetGo::default();
        second.let_go();
        assert!(!second.missed(3), "no late grant there yet");
        assert!(second.taken_late(3), "the release already missed it");
    }

    #[test]
    fn nodes_are_told_apart_and_a_node_past_the_tracked_is_always_undone() {
        let let_go = LetGo::default();
        let_go.let_go();
        assert!(!let_go.missed(0));
        assert!(
            !let_go.taken_late(1),
            "another node's miss is not this one's"
        );
        assert!(let_go.taken_late(64), "not tracked: undone");
        assert!(!let_go.missed(64));
    }
}
