//! Which connection holds, acquires or is releasing which key: the bookkeeping behind the pool's
//! rules, with no I/O.
//!
//! A key is claimed ([`Claim`]) with a holder limit: 1 for a lock, N for a semaphore of N
//! permits; or as a reader's share, which any number hold. A key is reserved on at most as many
//! connections of the client as its limit allows (beyond, the server would answer "busy"
//! anyway, and the client knows it sooner), never twice on one connection (the server would
//! stack it, and a connection holding a share would be granted the key's lock beside it), and
//! only with the claim it is in use with here: another limit is a mismatch the client sees
//! without asking, a writer beside this client's readers (or a reader beside its writer) is
//! busy. A connection waits at the server only while it holds nothing.

use foldhash::HashMap;
use std::hash::Hash;

use crate::raw::Claim;

mod set;

pub(super) use set::SetPick;

/// What one connection is doing with one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    /// A non-blocking attempt is in flight.
    Attempt,
    /// A guard holds the key here.
    Held,
    /// An unlock is queued here (a dropped guard); `attempt`: the slot was an attempt's, still
    /// counted in `inflight`.
    Releasing { attempt: bool },
}

pub(super) struct Entry<K, C> {
    pub(super) conn: C,
    slots: HashMap<K, Slot>,
    /// Lent to one server-side wait: no shared use.
    waiting: bool,
    /// Non-blocking attempts queued or running here (to spread concurrent attempts).
    inflight: u32,
    /// Unlocks waiting for this connection or running on it (an unlock still in the
    /// connection task's channel counts once the task takes it): an attempt picked here would
    /// wait behind them.
    unlocking: u32,
}

impl<K, C> Entry<K, C> {
    fn is_idle(&self) -> bool {
        self.slots.is_empty() && !self.waiting && self.inflight == 0
    }

    /// Statements waiting for this connection or running on it, which a new attempt would
    /// wait behind.
    fn busy(&self) -> u32 {
        self.inflight.saturating_add(self.unlocking)
    }
}

/// Where a non-blocking attempt runs.
pub(super) enum SharedPick<C> {
    /// This client holds or is acquiring the key: the answer is "busy".
    Busy,
    /// An unlock of the key by this client is queued: its answer comes within a round trip.
    Settling,
    /// Run on this connection (the key is reserved there).
    Use(C),
    /// Open a new connection (already counted).
    Open,
    /// Open a new connection (already counted) only to give the lock one holding none: if it
    /// fails, pick again with [`Registry::pick_shared_gathered`], whose free connection will do.
    OpenToSpread,
    /// Every connection is lent to a wait and none may be opened.
    Full,
    /// This client has the key in use with this other holder limit (a reader's share counts as
    /// a lock's).
    Mismatch(u32),
}

/// Which connection a server-side wait gets.
pub(super) enum WaitPick<C> {
    Use(C),
    /// Open a new connection (already counted, as waiting).
    Open,
    Full,
}

pub(super) struct Registry<K, C> {
    /// Open connections plus connections being opened.
    total: usize,
    /// Of those, lent to a wait (or being opened for one).
    waiting: usize,
    entries: HashMap<u64, Entry<K, C>>,
    /// Keys with a slot on some connection: how many slots, and the claim they are in use with.
    local: HashMap<K, Local>,
}

/// A key's slots on this client's connections.
#[derive(Clone, Copy, Debug)]
struct Local {
    count: u32,
    claim: Claim,
}

/// How many of this client's connections may hold a key claimed as `claim`: its limit, or for
/// readers, who share, every connection.
fn capacity(claim: Claim) -> u32 {
    if claim.shared { u32::MAX } else { claim.limit }
}

impl<K, C> Default for Registry<K, C> {
    fn default() -> Self {
        Self {
            total: 0,
            waiting: 0,
            entries: HashMap::default(),
            local: HashMap::default(),
        }
    }
}

/// Whether a new lock goes to a connection holding none (opened if need be) while `holding`
/// connections already hold some, of at most `max`.
///
/// Most locks are held briefly: an attempt placed on a connection whose holder is about to
/// release makes that release wait a round trip behind it. With 4 tasks locking at once, locks
/// gathered on the connections holding some measured 0.64–0.72× of the raw pairs (medians of
/// alternated runs), and spreading them only over the connections already open did no better: the
/// pool opens one only when all are busy. A lock per connection avoids that, up to half the
/// limit: the other half stays free of locks, because a server-side wait needs a connection
/// that holds nothing (its holders' releases would queue behind the wait). The cost is a
/// session per lock held at once, up to that half; one lock at a time stays on one connection.
fn spreads(holding: usize, max: usize) -> bool {
    holding < (max / 2).max(1)
}

