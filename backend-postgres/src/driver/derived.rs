//! The advisory keys a semaphore's and a reader's statements bind, derived from the name's key
//! once per client instead of at every attempt: each is the SHA-256 of a name formatted for it
//! ([`slot_key`]), and a permit's acquire and release bind a dozen of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::key::{gate_key, limit_key, room_key, slot_key};
use crate::listen::permit_channel;
use crate::sql::Gated;

/// How many semaphores' keys a client remembers; past it, it forgets them all and derives
/// again (a service with more names than this in turn pays the derivation, no more).
const REMEMBERED: usize = 4096;

/// The keys of a semaphore of `permits` on one name's 64-bit key (a reader's statements use
/// those of a semaphore of one: its gate, and its limit key as the readers' mark).
#[derive(Debug)]
pub(crate) struct SemaphoreKeys {
    pub(crate) gate: i64,
    pub(crate) limit: i64,
    pub(crate) room: i64,
    /// Slot `i`'s key at `i`.
    pub(crate) slots: Box<[i64]>,
    /// The channel a release notifies while a waiter is first in line.
    pub(crate) channel: String,
}

impl SemaphoreKeys {
    fn new(key: i64, permits: u32) -> Self {
        Self {
            gate: gate_key(key),
            limit: limit_key(key, permits),
            room: room_key(key),
            slots: (0..permits).map(|slot| slot_key(key, slot)).collect(),
            channel: permit_channel(key),
        }
    }

    /// The gate and limit keys an attempt binds besides the name's own.
    pub(crate) fn gated(&self) -> Gated {
        Gated {
            gate: self.gate,
            limit: self.limit,
        }
    }

    /// The slot keys from slot `first` round, the order an attempt tries them in.
    pub(crate) fn slots_from(&self, first: u32) -> Vec<i64> {
        let mut order = self.slots.to_vec();
        if let Some(first) = usize::try_from(first)
            .ok()
            .and_then(|first| first.checked_rem(order.len()))
        {
            order.rotate_left(first);
        }
        order
    }
}

/// The semaphores' keys this client derived, by name key and limit.
#[derive(Debug, Default)]
pub(crate) struct DerivedKeys {
    made: Mutex<HashMap<(i64, u32), Arc<SemaphoreKeys>>>,
}

impl DerivedKeys {
    /// The keys of a semaphore of `permits` on `key`.
    pub(crate) fn of(&self, key: i64, permits: u32) -> Arc<SemaphoreKeys> {
        // A poisoned map only ever held finished entries: keep using it.
        let known = self
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(key, permits))
            .cloned();
        if let Some(keys) = known {
            return keys;
        }
        // Derived outside the lock: two attempts that race here derive the same keys.
        let keys = Arc::new(SemaphoreKeys::new(key, permits));
        let mut made = self.made.lock().unwrap_or_else(PoisonError::into_inner);
        if made.len() >= REMEMBERED {
            made.clear();
        }
        made.insert((key, permits), keys.clone());
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_are_the_ones_the_server_sees() {
        let derived = DerivedKeys::default();
        let keys = derived.of(42, 3);
        assert_eq!(keys.gate, gate_key(42));
        assert_eq!(keys.limit, limit_key(42, 3));
        assert_eq!(keys.room, room_key(42));
        assert_eq!(keys.channel, permit_channel(42));
        assert_eq!(
            &*keys.slots,
            &[slot_key(42, 0), slot_key(42, 1), slot_key(42, 2)]
        );
        assert_eq!(
            keys.slots_from(2),
            vec![slot_key(42, 2), slot_key(42, 0), slot_key(42, 1)]
        );
        assert!(Arc::ptr_eq(&keys, &derived.of(42, 3)));
        assert_eq!(derived.of(42, 4).limit, limit_key(42, 4));
    }

    #[test]
    fn a_full_memory_starts_over() {
        let derived = DerivedKeys::default();
        for key in 0..=i64::try_from(REMEMBERED).unwrap() {
            derived.of(key, 2);
        }
        assert!(derived.made.lock().unwrap().len() <= REMEMBERED);
    }
}
