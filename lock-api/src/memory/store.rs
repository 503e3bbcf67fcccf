//! The memory backend's shared state: holders, FIFO waiter queues, the fencing counter.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::name::LockName;
use crate::raw::time::after;
use crate::raw::{LeaseState, Session};
use crate::status::LostReason;

/// One store of locks; every [`MemoryLock`](super::MemoryLock) client of it sees the same locks.
#[derive(Debug, Default)]
pub(super) struct Store {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    locks: HashMap<LockName, Entry>,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    id: u64,
    token: u64,
    expires_at: Instant,
    state: Weak<LeaseState>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    /// The lease it asked for: an offer holds the lock in its name this long.
    ttl: Duration,
    wake: Arc<Notify>,
    /// The hold the store made in its name when the lock came free, and when: the waiter claims
    /// it when it next looks, with its lease dated from then.
    offer: Option<(u64, Instant)>,
}

/// What an attempt to take a lock found.
pub(super) enum Attempt {
    /// The caller holds it, with a lease that started at `at`.
    Granted { id: u64, token: u64, at: Instant },
    /// Someone holds it (until `until`), or a waiter ahead of the caller is about to take it (`None`).
    Busy { until: Option<Instant> },
    /// The caller's place in the queue is gone: the lock was offered to it and the offer ran out
    /// before it looked (its task was not polled). It must queue again.
    Lapsed,
}

/// The store's counters, apart from the entries so both can be borrowed at once.
#[derive(Debug, Default)]
struct Counters {
    last_id: u64,
}

/// The last fencing token of the process. One counter for every name of every store: strictly
/// increasing per name with nothing kept per name, also across the stores `memory://NAME` makes
/// and drops with their clients (a test that connects again must not see tokens start over).
static LAST_TOKEN: AtomicU64 = AtomicU64::new(0);

impl Counters {
    fn next_id(&mut self) -> u64 {
        // u64 counters: saturating is only for form; they never come near the top.
        self.last_id = self.last_id.saturating_add(1);
        self.last_id
    }
}

/// The next fencing token from [`LAST_TOKEN`]. Called under the store's mutex, so a name's tokens
/// rise in the order its holds are granted; the atomic only spans stores.
fn next_token() -> u64 {
    LAST_TOKEN.fetch_add(1, Ordering::Relaxed).saturating_add(1)
}

