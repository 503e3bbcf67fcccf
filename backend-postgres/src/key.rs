//! `AdvisoryKey`: what a Postgres advisory lock is keyed by.

use std::fmt;

use dlock_api::{KeyMapper, LockName};

/// The key of a Postgres advisory lock.
///
/// Postgres advisory locks are keyed by one 64-bit integer or by a pair of 32-bit integers (two
/// separate key spaces: `Int(k)` never conflicts with any `Pair`). Names are mapped into the
/// 64-bit space with [`KeyMapper::hash_i64`] (the first 8 bytes of the name's SHA-256), so
/// `Name(n)` and `Int(KeyMapper::hash_i64(&n))` are the same lock.
///
/// ### Note: a hash collision can only make two names wait for each other
/// Two different names share a key with probability 2^-64 per pair; among `n` names in use at
/// once, about n²/2^65 (one in 37 million for a million names; see [`KeyMapper::hash_i64`]).
/// If it happens, the two names are one lock on the server: holding one makes the other wait (or
/// `try_acquire` return `None`). It never lets two holders in, because the server's exclusion is
/// on the key itself.
///
/// Callers whose data already has integer ids (`coupon 42`) pass [`AdvisoryKey::Int`] or
/// [`AdvisoryKey::Pair`] (`(table_oid, row_id)`, say) to
/// [`PostgresLock::acquire_key`](crate::PostgresLock::acquire_key) and keep the keys readable
/// in `pg_locks`.
#[derive(Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdvisoryKey {
    /// A lock name, hashed into the 64-bit key space.
    Name(LockName),
    /// A 64-bit key, used as is (`pg_advisory_lock(bigint)`).
    Int(i64),
    /// A pair of 32-bit keys, used as is (`pg_advisory_lock(int, int)`).
    Pair(i32, i32),
}

/// The server-side key: one of the two advisory key spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RawKey {
    Int(i64),
    Pair(i32, i32),
}

impl AdvisoryKey {
    /// The key the server sees.
    pub(crate) fn raw(&self) -> RawKey {
        match self {
            Self::Name(name) => RawKey::Int(KeyMapper::hash_i64(name)),
            Self::Int(k) => RawKey::Int(*k),
            Self::Pair(a, b) => RawKey::Pair(*a, *b),
        }
    }

    /// The name a guard for this key reports: the name itself, or `pg-advisory:K` /
    /// `pg-advisory:A,B` for integer keys.
    pub fn lock_name(&self) -> LockName {
        match self {
            Self::Name(name) => name.clone(),
            Self::Int(k) => LockName::new(format!("pg-advisory:{k}")).expect("valid name"),
            Self::Pair(a, b) => LockName::new(format!("pg-advisory:{a},{b}")).expect("valid name"),
        }
    }

    /// Where this key shows in `pg_locks` (`locktype = 'advisory'`): `(classid, objid,
    /// objsubid)`. For a 64-bit key, `classid` is its high 32 bits and `objid` its low 32 bits,
    /// with `objsubid = 1`; for a pair, `classid` and `objid` are the two keys, `objsubid = 2`.
    pub fn pg_locks_ids(&self) -> (u32, u32, i16) {
        match self.raw() {
            RawKey::Int(k) => ((k as u64 >> 32) as u32, k as u64 as u32, 1),
            RawKey::Pair(a, b) => (a as u32, b as u32, 2),
        }
    }
}

impl From<LockName> for AdvisoryKey {
    fn from(name: LockName) -> Self {
        Self::Name(name)
    }
}

impl From<&LockName> for AdvisoryKey {
    fn from(name: &LockName) -> Self {
        Self::Name(name.clone())
    }
}

impl From<i64> for AdvisoryKey {
    fn from(key: i64) -> Self {
        Self::Int(key)
    }
}

impl From<(i32, i32)> for AdvisoryKey {
    fn from((a, b): (i32, i32)) -> Self {
        Self::Pair(a, b)
    }
}

impl fmt::Debug for AdvisoryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => write!(f, "Name({name:?} -> {})", KeyMapper::hash_i64(name)),
            Self::Int(k) => write!(f, "Int({k})"),
            Self::Pair(a, b) => write!(f, "Pair({a}, {b})"),
        }
    }
}

impl fmt::Display for AdvisoryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => write!(f, "{name}"),
            Self::Int(k) => write!(f, "pg-advisory:{k}"),
            Self::Pair(a, b) => write!(f, "pg-advisory:{a},{b}"),
        }
    }
}

/// The advisory keys of a semaphore on the 64-bit key `key`, all in the 64-bit key space: each
/// is [`KeyMapper::hash_i64`] of a name made from the key's own lock name (`pg-advisory:K`),
/// so they are as unlikely to meet another name's keys as any two names are.
///
/// - slot `i` (`pg-advisory:K#i`, `i < permits`): a permit is the exclusive lock on one slot;
/// - the limit `N` (`pg-advisory:K#permits=N`): every holder of a semaphore of `N` holds it
///   shared, so the name's limit can be read (and checked) on the server;
/// - the gate (`pg-advisory:K#gate`): taken for one statement (transaction scope) by each
///   semaphore attempt, so the checks of two attempts on the name never interleave;
/// - the waiting room (`pg-advisory:K#room`): a waiting permit attempt holds it (on its own
///   session) while it is the first in line; the others queue for it in the server's lock
///   queue, and a release notifies only while someone holds it.
pub(crate) fn slot_key(key: i64, slot: u32) -> i64 {
    derived(key, &slot.to_string())
}

/// See [`slot_key`].
pub(crate) fn limit_key(key: i64, permits: u32) -> i64 {
    derived(key, &format!("permits={permits}"))
}

/// See [`slot_key`].
pub(crate) fn gate_key(key: i64) -> i64 {
    derived(key, "gate")
}

/// See [`slot_key`].
pub(crate) fn room_key(key: i64) -> i64 {
    derived(key, "room")
}

fn derived(key: i64, suffix: &str) -> i64 {
    let name = LockName::new(format!("pg-advisory:{key}#{suffix}")).expect("a short valid name");
    KeyMapper::hash_i64(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_their_hash_are_one_key() {
        let name = LockName::new("coupon:42").unwrap();
        let hashed = AdvisoryKey::Int(KeyMapper::hash_i64(&name));
        assert_eq!(AdvisoryKey::from(&name).raw(), hashed.raw());
        assert_ne!(AdvisoryKey::Pair(0, 1).raw(), AdvisoryKey::Int(1).raw());
    }

    #[test]
    fn pg_locks_ids_split_the_key() {
        assert_eq!(
            AdvisoryKey::Int(0x1234_5678_9abc_def0).pg_locks_ids(),
            (0x1234_5678, 0x9abc_def0, 1)
        );
        assert_eq!(AdvisoryKey::Int(-1).pg_locks_ids(), (u32::MAX, u32::MAX, 1));
        assert_eq!(AdvisoryKey::Pair(-1, 7).pg_locks_ids(), (u32::MAX, 7, 2));
    }
}
