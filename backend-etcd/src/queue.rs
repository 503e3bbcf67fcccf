//! The line of keys under one name: the acquire transaction that joins it, the read that says
//! where a key stands in it, and a waiter's watch on the keys ahead of its own.

use dlock_api::{LockError, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use crate::BACKEND;
use crate::client::Inner;
use crate::keys::NameKeys;
use crate::watch::{WatchEvent, WatchHandle, Watcher};

/// Up to how many keys ahead of its own a waiter tracks: when its read saw all of them, the
/// waiter watches every deletion under the name and holds the lock once it has seen each of
/// them go, without reading the queue again, which saves a linearizable read on each hand-off.
/// A longer queue costs a read after the predecessor's deletion, as in etcd's own recipe.
const PREDECESSORS_WATCHED: usize = 8;

/// The outcome of the acquire transaction, or of a re-read of the queue.
pub(crate) enum Queue {
    /// No key with a lower create revision: held.
    First,
    /// Keys below ours: wait.
    Behind(Behind),
    /// Our key is gone (its lease ended, or someone deleted it).
    Gone,
}

/// Where our key stands in a queue read.
pub(crate) struct Behind {
    /// The key just below ours.
    key: String,
    /// The keys below that one, when the read saw all of them (at most
    /// [`PREDECESSORS_WATCHED`]); `None` when there may be more.
    older: Option<Vec<String>>,
    /// The revision the read saw.
    seen: i64,
}

impl Inner {
    /// Reads the queue as seen from our key: the highest key created at or below our revision
    /// should be ours; the one below it, if any, is the one we wait for (and the ones below
    /// that, if few). Linearizable, so a member that lags cannot hide a live predecessor.
    pub(crate) async fn read_queue(
        &self,
        keys: &NameKeys,
        key: &str,
        revision: i64,
    ) -> Result<Queue> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(revision)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(QUEUE_READ)
            .with_keys_only();
        let range = keys.range.clone();
        let response = self
            .idempotent(|mut client| {
                let (range, options) = (range.clone(), options.clone());
                async move { client.get(range, Some(options)).await }
            })
            .await?;
        let seen = response.header().map_or(revision, |h| h.revision());
        Ok(queue_from(response.kvs(), key, revision, seen))
    }

    /// The acquire transaction: creates our key on `lease` unless it exists (a retried create
    /// finds its own key), and in the same transaction reads the newest keys of the name up to
    /// and including ours.
    pub(crate) async fn create(
        &self,
        keys: &NameKeys,
        key: &str,
        lease: i64,
    ) -> Result<(i64, Queue)> {
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(QUEUE_READ)
            .with_keys_only();
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
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
            return Ok((header, queue_from(newest, key, header, header)));
        }
        // A retry of a create that was applied: our key exists; read the queue from it.
        let Some(mine) = ranges.first().and_then(|kvs| kvs.first()) else {
            return Err(LockError::unexpected(
                BACKEND,
                "acquire found neither a free key nor its own",
            ));
        };
        let revision = mine.create_revision();
        Ok((revision, self.read_queue(keys, key, revision).await?))
    }

    /// A try: creates our key only if the name has no key at all (one transaction, no write
    /// when busy). `Some(revision)` when held.
    pub(crate) async fn create_if_free(
        &self,
        keys: &NameKeys,
        key: &str,
        lease: i64,
    ) -> Result<Option<i64>> {
        let txn = Txn::new()
            .when([Compare::create_revision(keys.range.clone(), CompareOp::Equal, 0).with_prefix()])
            .and_then([TxnOp::put(
                key,
                "",
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let response = self.txn(txn).await?;
        if response.succeeded() {
            return Ok(Some(response.header().map_or(0, |h| h.revision())));
        }
        // Busy; unless a retried attempt had already created our key while the name was free.
        let mine = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        Ok(mine.map(|kv| kv.create_revision()))
    }
}

/// How many keys a queue read asks for: ours, and the ones ahead of it a waiter watches.
const QUEUE_READ: i64 = PREDECESSORS_WATCHED as i64 + 1;

/// The queue from a read of the newest keys up to ours (newest first, at most [`QUEUE_READ`]).
fn queue_from(kvs: &[KeyValue], key: &str, revision: i64, seen: i64) -> Queue {
    let text = |kv: &KeyValue| String::from_utf8_lossy(kv.key()).into_owned();
    match kvs {
        [mine, ..] if mine.key() != key.as_bytes() || mine.create_revision() != revision => {
            Queue::Gone
        }
        [_] => Queue::First,
        [_, before, older @ ..] => Queue::Behind(Behind {
            key: text(before),
            // A full read may have left keys out; a shorter one saw every key ahead of ours.
            older: (kvs.len() < QUEUE_READ as usize).then(|| older.iter().map(text).collect()),
            seen,
        }),
        [] => Queue::Gone,
    }
}

/// A waiter's watch on its name: the deletions of every key of the name from just after the
/// read that showed the queue. One watch delivers them in revision order, so a deletion of our
/// own key is always seen before any later deletion of a key ahead of ours.
pub(crate) struct QueueWatch {
    pub(crate) watch: WatchHandle,
    /// The keys ahead of ours that the read showed and no deletion has removed since.
    ahead: Vec<String>,
    /// The read showed every key ahead of ours (at most [`PREDECESSORS_WATCHED`]).
    complete: bool,
    /// The key just ahead of ours.
    predecessor: String,
}

/// What a waiter does after an event of its [`QueueWatch`].
pub(crate) enum Next {
    /// Nothing that concerns us: wait on.
    Wait,
    /// Every key ahead of ours is gone, and ours is not: the lock is ours.
    Held,
    /// Read the queue to know.
    Read,
}

impl QueueWatch {
    pub(crate) fn start(watcher: &Watcher, keys: &NameKeys, queue: Behind) -> Self {
        let mut ahead = queue.older.clone().unwrap_or_default();
        ahead.push(queue.key.clone());
        Self {
            // From just after the read: no deletion can fall between.
            watch: watcher.watch_deletions_under(&keys.range, queue.seen.saturating_add(1)),
            ahead,
            complete: queue.older.is_some(),
            predecessor: queue.key,
        }
    }

    /// What the deletions of one watch response mean for us. etcd sends every event of a
    /// revision in one response, and revoking (or expiring) a lease deletes all its keys in one
    /// revision: the holder's ahead of ours and ours too, when both rode it. So the whole batch
    /// is read before deciding: the lock is ours only at a revision where our key still exists.
    pub(crate) fn on(&mut self, event: WatchEvent, ours: &str) -> Next {
        let WatchEvent::Deleted { keys } = event else {
            return Next::Read;
        };
        if keys.iter().any(|key| **key == *ours.as_bytes()) {
            // The read finds our key gone and says so.
            return Next::Read;
        }
        let mut predecessor_gone = false;
        for key in &keys {
            // A key not ahead of ours is behind it.
            if let Some(at) = self.ahead.iter().position(|k| *k.as_bytes() == **key) {
                predecessor_gone |= self.ahead.swap_remove(at) == self.predecessor;
            }
        }
        if self.complete && self.ahead.is_empty() {
            // No key created before ours can appear any more, and ours was not deleted first.
            Next::Held
        } else if !self.complete && predecessor_gone {
            Next::Read
        } else {
            Next::Wait
        }
    }
}