impl<K: Clone + Eq + Hash, C: Clone> Registry<K, C> {
    pub(super) fn total(&self) -> usize {
        self.total
    }

    pub(super) fn holds(&self, key: &K) -> bool {
        self.local.contains_key(key)
    }

    /// Whether this client has as many slots of `key` as `claim` allows: another attempt
    /// would be busy. (One in use here with another claim is not full: an attempt is refused
    /// or called busy at once, without the server.)
    pub(super) fn full(&self, key: &K, claim: Claim) -> bool {
        self.local
            .get(key)
            .is_some_and(|l| l.claim == claim && l.count >= capacity(claim))
    }

    /// Whether `key` may get another slot with `claim`.
    fn may_reserve(&self, key: &K, claim: Claim) -> bool {
        self.local
            .get(key)
            .is_none_or(|l| l.claim == claim && l.count < capacity(claim))
    }

    /// Counts a slot of `key` for `claim`. A server-side wait's grant can come while this
    /// client's slots of another claim are still being released (the server freed them first):
    /// the key is then in use with the newcomer's claim.
    fn add_local(&mut self, key: &K, claim: Claim) {
        let releasing = self.all_releasing(key);
        let local = self
            .local
            .entry(key.clone())
            .or_insert(Local { count: 0, claim });
        if local.claim != claim && releasing {
            local.claim = claim;
        }
        local.count = local.count.saturating_add(1);
    }

    fn drop_local(&mut self, key: &K) {
        if let Some(local) = self.local.get_mut(key) {
            local.count = local.count.saturating_sub(1);
            if local.count == 0 {
                self.local.remove(key);
            }
        }
    }

    /// Whether every slot of `key` on this client is being released.
    fn all_releasing(&self, key: &K) -> bool {
        self.entries.values().all(|e| {
            e.slots
                .get(key)
                .is_none_or(|s| matches!(s, Slot::Releasing { .. }))
        })
    }

    /// Picks the connection for a non-blocking attempt on `key` (claimed as `claim`) and
    /// reserves it there, on a connection that does not hold it: the
    /// least busy (fewest statements waiting or running: attempts and unlocks alike); among
    /// equals, while fewer than half the limit hold locks, one holding none, opened if need be
    /// (see [`spreads`]); past that, one that already holds locks (locks gather, and the rest
    /// stay idle for waits). A new one also while even the least busy has a statement waiting
    /// or running and the limit allows.
    pub(super) fn pick_shared(&mut self, key: &K, claim: Claim, max: usize) -> SharedPick<C> {
        self.pick(key, claim, max, true)
    }

    /// As [`pick_shared`](Self::pick_shared), but never opens a connection only to spread
    /// locks: after such an open failed (the server refusing more connections, say).
    pub(super) fn pick_shared_gathered(
        &mut self,
        key: &K,
        claim: Claim,
        max: usize,
    ) -> SharedPick<C> {
        self.pick(key, claim, max, false)
    }

