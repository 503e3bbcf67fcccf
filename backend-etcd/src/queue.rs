//! The line of keys under one name: the acquire transaction that joins it, the read that says
//! where a key stands in it, and a waiter's watch on the keys ahead of its own. A key holds one
//! of the name's `limit` permits (a lock has one) while fewer than `limit` keys of the name have
//! a lower create revision; a reader's key holds while no key but readers' is older. Each key's
//! value carries what it was put for.

use std::sync::Arc;

use dlock_api::raw::Claim;
use dlock_api::{LockError, LockOptions, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use crate::BACKEND;
use crate::client::Inner;
use crate::keys::NameKeys;
use crate::watch::{WatchEvent, WatchHandle, Watcher};

/// Up to how many keys ahead of its own a waiter tracks at least: when its read saw all of
/// them, the waiter watches every deletion under the name and holds once fewer than its limit
/// are left, without reading the queue again, which saves a linearizable read on each hand-off.
/// A longer queue costs a read once fewer than the limit of the keys it saw are left.
const PREDECESSORS_WATCHED: usize = 8;

/// The value of a reader's key.
const READER: &[u8] = b"read";

/// What starts the value of a candidate's key, before its campaign value: no limit (digits)
/// and no reader's value starts so, and a byte of the value is never taken for one.
const CANDIDATE: &[u8] = b"lead:";

/// The value a key is put with: the name's limit, empty for a lock (one permit), as every key
/// was before semaphores, so a lock's key costs no byte more and no allocation; `read` for a
/// reader's; `lead:VALUE` for a campaign's candidate (a lock's claim that `leads_with` its
/// campaign value), so that the key names its leader's value from the revision it becomes the
/// oldest, and a new leader leads with no write of its own after its grant.
pub(crate) fn claim_value(asked: Claim, leads_with: Option<&[u8]>) -> Vec<u8> {
    if asked.shared {
        READER.to_vec()
    } else if asked.limit == 1 {
        match leads_with {
            Some(value) => [CANDIDATE, value].concat(),
            None => Vec::new(),
        }
    } else {
        asked.limit.to_string().into_bytes()
    }
}

/// The campaign value an acquire with `options` puts in its key: a campaign's, on a lock's
/// claim only (a permit or a reader's share never leads).
pub(crate) fn leads_with(asked: Claim, options: &LockOptions) -> Option<Arc<[u8]>> {
    options
        .campaign_value()
        .filter(|_| asked == Claim::LOCK)
        .map(Arc::from)
}

/// The campaign value a candidate's key carries; `None` for any other key.
pub(crate) fn candidate_value(kv: &KeyValue) -> Option<&[u8]> {
    kv.value().strip_prefix(CANDIDATE)
}

/// The limit a key's value says (see [`limit_of`]).
fn limit_in(value: &[u8]) -> u32 {
    match value {
        [] | READER => 1,
        value if value.starts_with(CANDIDATE) => 1,
        value => std::str::from_utf8(value)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or(0),
    }
}

/// Whether a key is a reader's.
fn is_reader(kv: &KeyValue) -> bool {
    kv.value() == READER
}

/// How many of a name's keys, oldest first, are readers that hold (every reader before the
/// first other key), and how many readers wait behind another key.
pub(crate) fn readers_in(line: &[KeyValue]) -> (usize, usize) {
    let holding = line.iter().take_while(|kv| is_reader(kv)).count();
    let waiting = line.iter().skip(holding).filter(|kv| is_reader(kv)).count();
    (holding, waiting)
}

/// The limit a key was put with (see [`claim_value`]; a reader's and a candidate's are a
/// lock's); a value no dlock client writes reads as 0, which no acquire asks, so such a key is a
/// mismatch to every acquire.
pub(crate) fn limit_of(kv: &KeyValue) -> u32 {
    limit_in(kv.value())
}

/// How many keys a queue read asks for: ours, and the ones ahead of it a waiter tracks, at
/// least `limit` of them (a read that grants must show every key ahead, to check their limit).
/// A reader's read has no limit (0): only every key ahead of it can show that no writer is.
fn queue_read(asked: Claim) -> i64 {
    if asked.shared {
        return 0;
    }
    let ahead = usize::try_from(asked.limit)
        .unwrap_or(usize::MAX)
        .max(PREDECESSORS_WATCHED);
    i64::try_from(ahead).unwrap_or(i64::MAX).saturating_add(1)
}

/// The outcome of the acquire transaction, or of a re-read of the queue.
pub(crate) enum Queue {
    /// Fewer keys with a lower create revision than the limit: held.
    First,
    /// As many keys below ours as the limit, or more: wait.
    Behind(Behind),
    /// Our key is gone (its lease ended, or someone deleted it).
    Gone,
    /// A key ahead of ours was put with this other limit.
    Mismatch(u32),
}

/// Where our key stands in a queue read.
pub(crate) struct Behind {
    /// The keys below ours that the read showed and that keep ours waiting (for a reader, the
    /// writers'), nearest first.
    ahead: Vec<String>,
    /// The read showed every key below ours.
    complete: bool,
    /// The revision the read saw.
    seen: i64,
}

/// A read of a name's oldest key (the first holder: the line is ordered by create revision),
/// whose answer's count is every key of the name.
pub(crate) fn oldest_key() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

impl Inner {
    /// A linearizable read of the oldest key of `name` and of how many keys it has.
    pub(crate) async fn read_oldest(&self, keys: &NameKeys) -> Result<(Option<KeyValue>, i64)> {
        let range = keys.range.clone();
        let mut response = self
            .idempotent(|mut client| {
                let range = range.clone();
                async move { client.get(range, Some(oldest_key())).await }
            })
            .await?;
        let count = response.count();
        Ok((response.take_kvs().into_iter().next(), count))
    }

    /// A linearizable read of every key of `name`, oldest first: an inspection that tells the
    /// readers that hold from those that wait.
    pub(crate) async fn read_line(&self, keys: &NameKeys) -> Result<Vec<KeyValue>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let range = keys.range.clone();
        let mut response = self
            .idempotent(|mut client| {
                let (range, options) = (range.clone(), options.clone());
                async move { client.get(range, Some(options)).await }
            })
            .await?;
        Ok(response.take_kvs())
    }

    /// Reads the queue as seen from our key: the highest key created at or below our revision
    /// should be ours; the ones below it are ahead of us. Linearizable, so a member that lags
    /// cannot hide a live predecessor.
    pub(crate) async fn read_queue(
        &self,
        keys: &NameKeys,
        key: &str,
        revision: i64,
        asked: Claim,
    ) -> Result<Queue> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(queue_read(asked));
        let range = keys.range.clone();
        let response = self
            .idempotent(|mut client| {
                let (range, options) = (range.clone(), options.clone());
                async move { client.get(range, Some(options)).await }
            })
            .await?;
        let seen = response.header().map_or(revision, |h| h.revision());
        Ok(queue_from(response.kvs(), key, (revision, seen), asked))
    }

    /// Whether, as a linearizable read says, our key (created at `revision`) is still there and
    /// so is each of `nearest`, keys created before it: then at least as many keys as there are
    /// in `nearest` are still ahead of ours. One transaction of compares on these few keys, where
    /// a read of the line sorts every key of the name: what a waiter deep in a long line checks
    /// against a lost watch event, so that the check costs the server the same at any length.
    pub(crate) async fn still_behind(
        &self,
        key: &str,
        revision: i64,
        nearest: &[String],
    ) -> Result<bool> {
        let mut compares = vec![Compare::create_revision(key, CompareOp::Equal, revision)];
        for ahead in nearest {
            // A missing key's create revision reads 0.
            compares.push(Compare::create_revision(
                ahead.as_str(),
                CompareOp::Greater,
                0,
            ));
            compares.push(Compare::create_revision(
                ahead.as_str(),
                CompareOp::Less,
                revision,
            ));
        }
        let response = self.txn(Txn::new().when(compares)).await?;
        Ok(response.succeeded())
    }

    /// The acquire transaction: creates our key on `lease`, with what it asks (and the campaign
    /// value it `leads_with`) as its value, unless it exists (a retried create finds its own
    /// key), and in the same transaction reads the newest keys of the name up to and including
    /// ours.
    pub(crate) async fn create(
        &self,
        keys: &NameKeys,
        key: &str,
        lease: i64,
        (asked, leads_with): (Claim, Option<&[u8]>),
    ) -> Result<(i64, Queue)> {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(queue_read(asked));
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    claim_value(asked, leads_with),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(keys.range.clone(), Some(newest)),
            ])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn(txn).await?;
        let header = response.header().map_or(0, |h| h.revision());
        let ranges: Vec<Vec<KeyValue>> = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            })
            .collect();
        if response.succeeded() {
            // Our put is the transaction's revision, and a read inside a write transaction sees
            // it: the answer is [ours, the ones before].
            let newest = ranges.first().map(Vec::as_slice).unwrap_or_default();
            return Ok((header, queue_from(newest, key, (header, header), asked)));
        }
        // A retry of a create that was applied: our key exists; read the queue from it.
        let Some(mine) = ranges.first().and_then(|kvs| kvs.first()) else {
            return Err(LockError::unexpected(
                BACKEND,
                "acquire found neither a free key nor its own",
            ));
        };
        let revision = mine.create_revision();
        Ok((revision, self.read_queue(keys, key, revision, asked).await?))
    }

    /// A try for a lock (one permit): creates our key only if the name has no key at all (one
    /// transaction, no write when busy; with one permit "held" is "no key ahead", which a
    /// compare can say, while "fewer than N" cannot). `Ok(Ok(revision))` when held,
    /// `Ok(Err(None))` when busy, `Ok(Err(Some(limit)))` when the name's oldest key was put
    /// with another limit.
    pub(crate) async fn create_if_free(
        &self,
        keys: &NameKeys,
        key: &str,
        lease: i64,
    ) -> Result<std::result::Result<i64, Option<u32>>> {
        let txn = Txn::new()
            .when([Compare::create_revision(keys.range.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                key,
                claim_value(Claim::LOCK, None),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([
                TxnOp::get(key, None),
                TxnOp::get(keys.range.clone(), Some(oldest_key())),
            ]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            return Ok(Ok(response.header().map_or(0, |h| h.revision())));
        }
        let mut ranges = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
                _ => None,
            });
        // Busy; unless a retried attempt had already created our key while the name was free.
        if let Some(mine) = ranges.next().and_then(|kvs| kvs.into_iter().next()) {
            return Ok(Ok(mine.create_revision()));
        }
        let in_use = ranges
            .next()
            .and_then(|kvs| kvs.first().map(limit_of))
            .filter(|&in_use| in_use != 1);
        Ok(Err(in_use))
    }
}

