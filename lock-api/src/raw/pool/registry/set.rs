//! The registry's side of a set of keys tried together on one connection: every key reserved
//! there at once, or none.

use std::hash::Hash;

use super::{Entry, Registry};
use crate::raw::Claim;

/// Where a set's attempt runs.
pub(in crate::raw::pool) enum SetPick<C> {
    /// This client holds or is acquiring one of the keys: the answer is "busy".
    Busy,
    /// A key is in use here with another claim, or on its way out, or every connection is
    /// lent to a wait: each key's own attempt decides.
    OneByOne,
    /// Run on this connection (every key is reserved there).
    Use(C),
    /// Open a new connection (already counted), then [`Registry::reserve_all`] there.
    Open,
}

impl<K: Clone + Eq + Hash, C: Clone> Registry<K, C> {
    /// Picks the connection for an attempt on every key of `keys` (each claimed as `claim`)
    /// and reserves them all there: the least busy connection not lent to a wait, or a new one
    /// while even that one has a statement waiting or running and the limit allows. None of
    /// the keys may have a slot on this client: one the client holds makes the set busy.
    pub(in crate::raw::pool) fn pick_all(
        &mut self,
        keys: &[K],
        claim: Claim,
        max: usize,
    ) -> SetPick<C> {
        if let Some(pick) = self.settled_none(keys, claim) {
            return pick;
        }
        let best = self
            .entries
            .iter()
            .filter(|(_, e)| !e.waiting)
            .min_by_key(|(_, e)| e.busy())
            .map(|(id, e)| (*id, e.busy()));
        let id = match best {
            Some((id, 0)) => id,
            _ if self.total < max => {
                self.total = self.total.saturating_add(1);
                return SetPick::Open;
            }
            Some((id, _)) => id,
            None => return SetPick::OneByOne,
        };
        if self.reserve_all(id, keys, claim) {
            self.entries
                .get(&id)
                .map_or(SetPick::OneByOne, |e| SetPick::Use(e.conn.clone()))
        } else {
            SetPick::OneByOne
        }
    }

    /// Reserves every key of `keys` on connection `id` for one attempt each (counted in its
    /// load, and ended one by one with [`attempt_done`](Registry::attempt_done)); false, and
    /// nothing reserved, if a key has a slot on this client (taken since the pick) or the
    /// connection is gone or lent to a wait.
    pub(in crate::raw::pool) fn reserve_all(&mut self, id: u64, keys: &[K], claim: Claim) -> bool {
        if self.settled_none(keys, claim).is_some() {
            return false;
        }
        let Some(entry) = self.entries.get_mut(&id).filter(|e| !e.waiting) else {
            return false;
        };
        reserve_on(entry, keys);
        for key in keys {
            self.add_local(key, claim);
        }
        true
    }

    /// `None` when no key of `keys` has a slot on this client; else what the set's answer is.
    fn settled_none(&self, keys: &[K], claim: Claim) -> Option<SetPick<C>> {
        let mut answer = None;
        for key in keys {
            let Some(local) = self.local.get(key) else {
                continue;
            };
            if local.claim != claim || self.all_releasing(key) {
                return Some(SetPick::OneByOne);
            }
            answer = Some(SetPick::Busy);
        }
        answer
    }
}

/// Puts an attempt's slot of each key on `entry`.
fn reserve_on<K: Clone + Eq + Hash, C>(entry: &mut Entry<K, C>, keys: &[K]) {
    for key in keys {
        entry.slots.insert(key.clone(), super::Slot::Attempt);
        entry.inflight = entry.inflight.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::super::SharedPick;
    use super::*;

    const LOCK: Claim = Claim::LOCK;

    #[test]
    fn a_set_is_reserved_on_one_connection_or_not_at_all() {
        let mut registry: Registry<&'static str, u64> = Registry::default();
        assert!(matches!(
            registry.pick_all(&["a", "b"], LOCK, 4),
            SetPick::Open
        ));
        registry.opened(1, 1, None, false);
        assert!(registry.reserve_all(1, &["a", "b"], LOCK));
        assert!(registry.holds(&"a") && registry.holds(&"b"));
        // Another set with one of these keys is busy without asking the server.
        assert!(matches!(
            registry.pick_all(&["b", "c"], LOCK, 4),
            SetPick::Busy
        ));
        assert!(!registry.holds(&"c"));
        registry.attempt_done(1, &"a", true);
        registry.attempt_done(1, &"b", false);
        assert!(registry.holds(&"a") && !registry.holds(&"b"));
        // A free set goes to the connection with nothing in flight, even one holding locks.
        assert!(matches!(
            registry.pick_all(&["b", "c"], LOCK, 4),
            SetPick::Use(1)
        ));
    }

    #[test]
    fn a_key_in_use_with_another_claim_goes_one_by_one() {
        let mut registry: Registry<&'static str, u64> = Registry::default();
        registry.adopt_idle(1, 1);
        let permits = Claim {
            limit: 3,
            shared: false,
        };
        assert!(matches!(
            registry.pick_shared(&"a", permits, 4),
            SharedPick::Use(_)
        ));
        assert!(matches!(
            registry.pick_all(&["a", "b"], LOCK, 4),
            SetPick::OneByOne
        ));
        assert!(!registry.holds(&"b"));
    }
}
