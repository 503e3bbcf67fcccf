//! Where a name's keys live: `PREFIX/ENCODED-NAME/LEASE-NONCE`.

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

    /// The key of one acquire: the lease it rides on and a nonce unique to the acquire, so two
    /// tasks of one client on one name never share a key.
    pub(crate) fn key(&self, lease: i64, nonce: u64) -> String {
        format!("{}{lease:016x}-{nonce:016x}", self.range)
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
}
