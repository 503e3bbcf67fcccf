//! One request to every node at once, decided as soon as enough nodes answered; the requests
//! still out then finish in the background.
//!
//! They must not simply be dropped: redis-rs never sends a request whose caller is gone, so a
//! node would miss a grant's `SET` (its key on fewer nodes than it should be) or a release's
//! delete (a key left until its TTL).

use std::future::Future;
use std::sync::Arc;

use dlock_api::Result;
use futures::stream::{FuturesUnordered, StreamExt};

use crate::nodes::Slot;

/// Sends `request` to every slot at once and hands each answer to `decide` as it comes, until
/// `decide` returns `true` (or every node answered); the answers that come after are handed to
/// `late`, in the background.
///
/// # Cancel safety
/// Not cancel safe: a dropped call drops the requests not yet sent with it. Callers that must
/// reach every node arm their own undo (a round's `PendingAcquire`).
pub(crate) async fn until_decided<T, Fut>(
    slots: &[Arc<Slot>],
    request: impl Fn(&Arc<Slot>) -> Fut,
    mut decide: impl FnMut(&Arc<Slot>, Result<T>) -> bool,
    mut late: impl FnMut(&Arc<Slot>, Result<T>) + Send + 'static,
) where
    T: Send + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut replies: FuturesUnordered<_> = slots
        .iter()
        .map(|slot| {
            let (slot, reply) = (slot.clone(), request(slot));
            async move { (slot, reply.await) }
        })
        .collect();
    while let Some((slot, reply)) = replies.next().await {
        if decide(&slot, reply) {
            break;
        }
    }
    if !replies.is_empty() {
        dlock_api::raw::spawn_cleanup(async move {
            while let Some((slot, reply)) = replies.next().await {
                late(&slot, reply);
            }
        });
    }
}