    fn pick(&mut self, key: &K, claim: Claim, max: usize, may_spread: bool) -> SharedPick<C> {
        if let Some(local) = self.local.get(key).copied() {
            if local.claim != claim {
                // Unless its holders here are all on their way out, the key is in use with
                // another limit, or in the other mode of a reader-writer lock, which excludes
                // this one.
                return if self.all_releasing(key) {
                    SharedPick::Settling
                } else if local.claim.limit != claim.limit {
                    SharedPick::Mismatch(local.claim.limit)
                } else {
                    SharedPick::Busy
                };
            }
            if local.count >= capacity(claim) {
                let releasing = self
                    .entries
                    .values()
                    .any(|e| matches!(e.slots.get(key), Some(Slot::Releasing { .. })));
                return if releasing {
                    SharedPick::Settling
                } else {
                    SharedPick::Busy
                };
            }
        }
        let holding = self
            .entries
            .values()
            .filter(|e| !e.waiting && !e.slots.is_empty())
            .count();
        let spread = may_spread && spreads(holding, max);
        let best = self
            .entries
            .iter()
            // Never twice on one connection (a lock's key is on none here: else it was busy
            // above).
            .filter(|(_, e)| !e.waiting && !e.slots.contains_key(key))
            .min_by_key(|(_, e)| {
                let placement = if spread {
                    e.slots.len()
                } else {
                    usize::from(e.slots.is_empty())
                };
                (e.busy(), placement)
            })
            .map(|(id, e)| (*id, e.busy(), e.slots.is_empty()));
        let may_open = self.total < max;
        let id = match best {
            Some((id, 0, holds_none)) if holds_none || !(spread && may_open) => id,
            Some((_, 0, _)) => {
                self.total = self.total.saturating_add(1);
                return SharedPick::OpenToSpread;
            }
            _ if may_open => {
                self.total = self.total.saturating_add(1);
                return SharedPick::Open;
            }
            Some((id, _, _)) => id,
            // Every connection not lent to a wait holds one of the key's permits or shares
            // already.
            None if capacity(claim) > 1 && self.entries.values().any(|e| !e.waiting) => {
                return SharedPick::Busy;
            }
            None => return SharedPick::Full,
        };
        let Some(entry) = self.entries.get_mut(&id) else {
            return SharedPick::Full;
        };
        entry.slots.insert(key.clone(), Slot::Attempt);
        entry.inflight = entry.inflight.saturating_add(1);
        let conn = entry.conn.clone();
        self.add_local(key, claim);
        SharedPick::Use(conn)
    }

    /// Picks a connection that holds nothing for one server-side wait, or counts a new one. At
    /// most `max - 1` connections wait at once (at least one), so attempts and releases always
    /// have a connection.
    pub(super) fn pick_waiting(&mut self, max: usize) -> WaitPick<C> {
        if self.waiting >= max.saturating_sub(1).max(1) {
            return WaitPick::Full;
        }
        if let Some(entry) = self.entries.values_mut().find(|e| e.is_idle()) {
            entry.waiting = true;
            self.waiting = self.waiting.saturating_add(1);
            return WaitPick::Use(entry.conn.clone());
        }
        if self.total < max {
            self.total = self.total.saturating_add(1);
            self.waiting = self.waiting.saturating_add(1);
            return WaitPick::Open;
        }
        WaitPick::Full
    }

    /// A connection counted by [`pick_shared`](Self::pick_shared) or
    /// [`pick_waiting`](Self::pick_waiting) did not open.
    pub(super) fn open_failed(&mut self, waiting: bool) {
        self.total = self.total.saturating_sub(1);
        if waiting {
            self.waiting = self.waiting.saturating_sub(1);
        }
    }

    /// A counted connection opened: registered idle, lent to a wait, or with `key` reserved for
    /// an attempt (with its claim). Returns false (and registers it idle) if `key` may not get
    /// another slot any more.
    pub(super) fn opened(
        &mut self,
        id: u64,
        conn: C,
        key: Option<(&K, Claim)>,
        waiting: bool,
    ) -> bool {
        let reserve = key.filter(|(k, claim)| self.may_reserve(k, *claim));
        let mut entry = Entry {
            conn,
            slots: HashMap::default(),
            waiting,
            inflight: 0,
            unlocking: 0,
        };
        if let Some((key, claim)) = reserve {
            entry.slots.insert(key.clone(), Slot::Attempt);
            entry.inflight = 1;
            self.add_local(key, claim);
        }
        self.entries.insert(id, entry);
        key.is_none() || reserve.is_some()
    }

    /// A connection opened outside the picks (the first, at connect time): idle.
    pub(super) fn adopt_idle(&mut self, id: u64, conn: C) {
        self.total = self.total.saturating_add(1);
        self.opened(id, conn, None, false);
    }

