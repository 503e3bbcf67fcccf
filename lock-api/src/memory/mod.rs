//! The in-process backend.

mod election;
mod store;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep_until};

use self::store::{Attempt, Store};
use crate::capabilities::{Capabilities, Fencing};
use crate::error::{LockError, Result};
use crate::inspect::Inspection;
use crate::name::LockName;
use crate::options::LockOptions;
use crate::raw::time::after;
use crate::raw::{
    Claim, Grant, GuardTimer, Holdings, LeaseState, PendingAcquire, RawLease, RawLock, RenewedBy,
    Session,
};
use crate::token::FencingToken;

const BACKEND: &str = "memory";

/// Locks shared by the tasks of one process: the reference backend, and the one to swap in when
/// testing code that uses dlock.
///
/// It keeps the whole contract within the process: TTL expiry, renewal, strictly increasing
/// fencing tokens (one counter for the whole process, so they keep rising across stores and
/// reconnects), FIFO waiters woken on release, the lost signal, cancel safety. A freed lock
/// is held at once for the first waiter, for the lease it asked for, dated from then: a waiter
/// whose task is not polled when its turn comes (a stalled task holding a pending acquire) holds
/// the queue up for that lease at most, then queues again at the back. Time is tokio's,
/// so tests under `#[tokio::test(start_paused = true)]` see TTLs pass instantly.
///
/// [`inspect`](crate::DistributedLock::inspect) reports everything: holder (`hold N`), token,
/// remaining lease and the number of queued waiters.
///
/// Clients of one *store* see each other's locks: [`MemoryLock::new`] makes a new store,
/// [`client`](Self::client) another client of the same store, and [`MemoryLock::shared`] (what
/// `dlock::connect("memory://NAME")` uses) the process-wide store of that name.
///
/// # Examples
/// ```
/// # async fn demo() -> dlock_api::Result<()> {
/// use dlock_api::{DistributedLock, DistributedLockExt, LockOptions, MemoryLock};
/// let locks = MemoryLock::new();
/// let guard = locks.acquire_str("coupon:1", &LockOptions::new()).await?;
/// assert!(locks.try_acquire_str("coupon:1", &LockOptions::new()).await?.is_none());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryLock {
    store: Arc<Store>,
    label: Arc<str>,
    /// This client's session (shared by its clones; replaced when it expires).
    session: Arc<Mutex<Arc<Session>>>,
    /// Whether this client is cut off from the store (shared by its clones).
    cut_off: Arc<AtomicBool>,
    /// Starts this client's watchdogs when their first renewal comes due.
    timer: Arc<GuardTimer>,
    /// The guards this client holds (shared by its clones), which `close` releases.
    holdings: Holdings,
}

impl MemoryLock {
    /// A client of a new, private store.
    pub fn new() -> Self {
        Self {
            store: Arc::default(),
            label: "private".into(),
            session: Arc::default(),
            cut_off: Arc::default(),
            timer: Arc::default(),
            holdings: Holdings::default(),
        }
    }

    /// A client of the process-wide store called `name`, created on first use and dropped when its
    /// last client is (its locks go with it; its fencing tokens keep rising in the next store).
    /// `dlock::connect("memory://NAME")` returns this; `memory://` is `"default"`.
    pub fn shared(name: &str) -> Self {
        static STORES: OnceLock<Mutex<HashMap<String, Weak<Store>>>> = OnceLock::new();
        let mut stores = STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        stores.retain(|_, store| store.strong_count() > 0);
        let store = stores.get(name).and_then(Weak::upgrade).unwrap_or_else(|| {
            let store = Arc::<Store>::default();
            stores.insert(name.to_owned(), Arc::downgrade(&store));
            store
        });
        Self {
            store,
            label: name.into(),
            session: Arc::default(),
            cut_off: Arc::default(),
            timer: Arc::default(),
            holdings: Holdings::default(),
        }
    }

    /// Another client of the same store, with a session of its own (as a second process would
    /// be). A clone is the same client.
    pub fn client(&self) -> Self {
        Self {
            store: self.store.clone(),
            label: self.label.clone(),
            session: Arc::default(),
            cut_off: Arc::default(),
            timer: Arc::default(),
            holdings: Holdings::default(),
        }
    }

    fn current_session(&self) -> Arc<Session> {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Suspends this client's session, as a dropped connection suspends a ZooKeeper session: its
    /// guards report [`LockStatus::Suspended`](crate::LockStatus::Suspended) (the store keeps
    /// their locks) until [`resume_session`](Self::resume_session), or, if `timeout` passes
    /// first, the session expires as with [`expire_session`](Self::expire_session). For testing
    /// how code handles both.
    pub fn suspend_session(&self, timeout: Duration) {
        let session = self.current_session();
        let until = after(Instant::now(), timeout);
        session.suspend(until);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.clone();
            runtime.spawn(async move {
                let reason = session.ended().await;
                client.end_session(&session, reason);
            });
        }
    }

