//! Deleting a key on the nodes in the background, each node tried again while its connection
//! comes back: a key a node kept because its connection dropped mid-release would otherwise
//! stay until its TTL, and enough such keys on different nodes would block the name.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_redis::LockKeys;
use tokio::time::Instant;

use crate::client::Inner;
use crate::nodes::Slot;

/// The first pause before a node's release is tried again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Releases `owner`'s key on every node, in the background, announcing each deletion (a waiter
/// that lost the agreed node to this attempt wakes on it). Each release rides the node's
/// connection after the `SET` it undoes.
pub(crate) fn release_everywhere(inner: &Arc<Inner>, keys: Arc<LockKeys>, owner: Arc<str>) {
    for slot in &inner.slots {
        release_on(inner, slot.clone(), keys.clone(), owner.clone());
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
    set_on: u64,
    bound: Duration,
) {
    let mut finished = Vec::new();
    for slot in &inner.slots {
        let done = spawn_release(inner, slot.clone(), keys.clone(), owner.clone());
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
/// key until its TTL.
pub(crate) fn release_on(inner: &Inner, slot: Arc<Slot>, keys: Arc<LockKeys>, owner: Arc<str>) {
    drop(spawn_release(inner, slot, keys, owner));
}

/// [`release_on`], returning a receiver that ends (its sender dropped) once the release is over.
fn spawn_release(
    inner: &Inner,
    slot: Arc<Slot>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
) -> tokio::sync::oneshot::Receiver<()> {
    let budget = inner.config.command_timeout;
    let (over, finished) = tokio::sync::oneshot::channel::<()>();
    dlock_api::raw::spawn_cleanup(async move {
        let _over = over;
        let until = after(Instant::now(), budget);
        let mut pause = FIRST_PAUSE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let failed = match slot.get() {
                Ok(node) => match node.release(&keys, &owner, left).await {
                    Ok(_) => return,
                    Err(error) => error,
                },
                Err(error) => error,
            };
            if until.saturating_duration_since(Instant::now()) <= pause {
                tracing::debug!(node = %slot.addr(), key = %keys.lock, error = %failed, "redlock: a node missed a release; its key ends with its TTL");
                return;
            }
            tokio::time::sleep(pause).await;
            pause = pause.saturating_mul(2).min(MAX_PAUSE);
        }
    });
    finished
}
