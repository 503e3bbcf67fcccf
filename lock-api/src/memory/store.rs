//! The memory backend's shared state: holders, FIFO waiter queues, the fencing counter.
//!
//! One shape for every holder count: a name is held by up to its limit of holders at once (a
//! lock by one, a semaphore by its number of permits), or by any number of readers while no
//! writer holds it, and each free place is offered to the next waiter in line: a run of readers
//! together, never past a waiting writer.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::name::LockName;
use crate::raw::time::after;
use crate::raw::{Claim, LeaseState, Session};
use crate::status::LostReason;

/// One store of locks; every [`MemoryLock`](super::MemoryLock) client of it sees the same locks.
#[derive(Debug, Default)]
pub(super) struct Store {
    inner: Mutex<Inner>,
    /// Bumped whenever a name's leader may have changed (a publication, a release, an
    /// eviction), for the store's observers.
    changed: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    locks: HashMap<LockName, Entry>,
    counters: Counters,
}

#[derive(Debug)]
struct Entry {
    /// How many may hold the name at once, as the clients using it now asked.
    limit: u32,
    holders: Vec<Holder>,
    waiters: VecDeque<Waiter>,
    /// The hold that published the name's leader value last, and the value: the leader while
    /// that hold lasts.
    leader: Option<(u64, Vec<u8>)>,
}

impl Entry {
    fn new(limit: u32) -> Self {
        Self {
            limit,
            holders: Vec::new(),
            waiters: VecDeque::new(),
            leader: None,
        }
    }
}

#[derive(Debug)]
struct Holder {
    id: u64,
    shared: bool,
    token: u64,
    expires_at: Instant,
    state: Weak<LeaseState>,
}