    /// Cuts this client (and its clones) off from the store, as a network partition, or a
    /// paused process whose requests stop, would: its acquires, renewals and releases fail with
    /// [`LockError::Unavailable`] until [`reconnect`](Self::reconnect), and what it holds stays
    /// in the store until its lease runs out (its guards are then lost with
    /// [`LostReason::Expired`](crate::LostReason::Expired) or fail to renew). For testing how
    /// code copes with a lease that runs out under it; the fault suite simulates a paused or
    /// killed worker with it.
    pub fn cut_off(&self) {
        self.cut_off.store(true, Ordering::SeqCst);
    }

    /// Ends [`cut_off`](Self::cut_off): the client's requests reach the store again.
    pub fn reconnect(&self) {
        self.cut_off.store(false, Ordering::SeqCst);
    }

    fn reachable(&self) -> Result<()> {
        unreachable_if(&self.cut_off)
    }

    /// The suspended session is back: its guards are held again.
    pub fn resume_session(&self) {
        self.current_session().resume();
    }

    /// Ends this client's session at once, as the server does when a session expires: every
    /// guard on it is lost with [`LostReason::SessionExpired`](crate::LostReason::SessionExpired)
    /// and its locks go to the next waiters. Later acquires use a new session.
    pub fn expire_session(&self) {
        let session = self.current_session();
        session.end(crate::LostReason::SessionExpired);
        self.end_session(&session, crate::LostReason::SessionExpired);
    }

    fn end_session(&self, session: &Arc<Session>, reason: crate::LostReason) {
        self.store.evict_session(session, reason);
        let mut current = self.session.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::ptr_eq(&current, session) {
            *current = Arc::default();
        }
    }

    /// Ends the current holder's lease of `name` at once, firing its `lost` signal with
    /// [`LostReason::SessionClosed`](crate::LostReason::SessionClosed): what a crashed server or
    /// an expired session does to a real backend. For tests; returns whether there was a holder.
    pub fn evict(&self, name: &LockName) -> bool {
        self.store.evict(name)
    }

    /// Whether `name` is held or waited for right now. For tests that check nothing leaked.
    pub fn is_in_use(&self, name: &LockName) -> bool {
        self.store.in_use(name)
    }

    /// How many names are held or waited for. Zero after a test means nothing leaked.
    pub fn active_names(&self) -> usize {
        self.store.active_names()
    }

    fn grant(
        &self,
        name: &LockName,
        id: u64,
        token: u64,
        started: Instant,
        ttl: Duration,
    ) -> Grant {
        let state = Arc::new(LeaseState::on_session(
            Some(after(started, ttl)),
            self.current_session(),
        ));
        self.store.attach(name, id, &state);
        let lease = Arc::new(MemoryLease {
            store: self.store.clone(),
            cut_off: self.cut_off.clone(),
            timer: self.timer.clone(),
            name: name.clone(),
            id,
        });
        Grant::new(
            name.clone(),
            FencingToken::new(token),
            lease,
            state,
            RenewedBy::Guard,
        )
    }
}

impl Default for MemoryLock {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLock")
            .field("store", &self.label)
            .finish()
    }
}

impl fmt::Display for MemoryLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory({})", self.label)
    }
}

crate::impl_distributed_lock!(MemoryLock);

#[async_trait]
impl RawLock for MemoryLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &Holdings {
        &self.holdings
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Strict,
            fifo: true,
            inspect: true,
            takeover_signal: true,
            max_permits: MAX_PERMITS,
            one_limit_per_name: true,
            elections: true,
            reader_writer: true,
            ..Capabilities::TTL_LEASE
        }
    }

    /// The store's holder (its token, the lease it has left, its hold id as `hold N`), how
    /// many readers share the name, and the number of queued waiters and readers among them.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        self.reachable()?;
        let seen = self.store.inspect(name);
        let inspection = match seen.holder {
            Some((id, token, expires_at)) => Inspection::held(Some(FencingToken::new(token)))
                .with_remaining(expires_at.saturating_duration_since(Instant::now()))
                .with_waiters(seen.waiters)
                .with_holder(format!("hold {id}")),
            None => Inspection::free(Some(seen.waiters)),
        };
        Ok(inspection.with_readers(seen.readers, seen.waiting_readers))
    }

    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        self.take(name, limit, options)
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.wait(name, limit, options, deadline).await
    }

    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        self.reachable()?;
        Ok(self.store.count(name))
    }

    async fn leader(&self, name: &LockName) -> Result<Option<crate::Leader>> {
        self.reachable()?;
        Ok(election::leader(&self.store, name))
    }

    async fn observe_leader(&self, name: &LockName) -> Result<crate::LeaderStream> {
        self.reachable()?;
        Ok(election::observe(self.store.clone(), name.clone()))
    }
}

/// The most permits a memory semaphore takes: far more than any use, and few enough that a
/// name's holders stay a short list.
const MAX_PERMITS: u32 = 1_000_000;

