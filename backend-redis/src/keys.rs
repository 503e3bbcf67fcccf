//! Key names: every key of one lock shares a hash tag, so they live in one Cluster slot.

use dlock_api::raw::config::config_error;
use dlock_api::{LockName, Result};

/// The keys and channel of one lock name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKeys {
    /// `PREFIX:{NAME}`: holds the owner's random token, with the lease as its TTL.
    pub lock: String,
    /// `PREFIX:{NAME}:fence`: the last fencing token handed out (kept ten minutes past the last
    /// grant, and while waiters may be queued).
    pub fence: String,
    /// `PREFIX:{NAME}:queue`: waiting owners, first in line first.
    pub queue: String,
    /// `PREFIX:{NAME}:waiters`: each waiting owner's presence deadline and requested lease.
    pub waiters: String,
    /// `PREFIX:{NAME}:released`: the channel releases announce grants and free locks on.
    pub channel: String,
    /// `PREFIX:{NAME}:released-by`: who released the lock last, for a minute, on a Sentinel or
    /// a Cluster, where a release may reach the server twice.
    pub released_by: String,
    /// `PREFIX:{NAME}:watch`: on Redlock's nodes, `CLIENT OWNER` of a holder that listens for
    /// its key being taken over (`node.rs`).
    pub watch: String,
}

impl LockKeys {
    /// The keys of `name` under `prefix`.
    ///
    /// The name goes between braces as the Cluster hash tag. Braces and backslashes in the name are
    /// escaped (`\` → `\\`, `{` → `\(`, `}` → `\)`), which is injective, so two names never share a
    /// key and the tag always ends at our own `}`.
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let mut tag = String::with_capacity(name.as_str().len().saturating_add(8));
        for c in name.as_str().chars() {
            match c {
                '\\' => tag.push_str("\\\\"),
                '{' => tag.push_str("\\("),
                '}' => tag.push_str("\\)"),
                c => tag.push(c),
            }
        }
        let mut lock =
            String::with_capacity(prefix.len().saturating_add(tag.len()).saturating_add(3));
        lock.push_str(prefix);
        lock.push_str(":{");
        lock.push_str(&tag);
        lock.push('}');
        // On every acquire: plain concatenation, not the formatting machinery.
        let suffixed = |suffix: &str| {
            let mut key = String::with_capacity(lock.len().saturating_add(suffix.len()));
            key.push_str(&lock);
            key.push_str(suffix);
            key
        };
        Self {
            fence: suffixed(":fence"),
            queue: suffixed(":queue"),
            waiters: suffixed(":waiters"),
            channel: suffixed(":released"),
            released_by: suffixed(":released-by"),
            watch: suffixed(":watch"),
            lock,
        }
    }

    /// `PREFIX:{NAME}:permits`: a semaphore's permits, or a reader-writer lock's readers, each
    /// owner scored by the end of its lease on the server's clock. Made on demand, not with the
    /// other keys: a lock's first attempt never needs it.
    pub fn permits(&self) -> String {
        let mut key = String::with_capacity(self.lock.len().saturating_add(8));
        key.push_str(&self.lock);
        key.push_str(":permits");
        key
    }

    /// `PREFIX:{NAME}:reader-watch`: the ids of the clients whose readers watch their share, to
    /// be told when a writer takes the name over a reader set whose mark went. Made on demand.
    pub(crate) fn reader_watchers(&self) -> String {
        let mut key = String::with_capacity(self.lock.len().saturating_add(13));
        key.push_str(&self.lock);
        key.push_str(":reader-watch");
        key
    }

    /// `PREFIX:{NAME}:released-by:OWNER`: that a permit of `owner` was released, for as long as
    /// [`released_by`](Self::released_by) says who released the lock: a name's permits are
    /// released by many owners at once, so each has its own. Made on demand.
    pub(crate) fn permit_released_by(&self, owner: &str) -> String {
        let mut key = String::with_capacity(
            self.released_by
                .len()
                .saturating_add(owner.len())
                .saturating_add(1),
        );
        key.push_str(&self.released_by);
        key.push(':');
        key.push_str(owner);
        key
    }

    /// `PREFIX:{NAME}:leader`: the name's leader record, `OWNER TERM VALUE`, written by a
    /// leader's proclaim; it counts only while its owner holds the lock (see the crate docs'
    /// Elections). Made on demand, as [`permits`](Self::permits).
    pub fn leader(&self) -> String {
        let mut key = String::with_capacity(self.lock.len().saturating_add(7));
        key.push_str(&self.lock);
        key.push_str(":leader");
        key
    }

    /// Checks a key prefix: not empty, and without braces, which would move the Cluster hash tag
    /// off the name.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for `backend`.
    pub fn check_prefix(backend: &'static str, prefix: &str) -> Result<()> {
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(config_error(
                backend,
                "option `prefix` must be non-empty and without braces",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(name: &str) -> LockKeys {
        LockKeys::new("dlock", &LockName::new(name).unwrap())
    }

    #[test]
    fn keys_share_one_hash_tag() {
        let k = keys("coupon:1");
        assert_eq!(k.lock, "dlock:{coupon:1}");
        assert_eq!(k.fence, "dlock:{coupon:1}:fence");
        assert_eq!(k.channel, "dlock:{coupon:1}:released");
        assert_eq!(k.leader(), "dlock:{coupon:1}:leader");
    }

    #[test]
    fn braces_are_escaped_injectively() {
        assert_eq!(keys("}x").lock, "dlock:{\\)x}");
        assert_ne!(keys("a\\)").lock, keys("a}").lock);
        assert_ne!(keys("{").lock, keys("\\(").lock);
    }
}