/// What [`Store::inspect`] saw of a name: its newest holder's hold id, token and lease end;
/// how many readers hold it; how many wait, and how many of those to read.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub(super) holder: Option<(u64, u64, Instant)>,
    pub(super) readers: usize,
    pub(super) waiters: usize,
    pub(super) waiting_readers: usize,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    shared: bool,
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
    /// Every place is held (the first to end at `until`), or a waiter ahead of the caller is
    /// about to take the free one (`None`).
    Busy { until: Option<Instant> },
    /// The name is in use with another limit.
    OtherLimit { in_use: u32 },
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
        while let Some(place) = self.holders.iter().position(|h| h.expires_at <= now) {
            let holder = self.holders.swap_remove(place);
            if let Some(state) = holder.state.upgrade() {
                state.mark_lost(LostReason::Expired);
            }
            self.waiters
                .retain(|w| w.offer.is_none_or(|(id, _)| id != holder.id));
        }
    }

    /// The hold `id`, if it is still one.
    fn holder_mut(&mut self, id: u64) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|h| h.id == id)
    }

    fn holds(&self, id: u64) -> bool {
        self.holders.iter().any(|h| h.id == id)
    }

    /// Whether a hold of this kind fits beside the current holders: a reader's beside
    /// readers only, anyone else's while fewer than the limit hold (readers count).
    fn fits(&self, shared: bool) -> bool {
        if shared {
            self.holders.iter().all(|h| h.shared)
        } else {
            u32::try_from(self.holders.len()).is_ok_and(|held| held < self.limit)
        }
    }

    /// A free place is held at once in the name of the first waiter, for its TTL, and the
    /// waiter is woken to claim it: the hand-off does not wait for the waiter's task to run, and
    /// if it never runs, the offer runs out like any unrenewed lease. Offers go in line order
    /// and stop at the first waiter that does not fit, so readers behind a waiting writer wait
    /// for it, and the readers ahead of it are let in together.
    fn offer_front(&mut self, counters: &mut Counters, now: Instant) {
        let mut place = 0;
        loop {
            let Some(waiter) = self.waiters.get(place) else {
                return;
            };
            place = place.saturating_add(1);
            if waiter.offer.is_some() {
                continue;
            }
            let shared = waiter.shared;
            if !self.fits(shared) {
                return;
            }
            let id = counters.next_id();
            let waiter = &mut self.waiters[place.saturating_sub(1)];
            self.holders.push(Holder {
                id,
                shared,
                token: next_token(),
                expires_at: after(now, waiter.ttl),
                state: Weak::new(),
            });
            waiter.offer = Some((id, now));
            waiter.wake.notify_one();
        }
    }

    /// Expires what ran out, then offers a free lock to the next waiter.
    fn settle(&mut self, counters: &mut Counters, now: Instant) {
        self.expire(now);
        self.offer_front(counters, now);
    }

    fn unused(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }

    /// The entry of `name`, made with `limit` if the name is not in use; refused if it is in
    /// use with another limit.
    fn of<'a>(
        locks: &'a mut HashMap<LockName, Entry>,
        name: &LockName,
        limit: u32,
        counters: &mut Counters,
        now: Instant,
    ) -> std::result::Result<&'a mut Entry, u32> {
        let entry = locks
            .entry(name.clone())
            .or_insert_with(|| Entry::new(limit));
        entry.settle(counters, now);
        if entry.limit != limit {
            if !entry.unused() {
                return Err(entry.limit);
            }
            entry.limit = limit;
        }
        Ok(entry)
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a place of `name` for `ttl` if the `claim` fits and no earlier waiter is queued
    /// (`waiter`: the caller's own place in the queue, which it leaves on success, claiming the
    /// hold offered to it).
    pub(super) fn try_take(
        &self,
        name: &LockName,
        claim: Claim,
        ttl: Duration,
        waiter: Option<u64>,
    ) -> Attempt {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let entry = match Entry::of(locks, name, claim.limit, counters, now) {
            Ok(entry) => entry,
            Err(in_use) => return Attempt::OtherLimit { in_use },
        };
        if let Some(waiter) = waiter {
            let Some(place) = entry.waiters.iter().position(|w| w.id == waiter) else {
                return Attempt::Lapsed;
            };
            if let Some((offer, at)) = entry.waiters[place].offer {
                if let Some(token) = entry.holder_mut(offer).map(|h| h.token) {
                    entry.waiters.remove(place);
                    return Attempt::Granted {
                        id: offer,
                        token,
                        at,
                    };
                }
            }
        }
        if !entry.fits(claim.shared) {
            return Attempt::Busy {
                until: entry.holders.iter().map(|h| h.expires_at).min(),
            };
        }
        if entry.waiters.iter().any(|w| w.offer.is_none()) {
            // Queued waiters go first (an offer is made whenever a place is free).
            return Attempt::Busy { until: None };
        }
        let id = counters.next_id();
        let token = next_token();
        entry.holders.push(Holder {
            id,
            shared: claim.shared,
            token,
            expires_at: after(now, ttl),
            state: Weak::new(),
        });
        Attempt::Granted { id, token, at: now }
    }

    /// Links a granted holder to its guard's state, so expiry and eviction can fire `lost`.
    pub(super) fn attach(&self, name: &LockName, id: u64, state: &Arc<LeaseState>) {
        let mut inner = self.lock();
        if let Some(holder) = inner.locks.get_mut(name).and_then(|e| e.holder_mut(id)) {
            holder.state = Arc::downgrade(state);
        }
    }

    /// Queues a waiter for a lease of `ttl` at the back; returns its id and wake-up.
    pub(super) fn enqueue(
        &self,
        name: &LockName,
        claim: Claim,
        ttl: Duration,
    ) -> (u64, Arc<Notify>) {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let id = counters.next_id();
        let wake = Arc::new(Notify::new());
        locks
            .entry(name.clone())
            .or_insert_with(|| Entry::new(claim.limit))
            .waiters
            .push_back(Waiter {
                id,
                shared: claim.shared,
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
                if let Some((offered, _)) = left.and_then(|w| w.offer) {
                    e.holders.retain(|h| h.id != offered);
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
        let held = e.holds(id);
        if held {
            e.holders.retain(|h| h.id != id);
        }
        e.offer_front(counters, now);
        if e.unused() {
            entry.remove();
        }
        drop(inner);
        self.announce();
        held
    }

    /// Resets the lease of `name` to `ttl` if `id` still holds it.
    pub(super) fn extend(&self, name: &LockName, id: u64, ttl: Duration) -> bool {
        self.settled(name, |entry, now| {
            entry
                .holder_mut(id)
                .map(|holder| holder.expires_at = after(now, ttl))
                .is_some()
        })
        .unwrap_or(false)
    }

    /// Runs `look` on the entry of `name` once what ran out has ended and free places are
    /// offered (with the time it settled at); `None` if the name is not in use.
    fn settled<R>(
        &self,
        name: &LockName,
        look: impl FnOnce(&mut Entry, Instant) -> R,
    ) -> Option<R> {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let entry = locks.get_mut(name)?;
        entry.settle(counters, now);
        Some(look(entry, now))
    }

    /// Ends every current holder's lease now, as a crashed server or expired session would.
    pub(super) fn evict(&self, name: &LockName) -> bool {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let Some(entry) = locks.get_mut(name) else {
            return false;
        };
        if entry.holders.is_empty() {
            return false;
        }
        for holder in std::mem::take(&mut entry.holders) {
            if let Some(state) = holder.state.upgrade() {
                state.mark_lost(LostReason::SessionClosed);
            }
            // An evicted offer takes its waiter's place with it, as its expiry would.
            entry
                .waiters
                .retain(|w| w.offer.is_none_or(|(id, _)| id != holder.id));
        }
        entry.offer_front(counters, Instant::now());
        drop(inner);
        self.announce();
        true
    }

    /// Ends every hold whose guard is on `session` (an expired client session), telling the
    /// guards and offering the locks to the next waiters.
    pub(super) fn evict_session(&self, session: &Arc<Session>, reason: LostReason) {
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let now = Instant::now();
        for entry in locks.values_mut() {
            let on_session = |h: &Holder| {
                h.state
                    .upgrade()
                    .is_some_and(|state| state.session().is_some_and(|s| Arc::ptr_eq(s, session)))
            };
            let (ended, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut entry.holders)
                .into_iter()
                .partition(on_session);
            entry.holders = kept;
            if !ended.is_empty() {
                for state in ended.iter().filter_map(|h| h.state.upgrade()) {
                    state.mark_lost(reason);
                }
                entry.offer_front(counters, now);
            }
        }
        drop(inner);
        self.announce();
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
    pub(super) fn inspect(&self, name: &LockName) -> Seen {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { locks, counters } = &mut *inner;
        let Some(entry) = locks.get_mut(name) else {
            return Seen::default();
        };
        entry.settle(counters, now);
        // The latest grant: a lock's only holder, a semaphore's newest permit.
        let holder = entry
            .holders
            .iter()
            .max_by_key(|h| h.token)
            .map(|h| (h.id, h.token, h.expires_at));
        let waiting = entry.waiters.iter().filter(|w| w.offer.is_none());
        Seen {
            holder,
            readers: entry.holders.iter().filter(|h| h.shared).count(),
            waiters: waiting.clone().count(),
            waiting_readers: waiting.filter(|w| w.shared).count(),
        }
    }

    /// How many hold `name` now (offers to waiters included: each is that waiter's place).
    pub(super) fn count(&self, name: &LockName) -> u32 {
        self.settled(name, |entry, _| {
            u32::try_from(entry.holders.len()).unwrap_or(u32::MAX)
        })
        .unwrap_or(0)
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

    /// Publishes `value` as the leader's of `name` if hold `id` still holds it.
    pub(super) fn proclaim(&self, name: &LockName, id: u64, value: &[u8]) -> bool {
        let published = self
            .settled(name, |entry, _| {
                let held = entry.holds(id);
                if held {
                    entry.leader = Some((id, value.to_vec()));
                }
                held
            })
            .unwrap_or(false);
        if published {
            self.announce();
        }
        published
    }

    /// The leader of `name`: the term, value and lease end of the hold that published last,
    /// while it lasts.
    pub(super) fn leader(&self, name: &LockName) -> Option<(u64, Vec<u8>, Instant)> {
        self.settled(name, |entry, _| {
            let (id, value) = entry.leader.as_ref()?;
            let holder = entry.holders.iter().find(|h| h.id == *id)?;
            Some((holder.token, value.clone(), holder.expires_at))
        })
        .flatten()
    }

    /// A receiver that wakes when any name's leader may have changed.
    pub(super) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Tells the store's observers, if there are any: a release with nobody observing costs
    /// nothing more (an observer reads the state after it subscribes, so it misses nothing).
    fn announce(&self) {
        if self.changed.receiver_count() == 0 {
            return;
        }
        self.changed
            .send_modify(|version| *version = version.wrapping_add(1));
    }
}
