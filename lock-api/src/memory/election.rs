//! The memory backend's elections: the leader is the hold that published last while it lasts;
//! observers wake on the store's change signal, or when the leader's lease runs out.

use std::sync::Arc;

use futures::StreamExt;
use tokio::time::{Instant, sleep_until};

use super::store::Store;
use crate::election::{Leader, LeaderEvent, LeaderStream};
use crate::name::LockName;
use crate::token::FencingToken;

pub(super) fn leader(store: &Store, name: &LockName) -> Option<Leader> {
    store
        .leader(name)
        .map(|(term, value, _)| Leader::new(FencingToken::new(term), value))
}

/// Every change of `name`'s leader, from the current one. The engine drops repeats, so this
/// reports the state after every wake-up.
pub(super) fn observe(store: Arc<Store>, name: LockName) -> LeaderStream {
    let changes = store.changes();
    futures::stream::unfold(
        (store, name, changes, true),
        |(store, name, mut changes, first)| async move {
            if !first {
                // Woken by a change anywhere in the store, or when the leader's lease ends
                // (expiry is noticed when the store is next read).
                let until: Option<Instant> = store.leader(&name).map(|(_, _, until)| until);
                match until {
                    Some(until) => tokio::select! {
                        _ = changes.changed() => {}
                        () = sleep_until(until) => {}
                    },
                    None => {
                        let _ = changes.changed().await;
                    }
                }
            }
            changes.mark_unchanged();
            let event = match leader(&store, &name) {
                Some(leader) => LeaderEvent::Leads(leader),
                None => LeaderEvent::Vacant,
            };
            Some((Ok(event), (store, name, changes, false)))
        },
    )
    .boxed()
}