    /// The attempt on `id` ended: `key` is held there now, or its reservation goes. False if the
    /// connection closed meanwhile (its locks went with it).
    pub(super) fn attempt_done(&mut self, id: u64, key: &K, granted: bool) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else {
            return false;
        };
        entry.inflight = entry.inflight.saturating_sub(1);
        if granted {
            entry.slots.insert(key.clone(), Slot::Held);
        } else if entry.slots.remove(key).is_some() {
            self.drop_local(key);
        }
        true
    }

    /// The wait on `id` ended, granted `key` (with its claim) or not: the connection is shared
    /// again. False if it closed meanwhile.
    pub(super) fn wait_done(&mut self, id: u64, granted: Option<(&K, Claim)>) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else {
            return false;
        };
        if entry.waiting {
            entry.waiting = false;
            self.waiting = self.waiting.saturating_sub(1);
        }
        if let Some((key, claim)) = granted {
            // Counted before the slot is in: `add_local` looks at the key's other slots.
            self.add_local(key, claim);
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.slots.insert(key.clone(), Slot::Held);
            }
        }
        true
    }

    /// An unlock of `key` is queued on `id`.
    pub(super) fn mark_releasing(&mut self, id: u64, key: &K) {
        if let Some(slot) = self.entries.get_mut(&id).and_then(|e| e.slots.get_mut(key)) {
            let attempt = matches!(slot, Slot::Attempt | Slot::Releasing { attempt: true });
            *slot = Slot::Releasing { attempt };
        }
    }

    /// An unlock starts on `id` (it may wait for the connection first).
    pub(super) fn unlock_started(&mut self, id: u64) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.unlocking = entry.unlocking.saturating_add(1);
        }
    }

    /// An unlock on `id` is over, whatever its outcome.
    pub(super) fn unlock_ended(&mut self, id: u64) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.unlocking = entry.unlocking.saturating_sub(1);
        }
    }

    /// `key` is released (or known gone) on `id`. Returns whether a connection may have freed up.
    pub(super) fn forget(&mut self, id: u64, key: &K) -> bool {
        let Some(entry) = self.entries.get_mut(&id) else {
            return false;
        };
        let slot = entry.slots.remove(key);
        if matches!(
            slot,
            Some(Slot::Attempt | Slot::Releasing { attempt: true })
        ) {
            entry.inflight = entry.inflight.saturating_sub(1);
        }
        if slot.is_some() {
            self.drop_local(key);
        }
        true
    }

    /// The connection `id` closed: forget it. Returns how many guards it held.
    pub(super) fn remove(&mut self, id: u64) -> Option<usize> {
        let entry = self.entries.remove(&id)?;
        self.total = self.total.saturating_sub(1);
        if entry.waiting {
            self.waiting = self.waiting.saturating_sub(1);
        }
        let mut held = 0usize;
        for (key, slot) in &entry.slots {
            self.drop_local(key);
            if *slot == Slot::Held {
                held = held.saturating_add(1);
            }
        }
        Some(held)
    }

    /// The connection holding `key` for a guard.
    pub(super) fn holder(&self, key: &K) -> Option<&C> {
        self.entries
            .values()
            .find(|e| e.slots.get(key) == Some(&Slot::Held))
            .map(|e| &e.conn)
    }

    /// The least busy connection not lent to a wait.
    pub(super) fn least_busy_shared(&self) -> Option<C> {
        self.entries
            .values()
            .filter(|e| !e.waiting)
            .min_by_key(|e| e.busy())
            .map(|e| e.conn.clone())
    }

    /// Every connection, in no order.
    pub(super) fn connections(&self) -> Vec<C> {
        self.entries.values().map(|e| e.conn.clone()).collect()
    }

    /// Whether connection `id` is open and not lent to a wait.
    pub(super) fn is_shared(&self, id: u64) -> bool {
        self.entries.get(&id).is_some_and(|e| !e.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry<&'static str, u64> {
        Registry::default()
    }

    /// A lock's claim (1) or a semaphore's (`n` permits).
    fn limit(n: u32) -> Claim {
        Claim {
            limit: n,
            shared: false,
        }
    }

    const SHARE: Claim = Claim {
        limit: 1,
        shared: true,
    };

    #[test]
    fn a_key_is_reserved_once_per_client() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Use(1)
        ));
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Busy
        ));
        assert!(reg.attempt_done(1, &"a", true));
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Busy
        ));
        reg.mark_releasing(1, &"a");
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Settling
        ));
        reg.forget(1, &"a");
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Use(1)
        ));
    }

    #[test]
    fn busy_connections_spread_attempts_up_to_the_limit() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 2),
            SharedPick::Use(1)
        ));
        assert!(matches!(
            reg.pick_shared(&"b", limit(1), 2),
            SharedPick::Open
        ));
        assert!(reg.opened(2, 2, Some((&"b", limit(1))), false));
        // At the limit: share the least busy one.
        assert!(matches!(
            reg.pick_shared(&"c", limit(1), 2),
            SharedPick::Use(_)
        ));
        assert_eq!(reg.total(), 2);
    }

    #[test]
    fn attempts_avoid_a_connection_busy_with_an_unlock() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 3),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"a", true);
        // With a limit of three, one connection holding locks is already half: the next lock
        // gathers there.
        assert!(matches!(
            reg.pick_shared(&"b", limit(1), 3),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"b", false);
        // While "a"'s unlock runs there, the next attempt does not queue behind it.
        reg.unlock_started(1);
        assert!(matches!(
            reg.pick_shared(&"b", limit(1), 3),
            SharedPick::Open
        ));
        assert!(reg.opened(2, 2, Some((&"b", limit(1))), false));
        reg.attempt_done(2, &"b", false);
        assert!(matches!(
            reg.pick_shared(&"c", limit(1), 3),
            SharedPick::Use(2)
        ));
        reg.attempt_done(2, &"c", false);
        reg.unlock_ended(1);
        reg.forget(1, &"a");
        assert!(matches!(
            reg.pick_shared(&"d", limit(1), 3),
            SharedPick::Use(_)
        ));
        assert_eq!(reg.total(), 2);
    }

    #[test]
    fn locks_spread_over_half_the_limit_then_gather() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        let keys = ["a", "b", "c", "d", "e", "f"];
        assert!(matches!(
            reg.pick_shared(&keys[0], limit(1), 10),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &keys[0], true);
        // Each free connection holds a lock: the next attempt gets a connection of its own,
        // so that it never delays a holder's release.
        for (id, key) in (2..=5).zip(&keys[1..5]) {
            assert!(matches!(
                reg.pick_shared(key, limit(1), 10),
                SharedPick::OpenToSpread
            ));
            assert!(reg.opened(id, id, Some((key, limit(1))), false));
            reg.attempt_done(id, key, true);
        }
        // Five of ten hold locks: the rest stay free for waits, and locks gather.
        let SharedPick::Use(gathered) = reg.pick_shared(&keys[5], limit(1), 10) else {
            panic!("a sixth lock opened a connection");
        };
        reg.attempt_done(gathered, &keys[5], false);
        assert_eq!(reg.total(), 5);
        // A connection whose locks are all released is the first choice again.
        reg.forget(3, &"c");
        assert!(matches!(
            reg.pick_shared(&"g", limit(1), 10),
            SharedPick::Use(3)
        ));
        // The other half of the limit is for waits.
        assert!(matches!(reg.pick_waiting(10), WaitPick::Open));
    }

    #[test]
    fn a_failed_open_to_spread_falls_back_to_a_free_connection() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 10),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"a", true);
        assert!(matches!(
            reg.pick_shared(&"b", limit(1), 10),
            SharedPick::OpenToSpread
        ));
        reg.open_failed(false);
        assert!(matches!(
            reg.pick_shared_gathered(&"b", limit(1), 10),
            SharedPick::Use(1)
        ));
        assert_eq!(reg.total(), 1);
    }

    #[test]
    fn waits_take_only_idle_connections_and_leave_one_over() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 3),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"a", true);
        // Connection 1 holds a lock: a wait opens its own.
        assert!(matches!(reg.pick_waiting(3), WaitPick::Open));
        reg.opened(2, 2, None, true);
        assert!(matches!(reg.pick_waiting(3), WaitPick::Open));
        reg.opened(3, 3, None, true);
        // Two of three wait: the third may not.
        assert!(matches!(reg.pick_waiting(3), WaitPick::Full));
        assert!(reg.wait_done(2, Some((&"b", limit(1)))));
        assert!(reg.holds(&"b"));
        assert_eq!(reg.holder(&"b"), Some(&2));
    }

    #[test]
    fn a_closed_connection_takes_its_slots_along() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 2),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"a", true);
        assert_eq!(reg.remove(1), Some(1));
        assert!(!reg.holds(&"a"));
        assert_eq!(reg.total(), 0);
        assert!(!reg.attempt_done(1, &"a", false));
    }

    #[test]
    fn a_semaphore_key_takes_up_to_its_limit_of_connections_once_each() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 4),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"s", true);
        // Not on connection 1 again: the server would stack it there.
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 4),
            SharedPick::Open
        ));
        assert!(reg.opened(2, 2, Some((&"s", limit(3))), false));
        reg.attempt_done(2, &"s", true);
        // Another limit, or a lock, is refused here without asking the server.
        assert!(matches!(
            reg.pick_shared(&"s", limit(4), 4),
            SharedPick::Mismatch(3)
        ));
        assert!(matches!(
            reg.pick_shared(&"s", limit(1), 4),
            SharedPick::Mismatch(3)
        ));
        assert!(!reg.full(&"s", limit(3)));
        assert!(!reg.full(&"s", limit(1)));
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 4),
            SharedPick::Open
        ));
        assert!(reg.opened(3, 3, Some((&"s", limit(3))), false));
        reg.attempt_done(3, &"s", true);
        assert!(reg.full(&"s", limit(3)));
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 4),
            SharedPick::Busy
        ));
        // A connection holding none of them takes the next after a release.
        reg.forget(2, &"s");
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 4),
            SharedPick::Use(2)
        ));
        reg.attempt_done(2, &"s", true);
        // Every connection holds one, and no other may open: busy.
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 1),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"s", true);
        assert!(matches!(
            reg.pick_shared(&"s", limit(3), 1),
            SharedPick::Busy
        ));
    }

    #[test]
    fn a_key_whose_holders_are_all_releasing_settles_before_another_limit() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"a", limit(1), 4),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"a", true);
        reg.mark_releasing(1, &"a");
        assert!(matches!(
            reg.pick_shared(&"a", limit(3), 4),
            SharedPick::Settling
        ));
        reg.forget(1, &"a");
        assert!(matches!(
            reg.pick_shared(&"a", limit(3), 4),
            SharedPick::Use(1)
        ));
    }

    #[test]
    fn readers_share_a_key_once_per_connection_and_exclude_the_writer() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"r", SHARE, 2),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"r", true);
        // A second reader of this client goes to another connection: one holding the share
        // would be granted the writer's lock beside it.
        assert!(matches!(reg.pick_shared(&"r", SHARE, 2), SharedPick::Open));
        assert!(reg.opened(2, 2, Some((&"r", SHARE)), false));
        reg.attempt_done(2, &"r", true);
        assert!(!reg.full(&"r", SHARE));
        // Every connection holds a share and none may open: busy, as for permits.
        assert!(matches!(reg.pick_shared(&"r", SHARE, 2), SharedPick::Busy));
        // This client's readers make its writer busy without asking the server, and a
        // semaphore of the name is a mismatch with the lock the readers share.
        assert!(matches!(
            reg.pick_shared(&"r", limit(1), 2),
            SharedPick::Busy
        ));
        assert!(matches!(
            reg.pick_shared(&"r", limit(3), 2),
            SharedPick::Mismatch(1)
        ));
        reg.mark_releasing(1, &"r");
        reg.mark_releasing(2, &"r");
        assert!(matches!(
            reg.pick_shared(&"r", limit(1), 2),
            SharedPick::Settling
        ));
        reg.forget(1, &"r");
        reg.forget(2, &"r");
        assert!(matches!(
            reg.pick_shared(&"r", limit(1), 2),
            SharedPick::Use(_)
        ));
        // And the writer makes a reader busy.
        assert!(matches!(reg.pick_shared(&"r", SHARE, 2), SharedPick::Busy));
        // A semaphore's name refuses readers here.
        assert!(matches!(
            reg.pick_shared(&"s", limit(2), 2),
            SharedPick::Use(_)
        ));
        assert!(matches!(
            reg.pick_shared(&"s", SHARE, 2),
            SharedPick::Mismatch(2)
        ));
    }

    #[test]
    fn a_wait_granted_while_the_other_mode_releases_takes_the_key_over() {
        let mut reg = registry();
        reg.adopt_idle(1, 1);
        assert!(matches!(
            reg.pick_shared(&"r", limit(1), 3),
            SharedPick::Use(1)
        ));
        reg.attempt_done(1, &"r", true);
        assert!(matches!(reg.pick_waiting(3), WaitPick::Open));
        reg.opened(2, 2, None, true);
        // The writer's unlock is queued; the server let a waiting reader in already.
        reg.mark_releasing(1, &"r");
        assert!(reg.wait_done(2, Some((&"r", SHARE))));
        reg.forget(1, &"r");
        assert!(matches!(
            reg.pick_shared(&"r", SHARE, 3),
            SharedPick::Use(1)
        ));
    }
}
