//! `EtcdLease`: one held key. Release deletes it guarded by its create revision; a holder
//! watches its own key, whose deletion means the lock is lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, RawLease, RenewedBy, Scheduled};
use dlock_api::{LockError, LockName, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::{Inner, lease_gone};
use crate::connection::{Conn, Running};
use crate::keys::KeyClaim;
use crate::own_key::{Carrier, OwnKey, check_held_keys, current, watch_own_key};
use crate::session::{SessionLease, ttl_class, validity};

/// The lease a key rides on.
#[derive(Debug)]
pub(crate) enum LeaseKind {
    /// The client's kept-alive lease of the TTL class.
    Session(Arc<SessionLease>),
    /// A lease of the acquire's own, which nobody keeps alive (`Renewal::Off`).
    Own {
        id: Mutex<i64>,
        ttl: i64,
        valid_until: Mutex<Instant>,
    },
}

impl LeaseKind {
    pub(crate) fn own(id: i64, ttl: i64, valid_until: Instant) -> Self {
        Self::Own {
            id: Mutex::new(id),
            ttl,
            valid_until: Mutex::new(valid_until),
        }
    }

    pub(crate) fn id(&self) -> i64 {
        match self {
            Self::Session(lease) => lease.id,
            Self::Own { id, .. } => *id.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    pub(crate) fn own_id(&self) -> Option<i64> {
        matches!(self, Self::Own { .. }).then(|| self.id())
    }

    pub(crate) fn session(&self) -> Option<&Arc<SessionLease>> {
        match self {
            Self::Session(lease) => Some(lease),
            Self::Own { .. } => None,
        }
    }

    /// The instant the lease ends unless renewed, by this client's clock.
    pub(crate) fn valid_until(&self) -> Instant {
        match self {
            Self::Session(lease) => lease.valid_until(),
            Self::Own { valid_until, .. } => *valid_until.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// For an own lease: when it ends, and how often a waiter renews it.
    pub(crate) fn own_timing(&self) -> Option<(Instant, Duration)> {
        match self {
            Self::Own {
                ttl, valid_until, ..
            } => Some((
                *valid_until.lock().unwrap_or_else(|e| e.into_inner()),
                Duration::from_secs(ttl.unsigned_abs())
                    .checked_div(3)
                    .unwrap_or_default(),
            )),
            Self::Session(_) => None,
        }
    }

    /// Renews an own lease once (a waiter keeps its key alive while it queues).
    pub(crate) async fn renew_own(&self, inner: &Inner) -> Result<()> {
        let Self::Own {
            id,
            ttl,
            valid_until,
        } = self
        else {
            return Ok(());
        };
        let lease = *id.lock().unwrap_or_else(|e| e.into_inner());
        let sent = Instant::now();
        let mut leases = inner.client().await?.lease_client();
        let timeout = inner.config.command_timeout;
        match tokio::time::timeout(timeout, leases.keep_alive(lease)).await {
            // The server renews to the granted TTL, which is at least the one asked for.
            Ok(Ok(_)) => {
                *valid_until.lock().unwrap_or_else(|e| e.into_inner()) = validity(sent, *ttl);
                Ok(())
            }
            Ok(Err(e)) => Err(crate::error::map_err(e)),
            Err(_) => Err(crate::error::timed_out(timeout)),
        }
    }
}

/// How long after its grant a held key gets its watch. A lock released sooner (most are) costs
/// no watch on the stream and no task. The watch starts from the grant's revision, so a deletion
/// meanwhile is still delivered, at most this much later than with a watch from the start.
pub(crate) const WATCH_HELD_AFTER: Duration = Duration::from_millis(250);

/// A held key.
#[derive(Debug)]
pub(crate) struct EtcdLease {
    inner: Arc<Inner>,
    name: LockName,
    key: String,
    /// The key's claim: the key is named again only once this lease is done with it.
    claim: Arc<KeyClaim>,
    revision: i64,
    kind: LeaseKind,
    /// For a key on a kept-alive lease: that lease, which `extend` may change.
    carrier: Option<Carrier>,
    /// One move between leases at a time, so the guard is attached to exactly one.
    moving: tokio::sync::Mutex<()>,
    state: Arc<LeaseState>,
    released: AtomicBool,
    /// How many may hold the name: 1 for a lock (and a campaign), which alone may proclaim.
    limit: u32,
    /// A leader record was put for this key, or the key led with its campaign value from its
    /// grant: a record goes with the key's release, and moves with it to another lease.
    proclaimed: AtomicBool,
    /// The campaign value the key carried when granted, which it leads with at its own term:
    /// the campaign's first proclaim of it needs no write.
    led_with: dlock_api::raw::RecordAtGrant,
    /// The watch's start, until it comes due (dropped with the lease).
    _watch: Option<Scheduled>,
    /// The runtime the watch on the key runs on, once started.
    watching: Running,
    /// Fired by the client's periodic check of held keys when it found this one changed.
    recheck: Arc<tokio::sync::Notify>,
}

impl EtcdLease {
    /// The lease, state and renewal of a key just granted; schedules the watch on the key.
    pub(crate) fn start(
        inner: Arc<Inner>,
        name: &LockName,
        kind: LeaseKind,
        claim: Arc<KeyClaim>,
        (revision, limit): (i64, u32),
    ) -> (Arc<Self>, Arc<LeaseState>, RenewedBy) {
        let key = claim.key().to_owned();
        let (state, renewed_by) = match &kind {
            LeaseKind::Session(lease) => (lease.new_guard_state(), RenewedBy::Session),
            LeaseKind::Own { .. } => (
                Arc::new(LeaseState::new(kind.own_timing().map(|(until, _)| until))),
                RenewedBy::Nobody,
            ),
        };
        let carrier: Option<Carrier> = kind.session().map(|l| Arc::new(Mutex::new(l.clone())));
        let lease = Arc::new_cyclic(|weak: &Weak<Self>| {
            let weak = weak.clone();
            let watch = move || {
                if let Some(lease) = weak.upgrade() {
                    lease.watch_on(&lease.inner.connection());
                }
            };
            let scheduled = inner
                .timer
                .schedule(after(Instant::now(), WATCH_HELD_AFTER), watch);
            Self {
                inner,
                name: name.clone(),
                key,
                claim,
                revision,
                kind,
                carrier,
                moving: tokio::sync::Mutex::new(()),
                state: state.clone(),
                released: AtomicBool::new(false),
                limit,
                proclaimed: AtomicBool::new(false),
                led_with: dlock_api::raw::RecordAtGrant::default(),
                _watch: scheduled,
                watching: Running::default(),
                recheck: Arc::default(),
            }
        });
        lease.inner.held.insert(&lease);
        (lease, state, renewed_by)
    }

    /// Starts the watch on the key on `conn`'s runtime, unless it runs on one that has not
    /// stopped, or the guard is done.
    fn watch_on(&self, conn: &Conn) {
        if self.state.is_closed() {
            return;
        }
        self.watching.ensure(conn, || {
            let watch = self
                .inner
                .watcher
                .watch(&self.key, self.revision.saturating_add(1));
            let own = OwnKey {
                inner: self.inner.clone(),
                state: self.state.clone(),
                carrier: self.carrier.clone(),
                key: self.key.clone(),
                revision: self.revision,
                recheck: self.recheck.clone(),
            };
            watch_own_key(own, watch)
        });
        let inner = Arc::downgrade(&self.inner);
        self.inner
            .held
            .check_on(conn, move || check_held_keys(inner));
    }

    /// The key was granted carrying the campaign value `value`: it leads with it already, so
    /// the lease is a leader's (its release clears any record too) and a first proclaim of the
    /// same value at its term is done.
    pub(crate) fn led_at_grant(&self, value: Arc<[u8]>) {
        self.proclaimed.store(true, Ordering::SeqCst);
        self.led_with.wrote(self.revision.unsigned_abs(), value);
    }

    fn not_held(&self) -> LockError {
        LockError::NotHeld {
            name: self.name.to_string(),
        }
    }

    /// Moves the key onto lease `to` if it is still ours; the create revision (the fence and
    /// the queue place) stays. The leader record this key put moves with it.
    async fn move_key(&self, to: i64) -> Result<bool> {
        let txn = if_still_ours(&self.key, self.revision, self.moves_to(to));
        Ok(self.inner.txn(txn).await?.succeeded())
    }

    /// What moves the key onto lease `to`: the key, and the name's leader record if the key is
    /// a leader's (a record there that an earlier term left moves too, still ignored, and goes
    /// with this key's release).
    fn moves_to(&self, to: i64) -> Vec<TxnOp> {
        let mut ops = vec![move_to_lease(&self.key, to)];
        if self.proclaimed.load(Ordering::SeqCst) {
            ops.push(move_record(&crate::election::record_of(&self.key), to));
        }
        ops
    }

    /// The lease the key rides now.
    fn lease_id(&self) -> i64 {
        match &self.carrier {
            Some(carrier) => current(carrier).id,
            None => self.kind.id(),
        }
    }

    /// `extend` on a kept-alive lease: the key moves to the kept-alive lease of `ttl`'s class
    /// if it is on another one, then that lease is renewed now.
    async fn extend_session(&self, carrier: &Carrier, ttl: Duration) -> Result<Instant> {
        let timeout = self.inner.config.command_timeout;
        let from = current(carrier);
        let (lease, moved) = if ttl_class(ttl) == from.class {
            (from, false)
        } else {
            (self.move_to_class(carrier, ttl).await?, true)
        };
        // A successful move has just shown the key is ours; otherwise check it with the renewal.
        let check = async {
            match moved {
                true => Ok(true),
                false => self.move_key_check().await,
            }
        };
        let client = self.inner.client().await?;
        let (renewed, still) = tokio::join!(lease.keep_alive_once(&client, timeout), check);
        if !still? {
            return Err(self.not_held());
        }
        renewed.map_err(|e| match e {
            LockError::Lost { reason, .. } => LockError::Lost {
                name: self.name.to_string(),
                reason,
            },
            e => e,
        })
    }

    /// Moves the key onto the client's kept-alive lease of `ttl`'s class, guarded by the create
    /// revision, and makes that lease carry the guard. A lease the server no longer knows is
    /// replaced once.
    async fn move_to_class(&self, carrier: &Carrier, ttl: Duration) -> Result<Arc<SessionLease>> {
        let _one_move = self.moving.lock().await;
        let from = current(carrier);
        if ttl_class(ttl) == from.class {
            // A concurrent extend moved it here already.
            return Ok(from);
        }
        let mut tries: u32 = 0;
        loop {
            let to = self.inner.session_lease(ttl).await?;
            // An answer that never came leaves the guard on the old lease: both are this
            // client's, and if the one that really carries the key ends, the key's watch (or the
            // fallback re-read) tells the guard.
            match self.move_key(to.id).await {
                Ok(true) => {
                    to.attach(&self.state);
                    from.detach(&self.state);
                    *carrier.lock().unwrap_or_else(|e| e.into_inner()) = to.clone();
                    return Ok(to);
                }
                Ok(false) => return Err(self.not_held()),
                Err(e) if tries == 0 && lease_gone(&e) => {
                    self.inner.drop_session(&to);
                    tries = tries.saturating_add(1);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[dlock_api::raw::async_trait]
impl RawLease for EtcdLease {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        self.state.close();
        // A leader's record goes in the same revision as its key: observers see one change.
        let also = match self.proclaimed.load(Ordering::SeqCst) {
            true => vec![TxnOp::delete(crate::election::record_of(&self.key), None)],
            false => Vec::new(),
        };
        let deleted = self
            .inner
            .delete_key_and(&self.key, Some(self.revision), also)
            .await;
        if deleted.is_err() {
            // The key may still be there, until its lease ends.
            self.claim.burn();
        }
        if let Some(id) = self.kind.own_id() {
            self.inner.revoke_in_background(id);
        }
        match deleted? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        match &self.kind {
            // A kept-alive lease: renew it now (its TTL is the class's), after moving the key
            // onto the lease of `ttl`'s class if it is another.
            LeaseKind::Session(_) => match &self.carrier {
                Some(carrier) => self.extend_session(carrier, ttl).await,
                None => Err(LockError::unexpected(
                    BACKEND,
                    "a session key without its lease",
                )),
            },
            // A lease of its own: move the key onto a new lease of `ttl`, guarded by the create
            // revision, and let the old one go.
            LeaseKind::Own {
                id, valid_until, ..
            } => {
                let _one_move = self.moving.lock().await;
                let (new_id, _granted, until) = self.inner.grant_lease(ttl_class(ttl)).await?;
                if !self.move_key(new_id).await.inspect_err(|_| {
                    self.inner.revoke_in_background(new_id);
                })? {
                    self.inner.revoke_in_background(new_id);
                    return Err(self.not_held());
                }
                let old =
                    std::mem::replace(&mut *id.lock().unwrap_or_else(|e| e.into_inner()), new_id);
                *valid_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
                self.inner.revoke_in_background(old);
                Ok(until)
            }
        }
    }

    /// Puts the leader record `term:value` beside the name's queue, on the key's lease, if the
    /// key is still ours (one transaction comparing its create revision): a key that exists
    /// after its grant is the name's oldest, so it still holds. The record goes with the lease.
    /// The campaign's own first proclaim, of the value its key carried, writes nothing: the key
    /// has named that value at this term since it became the oldest.
    async fn proclaim(&self, term: dlock_api::FencingToken, value: &[u8]) -> Result<()> {
        if self.limit != 1 {
            return Err(LockError::Unsupported {
                backend: BACKEND,
                operation: "elections on a semaphore's permit",
            });
        }
        if i64::try_from(term.get()).ok() != Some(self.revision) {
            return Err(self.not_held());
        }
        if self.led_with.answers(term, value) {
            return Ok(());
        }
        // No move between leases meanwhile: the record rides the lease the key rides.
        let _one_move = self.moving.lock().await;
        let record = crate::election::record_of(&self.key);
        let put = TxnOp::put(
            record,
            crate::election::encode(self.revision, value),
            Some(PutOptions::new().with_lease(self.lease_id())),
        );
        // Set before the request: a put whose answer is lost may have landed.
        self.proclaimed.store(true, Ordering::SeqCst);
        let txn = if_still_ours(&self.key, self.revision, vec![put]);
        match self.inner.txn(txn).await?.succeeded() {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }
}

impl EtcdLease {
    /// Whether the key is still ours (a guarded no-op transaction).
    async fn move_key_check(&self) -> Result<bool> {
        let txn = if_still_ours(&self.key, self.revision, Vec::new());
        Ok(self.inner.txn(txn).await?.succeeded())
    }
}

/// A transaction that runs `ops` if `key` still has the create revision `revision`: if it is
/// still the one this client created.
fn if_still_ours(key: &str, revision: i64, ops: Vec<TxnOp>) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then(ops)
}

/// Puts the leader record `record` on lease `lease` if it exists, keeping its value (a nested
/// transaction: a put that ignores the value fails on a key that is not there).
fn move_record(record: &str, lease: i64) -> TxnOp {
    TxnOp::txn(
        Txn::new()
            .when([Compare::create_revision(record, CompareOp::Greater, 0)])
            .and_then([move_to_lease(record, lease)]),
    )
}

/// Puts `key` on lease `lease`, keeping its value and its create revision (the fence and the
/// queue place).
fn move_to_lease(key: &str, lease: i64) -> TxnOp {
    TxnOp::put(
        key,
        "",
        Some(PutOptions::new().with_lease(lease).with_ignore_value()),
    )
}

impl Drop for EtcdLease {
    /// A guard forgotten (`LockGuard::forget`) rather than released: the lock must still end
    /// within its TTL, so a key on the kept-alive lease moves onto a lease of the same TTL that
    /// nobody renews. A key on its own lease simply expires with it.
    fn drop(&mut self) {
        self.inner.held.remove(self);
        self.state.close();
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        // The key stays until its TTL ends.
        self.claim.burn();
        let Some(carrier) = &self.carrier else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (inner, key, revision, class) = (
            self.inner.clone(),
            self.key.clone(),
            self.revision,
            current(carrier).class,
        );
        let record = self
            .proclaimed
            .load(Ordering::SeqCst)
            .then(|| crate::election::record_of(&key));
        handle.spawn(async move {
            let moved = async {
                let (id, _, _) = inner.grant_lease(class).await?;
                let mut ops = vec![move_to_lease(&key, id)];
                ops.extend(record.map(|record| move_record(&record, id)));
                let txn = if_still_ours(&key, revision, ops);
                inner.txn(txn).await
            };
            if moved.await.is_err() {
                // Could not move it: delete it when its TTL would have ended.
                tokio::time::sleep(Duration::from_secs(class.unsigned_abs())).await;
                let _ = inner.delete_key(&key, Some(revision)).await;
            }
        });
    }
}

impl crate::held::Rewatch for EtcdLease {
    fn rewatch_on(&self, conn: &Conn) {
        self.watch_on(conn);
    }

    fn watched_key(&self) -> Option<(String, i64)> {
        let holding = !self.state.is_closed() && self.state.lost_reason().is_none();
        holding.then(|| (self.key.clone(), self.revision))
    }

    fn recheck(&self) {
        self.recheck.notify_one();
    }
}