/// The queue from a read of the newest keys up to ours (newest first, at most
/// [`queue_read`]`(limit)`), at `(revision, seen)`: our key's create revision and the read's.
/// A key ahead put with another limit is a mismatch, whatever else the read says: two keys that
/// were ever in the line together must never hold by two limits (a lock's holder beside a
/// semaphore's), and every key that holds has seen, in the read that granted it, every key
/// ahead of it. A reader's read shows every key ahead; only the writers' among them (any key but
/// a reader's) keep it waiting, so it holds once none is left.
fn queue_from(kvs: &[KeyValue], key: &str, (revision, seen): (i64, i64), asked: Claim) -> Queue {
    let limit = asked.limit;
    let text = |kv: &KeyValue| String::from_utf8_lossy(kv.key()).into_owned();
    let Some((mine, ahead)) = kvs.split_first() else {
        return Queue::Gone;
    };
    if mine.key() != key.as_bytes() || mine.create_revision() != revision {
        return Queue::Gone;
    }
    if let Some(other) = ahead.iter().map(limit_of).find(|&l| l != limit) {
        return Queue::Mismatch(other);
    }
    // A full read may have left keys out; a shorter one (or one without a limit) saw every key
    // ahead of ours.
    let asked_for = queue_read(asked);
    let complete = asked_for == 0 || i64::try_from(kvs.len()).is_ok_and(|read| read < asked_for);
    let blocking: Vec<&KeyValue> = ahead
        .iter()
        .filter(|kv| !(asked.shared && is_reader(kv)))
        .collect();
    if complete && blocking.len() < usize::try_from(limit).unwrap_or(usize::MAX) {
        return Queue::First;
    }
    Queue::Behind(Behind {
        ahead: blocking.into_iter().map(text).collect(),
        complete,
        seen,
    })
}

