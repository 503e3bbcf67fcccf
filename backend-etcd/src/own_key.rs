//! A holder's watch on its own key, and the client's periodic check of every held key.
//!
//! A held key goes when its lease ends or someone deletes it, and its guard must then be told
//! lost. The key's watch says so at once. Because etcd 3.4 (before 3.4.31) can lose a deletion
//! event after a compaction, the keys are also read again every [`FALLBACK_REREAD`]: one
//! transaction of compares per [`KEYS_PER_CHECK`] held keys for the whole client, rather than a
//! read and a timer per key, so that holding 10,000 locks costs the server a few requests per
//! period instead of 10,000. A key the check finds changed is looked at by its own guard, which
//! reads it and decides, as on a watch that could not go on.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::LostReason;
use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, SessionStatus};
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

use crate::client::{FALLBACK_REREAD, Inner};
use crate::held::Rewatch;
use crate::session::SessionLease;
use crate::watch::{WatchEvent, WatchHandle};

/// How many held keys one check transaction compares: below etcd's default limit of 128
/// operations per transaction (`--max-txn-ops`), for the compares and for the reads that answer
/// a failed one.
const KEYS_PER_CHECK: usize = 64;

/// The kept-alive lease a key rides now: `extend` to another TTL class moves the key.
pub(crate) type Carrier = Arc<Mutex<Arc<SessionLease>>>;

pub(crate) fn current(carrier: &Carrier) -> Arc<SessionLease> {
    carrier.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// One held key's watch: what it needs to decide that its guard is lost.
pub(crate) struct OwnKey {
    pub(crate) inner: Arc<Inner>,
    pub(crate) state: Arc<LeaseState>,
    pub(crate) carrier: Option<Carrier>,
    pub(crate) key: String,
    pub(crate) revision: i64,
    /// Fired by the client's periodic check when it found the key changed.
    pub(crate) recheck: Arc<Notify>,
}

/// Marks the guard lost when its key goes (its lease ended, or someone deleted it). A watch
/// that cannot go on, or the client's periodic check, makes it read the key: a holder that
/// believed itself holding after its key went would break exclusion.
pub(crate) async fn watch_own_key(own: OwnKey, mut watch: WatchHandle) {
    let OwnKey {
        inner,
        state,
        carrier,
        key,
        revision,
        recheck,
    } = own;
    let inner = Arc::downgrade(&inner);
    loop {
        let event = tokio::select! {
            biased;
            _ = state.closed() => return,
            _ = state.lost_token().cancelled() => return,
            event = watch.next() => Some(event),
            () = recheck.notified() => None,
        };
        if state.is_closed() {
            // Released (the deletion is our own) or forgotten.
            return;
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Some(WatchEvent::Deleted { .. }) = event {
            key_gone(&inner, &state, carrier.as_ref().map(current)).await;
            return;
        }
        let key_now = key.clone();
        let read = inner
            .idempotent(|mut client| {
                let key = key_now.clone();
                async move { client.get(key, None).await }
            })
            .await;
        let rewatch = event == Some(WatchEvent::Reread);
        match read {
            Ok(response) => {
                let mine = response
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == revision);
                if !mine {
                    key_gone(&inner, &state, carrier.as_ref().map(current)).await;
                    return;
                }
                if rewatch {
                    let seen = response.header().map_or(revision, |h| h.revision());
                    watch = inner.watcher.watch(&key, seen.saturating_add(1));
                }
            }
            // The periodic check tries again; a watch that ended is re-created from our
            // revision, so whatever it missed meanwhile is still delivered (or answered
            // "compacted").
            Err(_) if rewatch => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                watch = inner.watcher.watch(&key, revision.saturating_add(1));
            }
            Err(_) => {}
        }
    }
}

/// Our key is gone: marks the guard lost, saying why (the lease ended, or only the key went).
async fn key_gone(inner: &Inner, state: &LeaseState, session: Option<Arc<SessionLease>>) {
    if let Some(session) = &session {
        let id = session.id;
        let alive = inner
            .idempotent(|client| async move { client.lease_client().time_to_live(id, None).await })
            .await
            .map(|r| r.ttl() > 0);
        if matches!(alive, Ok(false)) {
            session.end(LostReason::SessionExpired);
        }
    }
    if state.is_closed() {
        return;
    }
    let reason = match session.as_ref().map(|s| s.session.status()) {
        Some(SessionStatus::Ended(reason)) => reason,
        Some(_) => LostReason::TakenOver,
        None if state.valid_until().is_some_and(|u| Instant::now() >= u) => LostReason::Expired,
        None => LostReason::TakenOver,
    };
    state.mark_lost(reason);
}

/// The client's periodic check of every held key (see the module's docs), on the runtime of the
/// connection it was started for; it ends with the client.
pub(crate) async fn check_held_keys(inner: Weak<Inner>) {
    let mut period =
        tokio::time::interval_at(after(Instant::now(), FALLBACK_REREAD), FALLBACK_REREAD);
    // A check slower than the period (a cut-off member) should not be followed by a burst.
    period.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        period.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let held = inner.held.all();
        for batch in held.chunks(KEYS_PER_CHECK) {
            let keys: Vec<(&Arc<dyn Rewatch>, String, i64)> = batch
                .iter()
                .filter_map(|held| {
                    held.watched_key()
                        .map(|(key, revision)| (held, key, revision))
                })
                .collect();
            if keys.is_empty() {
                continue;
            }
            let txn = Txn::new()
                .when(
                    keys.iter()
                        .map(|(_, key, revision)| {
                            Compare::create_revision(key.as_str(), CompareOp::Equal, *revision)
                        })
                        .collect::<Vec<_>>(),
                )
                .or_else(
                    keys.iter()
                        .map(|(_, key, _)| TxnOp::get(key.as_str(), None))
                        .collect::<Vec<_>>(),
                );
            // An unanswered check is tried again next period; the watches go on meanwhile.
            let Ok(response) = inner.txn(txn).await else {
                break;
            };
            if response.succeeded() {
                continue;
            }
            for ((held, _, revision), read) in keys.iter().zip(response.op_responses()) {
                let mine = match read {
                    TxnOpResponse::Get(get) => get
                        .kvs()
                        .first()
                        .is_some_and(|kv| kv.create_revision() == *revision),
                    _ => true,
                };
                if !mine {
                    held.recheck();
                }
            }
        }
    }
}
