//! The memory backend's shared state: holders, FIFO waiter queues, the fencing counter.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
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
    /// One counter for all names: strictly increasing per name, and nothing to keep per name.
    last_token: u64,
    last_id: u64,
}

#[derive(Debug, Default)]
struct Entry {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    id: u64,
    expires_at: Instant,
    state: Weak<LeaseState>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    wake: Arc<Notify>,
}

/// What an attempt to take a lock found.
pub(super) enum Attempt {
    Granted {
        id: u64,
        token: u64,
    },
    /// Someone holds it (until `until`), or a waiter ahead of the caller is about to take it (`None`).
    Busy {
        until: Option<Instant>,
    },
}

impl Entry {
    /// Drops a holder whose lease has ended, telling its guard.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            if let Some(state) = self.holder.take().and_then(|h| h.state.upgrade()) {
                state.mark_lost(LostReason::Expired);
            }
        }
    }

    fn wake_front(&self) {
        if self.holder.is_none() {
            if let Some(front) = self.waiters.front() {
                front.wake.notify_one();
            }
        }
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(inner: &mut Inner) -> u64 {
        inner.last_id = inner.last_id.saturating_add(1);
        inner.last_id
    }

    /// Takes `name` for `ttl` if it is free and no earlier waiter is queued (`waiter`: the caller's
    /// own place in the queue, which it leaves on success).
    pub(super) fn try_take(&self, name: &LockName, ttl: Duration, waiter: Option<u64>) -> Attempt {
        let now = Instant::now();
        let mut inner = self.lock();
        let inner = &mut *inner;
        let entry = inner.locks.entry(name.clone()).or_default();
        entry.expire(now);
        if let Some(holder) = &entry.holder {
            return Attempt::Busy {
                until: Some(holder.expires_at),
            };
        }
        let first_in_line = entry.waiters.front().is_none_or(|w| Some(w.id) == waiter);
        if !first_in_line {
            return Attempt::Busy { until: None };
        }
        if waiter.is_some() {
            entry.waiters.pop_front();
        }
        // u64 counters: saturating is only for form; they never come near the top.
        inner.last_id = inner.last_id.saturating_add(1);
        inner.last_token = inner.last_token.saturating_add(1);
        let id = inner.last_id;
        entry.holder = Some(Holder {
            id,
            expires_at: after(now, ttl),
            state: Weak::new(),
        });
        Attempt::Granted {
            id,
            token: inner.last_token,
        }
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

    /// Queues a waiter at the back; returns its id and wake-up.
    pub(super) fn enqueue(&self, name: &LockName) -> (u64, Arc<Notify>) {
        let mut inner = self.lock();
        let id = Self::next_id(&mut inner);
        let wake = Arc::new(Notify::new());
        inner
            .locks
            .entry(name.clone())
            .or_default()
            .waiters
            .push_back(Waiter {
                id,
                wake: wake.clone(),
            });
        (id, wake)
    }

    /// Leaves the queue (a cancelled or timed-out wait); wakes the next waiter if the lock is free.
    pub(super) fn dequeue(&self, name: &LockName, waiter: u64) {
        let mut inner = self.lock();
        if let MapEntry::Occupied(mut entry) = inner.locks.entry(name.clone()) {
            entry.get_mut().waiters.retain(|w| w.id != waiter);
            entry.get_mut().expire(Instant::now());
            entry.get().wake_front();
            if entry.get().holder.is_none() && entry.get().waiters.is_empty() {
                entry.remove();
            }
        }
    }

    /// Releases `name` if `id` still holds it; wakes the next waiter.
    pub(super) fn release(&self, name: &LockName, id: u64) -> bool {
        let mut inner = self.lock();
        let MapEntry::Occupied(mut entry) = inner.locks.entry(name.clone()) else {
            return false;
        };
        entry.get_mut().expire(Instant::now());
        let held = entry.get().holder.as_ref().is_some_and(|h| h.id == id);
        if held {
            entry.get_mut().holder = None;
            entry.get().wake_front();
        }
        if entry.get().holder.is_none() && entry.get().waiters.is_empty() {
            entry.remove();
        }
        held
    }

    /// Resets the lease of `name` to `ttl` if `id` still holds it.
    pub(super) fn extend(&self, name: &LockName, id: u64, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(entry) = inner.locks.get_mut(name) else {
            return false;
        };
        entry.expire(now);
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
        let Some(entry) = inner.locks.get_mut(name) else {
            return false;
        };
        let Some(holder) = entry.holder.take() else {
            return false;
        };
        if let Some(state) = holder.state.upgrade() {
            state.mark_lost(LostReason::SessionClosed);
        }
        entry.wake_front();
        true
    }

    /// Ends every hold whose guard is on `session` (an expired client session), telling the
    /// guards and waking the next waiters.
    pub(super) fn evict_session(&self, session: &Arc<Session>, reason: LostReason) {
        let mut inner = self.lock();
        for entry in inner.locks.values_mut() {
            let on_session = entry
                .holder
                .as_ref()
                .and_then(|h| h.state.upgrade())
                .is_some_and(|state| state.session().is_some_and(|s| Arc::ptr_eq(s, session)));
            if on_session {
                if let Some(state) = entry.holder.take().and_then(|h| h.state.upgrade()) {
                    state.mark_lost(reason);
                }
                entry.wake_front();
            }
        }
    }

    /// Names currently held or waited for (for tests: an empty store means nothing leaked).
    pub(super) fn active_names(&self) -> usize {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.locks.values_mut().for_each(|e| e.expire(now));
        inner
            .locks
            .retain(|_, e| e.holder.is_some() || !e.waiters.is_empty());
        inner.locks.len()
    }

    /// Whether `name` is held or waited for.
    pub(super) fn in_use(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.locks.get_mut(name).is_some_and(|e| {
            e.expire(now);
            e.holder.is_some() || !e.waiters.is_empty()
        })
    }
}