/// A waiter's watch on its name: the deletions of every key of the name from just after the
/// read that showed the queue. One watch delivers them in revision order, so a deletion of our
/// own key is always seen before any later deletion of a key ahead of ours.
pub(crate) struct QueueWatch {
    pub(crate) watch: WatchHandle,
    ahead: Ahead,
    /// The watch covers only the nearest keys ahead and ours (see [`QueueWatch::start`]).
    nearest_only: bool,
}

/// What a waiter knows of the keys ahead of its own.
struct Ahead {
    /// The keys ahead of ours that the read showed and no deletion has removed since.
    keys: Vec<String>,
    /// The read showed every key ahead of ours.
    complete: bool,
    /// How many keys may be ahead of a holder.
    limit: usize,
}

/// What a waiter does after an event of its [`QueueWatch`].
pub(crate) enum Next {
    /// Nothing that concerns us: wait on.
    Wait,
    /// Fewer keys than the limit are ahead of ours, and ours is not gone: a permit is ours.
    Held,
    /// Read the queue to know.
    Read,
}

impl QueueWatch {
    /// Watches what `queue` says our key (`ours`) waits on. Near the head of the line (the read
    /// showed every key ahead, and no more than [`PREDECESSORS_WATCHED`] of them keep us
    /// waiting), one watch on the name's deletions counts them down exactly and grants without
    /// a read. Deeper in the line, the waiter watches only the nearest `limit` keys that keep it
    /// waiting, and its own: while those keys are there, at least `limit` are ahead of ours, so
    /// nothing can be ours, and a release elsewhere in the line costs this waiter nothing; any
    /// event makes it read the line again. So a release reaches the waiters near the head and
    /// the one behind it, not the whole line (a line of 1,000 waiters on one name once made every
    /// release an event for each of them). A semaphore of more permits than
    /// [`PREDECESSORS_WATCHED`] keeps the name-wide watch: a permit given back by any of its
    /// holders may be the one a waiter needs.
    pub(crate) fn start(
        watcher: &Watcher,
        keys: &NameKeys,
        (queue, ours): (Behind, &str),
        asked: Claim,
    ) -> Self {
        // From just after the read: no deletion can fall between.
        let start = queue.seen.saturating_add(1);
        let limit = usize::try_from(asked.limit).unwrap_or(usize::MAX);
        let near_the_head = queue.complete && queue.ahead.len() <= PREDECESSORS_WATCHED;
        if near_the_head || limit > PREDECESSORS_WATCHED {
            return Self {
                watch: watcher.watch_deletions_under(&keys.range, start),
                ahead: Ahead {
                    keys: queue.ahead,
                    complete: queue.complete,
                    limit,
                },
                nearest_only: false,
            };
        }
        let mut nearest = queue.ahead;
        nearest.truncate(limit);
        let watch = watcher.watch_keys(nearest.iter().map(String::as_str).chain([ours]), start);
        Self {
            watch,
            // Counted as a read that did not show the whole line: the first of these keys to
            // go leaves fewer than `limit` of them, and a read decides.
            ahead: Ahead {
                limit: nearest.len(),
                keys: nearest,
                complete: false,
            },
            nearest_only: true,
        }
    }

