//! Where a name's keys live: `PREFIX/ENCODED-NAME/LEASE-NONCE`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dlock_api::LockName;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but `A-Z a-z 0-9 - . _ ~` is escaped as `%XX`, so an encoded name never contains
/// `/`: one name's key range (`PREFIX/ENCODED/`) can never be a prefix of another's, and no name
/// can reach outside the prefix. The encoding is injective (`%` itself is escaped).
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The key range of one lock name: every acquire of the name puts one key under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameKeys {
    /// `PREFIX/ENCODED/`: the range every key of this name starts with.
    pub(crate) range: String,
}

impl NameKeys {
    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        Self {
            range: format!("{prefix}/{}/", utf8_percent_encode(name.as_str(), ESCAPED)),
        }
    }

    /// The key of one acquire: the lease it rides on and a slot unique among the client's keys
    /// in use, so two tasks of one client on one name never share a key.
    pub(crate) fn key(&self, lease: i64, slot: u64) -> String {
        format!("{}{lease:016x}-{slot:016x}", self.range)
    }

    /// The name's leader record, `PREFIX/ENCODED0`: the first key after the range (its `/`
    /// raised to `0`, which is where etcd's own prefix range ends). It is under no name's range,
    /// so the queue's reads never see it, and the range `[range, record + "\0")` holds this
    /// name's keys and its record and nothing of any other name: an encoded name has no `/`,
    /// and no byte of its alphabet lies between `/` and `0`.
    pub(crate) fn leader_key(&self) -> String {
        let mut record = self.range.clone();
        record.pop();
        record.push('0');
        record
    }

    /// The end (exclusive) of the range of this name's keys and its leader record.
    pub(crate) fn election_end(&self) -> Vec<u8> {
        let mut end = self.leader_key().into_bytes();
        end.push(0);
        end
    }
}

/// The keys this client may have on the server. An acquire claims the first free slot of its
/// name and lease, and the claim lasts until the key is known gone, so the same few keys come
/// back acquire after acquire. etcd keeps a deleted key in its index until the next compaction,
/// and a read of the queue walks every key the name ever had there: with a fresh key per
/// acquire, a busy name's every acquire grew slower (three times slower after 27,000 acquires
/// on a server without auto-compaction).
#[derive(Debug, Default)]
pub(crate) struct KeysInUse(Arc<Mutex<HashSet<String>>>);

impl KeysInUse {
    /// Claims the first key of `lease` under `keys` that nothing of this client uses.
    pub(crate) fn claim(&self, keys: &NameKeys, lease: i64) -> Arc<KeyClaim> {
        let mut in_use = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (0..)
            .map(|slot| keys.key(lease, slot))
            .find(|key| !in_use.contains(key))
            .unwrap_or_default();
        in_use.insert(key.clone());
        Arc::new(KeyClaim {
            key,
            in_use: self.0.clone(),
            burned: AtomicBool::new(false),
        })
    }
}

/// One claimed key: free for another acquire once every holder of the claim has dropped it.
/// Shared by the acquire, its cleanup and its guard's lease.
#[derive(Debug)]
pub(crate) struct KeyClaim {
    key: String,
    in_use: Arc<Mutex<HashSet<String>>>,
    burned: AtomicBool,
}

impl KeyClaim {
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The key may outlive the claim on the server (a delete that failed, a forgotten guard's
    /// key left to its TTL): never name it again, or an acquire could take that key for one it
    /// created itself.
    pub(crate) fn burn(&self) {
        self.burned.store(true, Ordering::SeqCst);
    }
}

impl Drop for KeyClaim {
    fn drop(&mut self) {
        if !self.burned.load(Ordering::SeqCst) {
            let mut in_use = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
            in_use.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(name: &str) -> String {
        NameKeys::new("p", &LockName::new(name).unwrap()).range
    }

    #[test]
    fn names_cannot_collide_or_nest() {
        assert_eq!(range("orders/42"), "p/orders%2F42/");
        assert_eq!(range("a b%"), "p/a%20b%25/");
        assert_eq!(range(".."), "p/../");
        let names = ["a", "a/", "a/b", "a%2Fb", "A", "é", "%C3%A9", "a-", "a/0"];
        for x in names {
            for y in names {
                if x != y {
                    assert!(!range(y).starts_with(&range(x)), "{x:?} nests {y:?}");
                }
            }
        }
        let keys = NameKeys::new("p", &LockName::new("n").unwrap());
        assert_eq!(keys.key(0x1f, 7), "p/n/000000000000001f-0000000000000007");
    }

    #[test]
    fn a_leader_record_is_in_its_own_names_election_range_only() {
        let names = [
            "a", "a0", "a/", "a/b", "a.", "a-", "a%", "a~", "a_", "ab", "A", "é", "0", "a b",
        ];
        for x in names {
            let keys = NameKeys::new("p", &LockName::new(x).unwrap());
            let record = keys.leader_key();
            assert!(
                !record.starts_with(&keys.range),
                "{x:?}'s record is a queue key"
            );
            for y in names {
                let other = NameKeys::new("p", &LockName::new(y).unwrap());
                let (start, end) = (other.range.as_bytes(), other.election_end());
                let inside = record.as_bytes() >= start && record.as_bytes() < end.as_slice();
                assert_eq!(inside, x == y, "{x:?}'s record in {y:?}'s election range");
                assert!(
                    !record.starts_with(&other.range),
                    "{x:?}'s record under {y:?}"
                );
                // Another name's queue keys are never inside this name's election range.
                let key = other.key(1, 0);
                let (start, end) = (keys.range.as_bytes(), keys.election_end());
                let inside = key.as_bytes() >= start && key.as_bytes() < end.as_slice();
                assert_eq!(inside, x == y, "{y:?}'s key in {x:?}'s election range");
            }
        }
        let keys = NameKeys::new("p", &LockName::new("n").unwrap());
        assert_eq!(keys.leader_key(), "p/n0");
    }

    #[test]
    fn a_key_comes_back_only_when_nothing_holds_its_claim() {
        let keys = NameKeys::new("p", &LockName::new("n").unwrap());
        let in_use = KeysInUse::default();
        let first = in_use.claim(&keys, 1);
        let second = in_use.claim(&keys, 1);
        assert_eq!(first.key(), keys.key(1, 0));
        assert_eq!(second.key(), keys.key(1, 1));
        let shared = first.clone();
        drop(first);
        assert_eq!(
            in_use.claim(&keys, 1).key(),
            keys.key(1, 2),
            "still claimed"
        );
        drop(shared);
        assert_eq!(in_use.claim(&keys, 1).key(), keys.key(1, 0), "free again");
        second.burn();
        drop(second);
        let zero = in_use.claim(&keys, 1);
        assert_eq!(zero.key(), keys.key(1, 0));
        assert_eq!(
            in_use.claim(&keys, 1).key(),
            keys.key(1, 2),
            "a burned key is never named again"
        );
        assert_eq!(
            in_use.claim(&keys, 2).key(),
            keys.key(2, 0),
            "another lease, other keys"
        );
    }
}