impl MemoryLock {
    /// One attempt at one of `limit` places of `name` (a lock has one), or a reader's shared
    /// place.
    fn take(&self, name: &LockName, limit: u32, options: &LockOptions) -> Result<Option<Grant>> {
        self.reachable()?;
        match self
            .store
            .try_take(name, Claim::new(limit, options), options.ttl(), None)
        {
            Attempt::Granted { id, token, at } => {
                Ok(Some(self.grant(name, id, token, at, options.ttl())))
            }
            Attempt::Busy { .. } | Attempt::Lapsed => Ok(None),
            Attempt::OtherLimit { in_use } => {
                Err(crate::raw::permits_mismatch(name, limit, in_use))
            }
        }
    }

    /// Waits in line for one of `limit` places of `name`, until `deadline`.
    async fn wait(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let ttl = options.ttl();
        if let Some(grant) = self.take(name, limit, options)? {
            return Ok(Some(grant));
        }
        // A candidate belongs to the session it started on: if that session ends while it
        // waits, the campaign fails rather than being granted on a later session it never
        // queued with (what etcd-io/etcd #19597 got wrong). A lock's waiter is not tied to a
        // session here, and its grant goes on the session current then.
        let session = options.is_campaign().then(|| self.current_session());
        let claim = Claim::new(limit, options);
        let (first, mut wake) = self.store.enqueue(name, claim, ttl);
        // The place in the queue changes when an offer lapses and the wait queues again.
        let place = Arc::new(AtomicU64::new(first));
        let pending = {
            let (store, name, place) = (self.store.clone(), name.clone(), place.clone());
            PendingAcquire::arm(move || store.dequeue(&name, place.load(Ordering::SeqCst)))
        };
        loop {
            let current = wake.clone();
            let notified = current.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.reachable()?;
            if let Some(crate::raw::SessionStatus::Ended(reason)) =
                session.as_ref().map(|session| session.status())
            {
                return Err(LockError::Lost {
                    name: name.to_string(),
                    reason,
                });
            }
            let until =
                match self
                    .store
                    .try_take(name, claim, ttl, Some(place.load(Ordering::SeqCst)))
                {
                    Attempt::Granted { id, token, at } => {
                        pending.disarm();
                        return Ok(Some(self.grant(name, id, token, at, ttl)));
                    }
                    Attempt::Busy { until } => until,
                    Attempt::Lapsed => {
                        let (again, woken_by) = self.store.enqueue(name, claim, ttl);
                        place.store(again, Ordering::SeqCst);
                        wake = woken_by;
                        continue;
                    }
                    Attempt::OtherLimit { in_use } => {
                        return Err(crate::raw::permits_mismatch(name, limit, in_use));
                    }
                };
            let wake_at = match (until, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let session_ended = async {
                match &session {
                    Some(session) => session.ended().await,
                    None => std::future::pending().await,
                }
            };
            match wake_at {
                Some(at) => tokio::select! {
                    _ = notified => {}
                    _ = session_ended => {}
                    _ = sleep_until(at) => {}
                },
                None => tokio::select! {
                    _ = notified => {}
                    _ = session_ended => {}
                },
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // One last try, so a place freed exactly at the deadline is not missed.
                if let Attempt::Granted { id, token, at } =
                    self.store
                        .try_take(name, claim, ttl, Some(place.load(Ordering::SeqCst)))
                {
                    pending.disarm();
                    return Ok(Some(self.grant(name, id, token, at, ttl)));
                }
                drop(pending);
                return Ok(None);
            }
        }
    }
}

#[derive(Debug)]
struct MemoryLease {
    store: Arc<Store>,
    /// Its client's link to the store.
    cut_off: Arc<AtomicBool>,
    timer: Arc<GuardTimer>,
    name: LockName,
    id: u64,
}

#[async_trait]
impl RawLease for MemoryLease {
    async fn release(&self) -> Result<()> {
        unreachable_if(&self.cut_off)?;
        if self.store.release(&self.name, self.id) {
            Ok(())
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        unreachable_if(&self.cut_off)?;
        let started = Instant::now();
        if self.store.extend(&self.name, self.id, ttl) {
            Ok(after(started, ttl))
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    async fn proclaim(&self, _term: FencingToken, value: &[u8]) -> Result<()> {
        unreachable_if(&self.cut_off)?;
        if self.store.proclaim(&self.name, self.id, value) {
            Ok(())
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    fn guard_timer(&self) -> Option<&GuardTimer> {
        Some(&self.timer)
    }
}

/// `Unavailable` while the client is cut off from its store.
fn unreachable_if(cut_off: &AtomicBool) -> Result<()> {
    if cut_off.load(Ordering::SeqCst) {
        Err(LockError::unavailable_because(
            BACKEND,
            "this client is cut off from its store (MemoryLock::cut_off)",
        ))
    } else {
        Ok(())
    }
}