    /// The keys a watch on the nearest keys ahead waits on, when it is one: a fallback check
    /// of the line needs to look at these alone (see [`Inner::still_behind`]).
    pub(crate) fn nearest_watched(&self) -> Option<&[String]> {
        self.nearest_only.then_some(self.ahead.keys.as_slice())
    }

    /// What one event of the watch means for us (see [`Ahead::on`]).
    pub(crate) fn on(&mut self, event: WatchEvent, ours: &str) -> Next {
        self.ahead.on(event, ours)
    }
}

impl Ahead {
    /// What the deletions of one watch response mean for us. etcd sends every event of a
    /// revision in one response, and revoking (or expiring) a lease deletes all its keys in one
    /// revision: the holders' ahead of ours and ours too, when they rode it. So the whole batch
    /// is read before deciding: a permit is ours only at a revision where our key still exists.
    ///
    /// A deleted key counts only if the read showed it ahead of ours (a key it did not show may
    /// be behind ours, and a delete event does not say). No key created before ours can appear
    /// any more, so when the read showed every key ahead, the count of those left is exact; when
    /// it did not, the ones it showed are the nearest, and only once fewer than the limit of
    /// them are left can we hold: then a read decides.
    fn on(&mut self, event: WatchEvent, ours: &str) -> Next {
        let WatchEvent::Deleted { keys } = event else {
            return Next::Read;
        };
        if keys.iter().any(|key| **key == *ours.as_bytes()) {
            // The read finds our key gone and says so.
            return Next::Read;
        }
        for key in &keys {
            if let Some(at) = self.keys.iter().position(|k| *k.as_bytes() == **key) {
                self.keys.swap_remove(at);
            }
        }
        if self.keys.len() >= self.limit {
            Next::Wait
        } else if self.complete {
            Next::Held
        } else {
            Next::Read
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ahead(keys: &[&str], complete: bool, limit: usize) -> Ahead {
        Ahead {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            complete,
            limit,
        }
    }

    fn deleted(keys: &[&str]) -> WatchEvent {
        WatchEvent::Deleted {
            keys: keys.iter().map(|k| k.as_bytes().into()).collect(),
        }
    }

    #[test]
    fn a_candidates_key_is_a_locks_and_carries_its_value() {
        let lock = Claim::LOCK;
        let put = claim_value(lock, Some(b"host:1"));
        assert_eq!(put, b"lead:host:1");
        assert_eq!(put.strip_prefix(CANDIDATE), Some(&b"host:1"[..]));
        assert_eq!(limit_in(&put), 1);
        assert_eq!(limit_in(&claim_value(lock, Some(b""))), 1);
        // Keys put before candidates carried values read as they always did.
        assert_eq!(claim_value(lock, None), b"");
        assert_eq!(
            (limit_in(b""), limit_in(b"read"), limit_in(b"3")),
            (1, 1, 3)
        );
        assert_eq!(limit_in(b"junk"), 0);
        // Only a lock's claim carries a value: a permit's key says its limit, a reader's `read`.
        assert_eq!(claim_value(claim(3), Some(b"v")), b"3");
        let reader = Claim {
            shared: true,
            ..Claim::LOCK
        };
        assert_eq!(claim_value(reader, Some(b"v")), READER);
        let options = LockOptions::new();
        assert!(leads_with(lock, &options).is_none());
    }

    #[test]
    fn a_permit_is_ours_once_fewer_than_the_limit_are_left_ahead() {
        let mut line = ahead(&["h1", "h2", "h3", "w1"], true, 3);
        assert!(matches!(line.on(deleted(&["behind"]), "me"), Next::Wait));
        assert!(matches!(line.on(deleted(&["h2"]), "me"), Next::Wait));
        // Deleted twice (a resent event): counted once.
        assert!(matches!(line.on(deleted(&["h2"]), "me"), Next::Wait));
        assert!(matches!(line.on(deleted(&["w1"]), "me"), Next::Held));
    }

    #[test]
    fn our_own_key_in_the_batch_is_never_a_grant() {
        let mut line = ahead(&["h1", "h2"], true, 2);
        assert!(matches!(
            line.on(deleted(&["h1", "h2", "me"]), "me"),
            Next::Read
        ));
        let mut lock = ahead(&["h"], true, 1);
        assert!(matches!(lock.on(deleted(&["me", "h"]), "me"), Next::Read));
        assert!(matches!(lock.on(WatchEvent::Reread, "me"), Next::Read));
    }

    fn behind(ahead: usize, complete: bool) -> Behind {
        Behind {
            ahead: (0..ahead).map(|i| format!("k{i}")).collect(),
            complete,
            seen: 7,
        }
    }

    fn claim(limit: u32) -> Claim {
        Claim {
            limit,
            ..Claim::LOCK
        }
    }

    #[test]
    fn only_waiters_near_the_head_watch_the_whole_name() {
        let watcher = Watcher::new(tokio_util::sync::CancellationToken::new());
        let keys = NameKeys {
            range: "p/n/".to_owned(),
        };
        let start = |queue, asked| QueueWatch::start(&watcher, &keys, (queue, "me"), asked);
        // Near the head: every key ahead seen, a few of them: counted down exactly.
        assert_eq!(start(behind(3, true), claim(1)).nearest_watched(), None);
        // Deep in a line: the nearest key ahead (the nearest N of a semaphore of N) only.
        let deep = start(behind(8, false), claim(1));
        assert_eq!(deep.nearest_watched(), Some(&["k0".to_owned()][..]));
        let deep = start(behind(8, false), claim(3));
        assert_eq!(deep.nearest_watched().map(<[String]>::len), Some(3));
        // A semaphore of more permits than that keeps the name-wide watch.
        assert_eq!(start(behind(20, false), claim(20)).nearest_watched(), None);
    }

    #[test]
    fn a_longer_line_reads_once_fewer_than_the_limit_of_the_seen_keys_are_left() {
        // The nearest keys ahead; older ones the read did not show may still hold.
        let mut line = ahead(&["n1", "n2", "n3"], false, 2);
        assert!(matches!(line.on(deleted(&["older"]), "me"), Next::Wait));
        assert!(matches!(line.on(deleted(&["n3"]), "me"), Next::Wait));
        assert!(matches!(line.on(deleted(&["n1"]), "me"), Next::Read));
        let mut lock = ahead(&["n1", "n2"], false, 1);
        assert!(matches!(lock.on(deleted(&["n2"]), "me"), Next::Wait));
        assert!(matches!(lock.on(deleted(&["n1"]), "me"), Next::Read));
    }
}