impl Entry {
    /// Drops a holder whose lease has ended, telling its guard. A waiter that was offered that
    /// hold and never claimed it loses its place: a waiter that is not polled (a stalled task)
    /// must not keep everyone behind it waiting.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            if let Some(holder) = self.holder.take() {
                if let Some(state) = holder.state.upgrade() {
                    state.mark_lost(LostReason::Expired);
                }
                self.waiters
                    .retain(|w| w.offer.is_none_or(|(id, _)| id != holder.id));
            }
        }
    }

    /// A free lock is held at once in the name of the first waiter, for its TTL, and the waiter
    /// is woken to claim it: the hand-off does not wait for the waiter's task to run, and if it
    /// never runs, the offer runs out like any unrenewed lease.
    fn offer_front(&mut self, counters: &mut Counters, now: Instant) {
        if self.holder.is_some() {
            return;
        }
        let Some(front) = self.waiters.front_mut() else {
            return;
        };
        let id = counters.next_id();
        self.holder = Some(Holder {
            id,
            token: next_token(),
            expires_at: after(now, front.ttl),
            state: Weak::new(),
        });
        front.offer = Some((id, now));
        front.wake.notify_one();
    }

    /// Expires what ran out, then offers a free lock to the next waiter.
    fn settle(&mut self, counters: &mut Counters, now: Instant) {
        self.expire(now);
        self.offer_front(counters, now);
    }

    fn unused(&self) -> bool {
        self.holder.is_none() && self.waiters.is_empty()
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `name` for `ttl` if it is free and no earlier waiter is queued (`waiter`: the caller's
    /// own place in the queue, which it leaves on success, claiming the hold offered to it).
    pub(super) fn try_take(&self, name: &LockName, ttl: Duration, waiter: Option<u64>) -> Attempt {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let entry = locks.entry(name.clone()).or_default();
        entry.settle(counters, now);
        if let Some(waiter) = waiter {
            let Some(place) = entry.waiters.iter().position(|w| w.id == waiter) else {
                return Attempt::Lapsed;
            };
            let offered = entry.waiters[place].offer;
            if let (Some((offer, at)), Some(holder)) = (offered, &entry.holder) {
                if holder.id == offer {
                    let token = holder.token;
                    entry.waiters.remove(place);
                    return Attempt::Granted {
                        id: offer,
                        token,
                        at,
                    };
                }
            }
        }
        if let Some(holder) = &entry.holder {
            return Attempt::Busy {
                until: Some(holder.expires_at),
            };
        }
        if !entry.waiters.is_empty() {
            // Queued waiters go first (an offer is made whenever the lock is free).
            return Attempt::Busy { until: None };
        }
        let id = counters.next_id();
        let token = next_token();
        entry.holder = Some(Holder {
            id,
            token,
            expires_at: after(now, ttl),
            state: Weak::new(),
        });
        Attempt::Granted { id, token, at: now }
    }

    /// Links a granted holder to its guard's state, so expiry and eviction can fire `lost`.
    pub(super) fn attach(&self, name: &LockName, id: u64, state: &Arc<LeaseState>) {
        let mut inner = self.lock();
        if let Some(holder) = inner.locks.get_mut(name).and_then(|e| e.holder.as_mut()) {
            if holder.id == id {
                holder.state = Arc::downgrade(state);
            }
        }
    }

    /// Queues a waiter for a lease of `ttl` at the back; returns its id and wake-up.
    pub(super) fn enqueue(&self, name: &LockName, ttl: Duration) -> (u64, Arc<Notify>) {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let id = counters.next_id();
        let wake = Arc::new(Notify::new());
        locks
            .entry(name.clone())
            .or_default()
            .waiters
            .push_back(Waiter {
                id,
                ttl,
                wake: wake.clone(),
                offer: None,
            });
        (id, wake)
    }

    /// Leaves the queue (a cancelled or timed-out wait), handing back a hold offered to it;
    /// offers a free lock to the next waiter.
    pub(super) fn dequeue(&self, name: &LockName, waiter: u64) {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        if let MapEntry::Occupied(mut entry) = locks.entry(name.clone()) {
            let e = entry.get_mut();
            if let Some(place) = e.waiters.iter().position(|w| w.id == waiter) {
                let left = e.waiters.remove(place);
                let offered = left.and_then(|w| w.offer).map(|(id, _)| id);
                if offered.is_some() && e.holder.as_ref().map(|h| h.id) == offered {
                    e.holder = None;
                }
            }
            e.settle(counters, Instant::now());
            if e.unused() {
                entry.remove();
            }
        }
    }

    /// Releases `name` if `id` still holds it; offers it to the next waiter.
    pub(super) fn release(&self, name: &LockName, id: u64) -> bool {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let MapEntry::Occupied(mut entry) = locks.entry(name.clone()) else {
            return false;
        };
        let now = Instant::now();
        let e = entry.get_mut();
        e.expire(now);
        let held = e.holder.as_ref().is_some_and(|h| h.id == id);
        if held {
            e.holder = None;
        }
        e.offer_front(counters, now);
        if e.unused() {
            entry.remove();
        }
        held
    }

    /// Resets the lease of `name` to `ttl` if `id` still holds it.
    pub(super) fn extend(&self, name: &LockName, id: u64, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let Some(entry) = locks.get_mut(name) else {
            return false;
        };
        entry.settle(counters, now);
        match entry.holder.as_mut() {
            Some(holder) if holder.id == id => {
                holder.expires_at = after(now, ttl);
                true
            }
            _ => false,
        }
    }

    /// Ends the current holder's lease now, as a crashed server or expired session would.
    pub(super) fn evict(&self, name: &LockName) -> bool {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let Some(entry) = locks.get_mut(name) else {
            return false;
        };
        let Some(holder) = entry.holder.take() else {
            return false;
        };
        if let Some(state) = holder.state.upgrade() {
            state.mark_lost(LostReason::SessionClosed);
        }
        // An evicted offer takes its waiter's place with it, as its expiry would.
        entry
            .waiters
            .retain(|w| w.offer.is_none_or(|(id, _)| id != holder.id));
        entry.offer_front(counters, Instant::now());
        true
    }

    /// Ends every hold whose guard is on `session` (an expired client session), telling the
    /// guards and offering the locks to the next waiters.
    pub(super) fn evict_session(&self, session: &Arc<Session>, reason: LostReason) {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let now = Instant::now();
        for entry in locks.values_mut() {
            let on_session = entry
                .holder
                .as_ref()
                .and_then(|h| h.state.upgrade())
                .is_some_and(|state| state.session().is_some_and(|s| Arc::ptr_eq(s, session)));
            if on_session {
                if let Some(state) = entry.holder.take().and_then(|h| h.state.upgrade()) {
                    state.mark_lost(reason);
                }
                entry.offer_front(counters, now);
            }
        }
    }

    /// Names currently held or waited for (for tests: an empty store means nothing leaked).
    pub(super) fn active_names(&self) -> usize {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        locks.values_mut().for_each(|e| e.settle(counters, now));
        locks.retain(|_, e| !e.unused());
        locks.len()
    }

    /// Who holds `name` (its hold id and token, and when its lease ends) and how many wait
    /// behind it. A hold offered to the first waiter is that waiter's: it no longer counts as
    /// waiting.
    pub(super) fn inspect(&self, name: &LockName) -> (Option<(u64, u64, Instant)>, usize) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let Some(entry) = locks.get_mut(name) else {
            return (None, 0);
        };
        entry.settle(counters, now);
        let holder = entry.holder.as_ref().map(|h| (h.id, h.token, h.expires_at));
        let offered = |w: &Waiter| {
            w.offer
                .is_some_and(|(id, _)| holder.is_some_and(|(held, _, _)| held == id))
        };
        let waiting = entry.waiters.iter().filter(|w| !offered(w)).count();
        (holder, waiting)
    }

    /// Whether `name` is held or waited for.
    pub(super) fn in_use(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        locks.get_mut(name).is_some_and(|e| {
            e.settle(counters, now);
            !e.unused()
        })
    }
}
