//! Elections on the lock's queue: the leader is the name's oldest key, its value the one that
//! key was put with as a candidate (`lead:VALUE`), until the leader proclaims another: that goes
//! in a record beside the queue (`PREFIX/ENCODED0`, see [`NameKeys::leader_key`]) that the
//! leader's key puts on its own lease. A candidate's key carries its value from its creation,
//! so the revision that makes it the oldest (its predecessor's deletion) is the one that makes
//! it lead with its value, with no write after its grant. Observers watch the name's keys and
//! the record in one watch, so a hand-over reaches them as that one revision.

use std::collections::VecDeque;
use std::sync::Arc;

use dlock_api::raw::OBSERVE_RETRY;
use dlock_api::{FencingToken, Leader, LeaderEvent, LeaderStream, Result};
use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use futures::StreamExt;

use crate::client::Inner;
use crate::keys::NameKeys;
use crate::queue::{candidate_value, oldest_key};
use crate::watch::{WatchEvent, WatchHandle};

/// The leader record of the name whose queue holds `key` (`PREFIX/ENCODED/LEASE-SLOT`): the
/// range's `/` raised to `0`, as [`NameKeys::leader_key`].
pub(crate) fn record_of(key: &str) -> String {
    let range_end = key.rfind('/').unwrap_or(key.len());
    let mut record = String::with_capacity(range_end.saturating_add(1));
    record.push_str(key.get(..range_end).unwrap_or(key));
    record.push('0');
    record
}

/// A record's value: the term in decimal, `:`, the leader's value (readable with `etcdctl`).
pub(crate) fn encode(term: i64, value: &[u8]) -> Vec<u8> {
    let mut record = format!("{term}:").into_bytes();
    record.extend_from_slice(value);
    record
}

/// The term and value of a record; `None` for bytes no dlock client writes.
fn decode(record: &[u8]) -> Option<(i64, &[u8])> {
    let colon = record.iter().position(|&b| b == b':')?;
    let term = std::str::from_utf8(record.get(..colon)?)
        .ok()?
        .parse()
        .ok()?;
    Some((term, record.get(colon.saturating_add(1)..)?))
}

/// The leader a read shows: the record, if its term is the oldest key's create revision (the
/// key that holds the name: a proclaim after its grant); else the campaign value that key was
/// put with, at that term; else nobody (a record left by an earlier term, a plain lock's key).
fn leader_from(oldest: Option<&KeyValue>, record: Option<&KeyValue>) -> Option<Leader> {
    let oldest = oldest?;
    let holder = oldest.create_revision();
    let proclaimed = record
        .and_then(|record| decode(record.value()))
        .filter(|&(term, _)| term == holder)
        .map(|(_, value)| value);
    let value = proclaimed.or_else(|| candidate_value(oldest))?;
    Some(Leader::new(
        FencingToken::new(u64::try_from(holder).ok()?),
        value,
    ))
}

impl Inner {
    /// The name's leader, and the revision the read saw: one transaction of two reads (the
    /// oldest key and the record), linearizable, at revision `at` or the newest.
    pub(crate) async fn read_leader(
        &self,
        keys: &NameKeys,
        at: Option<i64>,
    ) -> Result<(Option<Leader>, i64)> {
        let revision = at.unwrap_or(0);
        let txn = Txn::new().and_then([
            TxnOp::get(
                keys.range.clone(),
                Some(oldest_key().with_revision(revision)),
            ),
            TxnOp::get(
                keys.leader_key(),
                Some(GetOptions::new().with_revision(revision)),
            ),
        ]);
        let response = self.txn(txn).await?;
        let seen = response.header().map_or(0, |h| h.revision());
        let mut reads = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
            _ => None,
        });
        let (oldest, record) = (reads.next().flatten(), reads.next().flatten());
        Ok((leader_from(oldest.as_ref(), record.as_ref()), seen))
    }
}

fn event(leader: Option<Leader>) -> LeaderEvent {
    match leader {
        Some(leader) => LeaderEvent::Leads(leader),
        None => LeaderEvent::Vacant,
    }
}

/// An observer: a read, then a watch from the revision after it.
struct Observer {
    inner: Arc<Inner>,
    keys: NameKeys,
    /// The watch on the name's keys and record; `None` when the next step is a fresh read.
    watch: Option<WatchHandle>,
    /// Items to hand out before doing anything else.
    ready: VecDeque<Result<LeaderEvent>>,
    /// The next fresh read follows a gap: it is announced as `Missed`.
    gap: bool,
    /// The failure going on was reported already (one error item per failure).
    failing: bool,
}

impl Observer {
    /// Reads the leader now and watches from the revision after the read.
    async fn read_and_watch(&mut self) {
        if self.failing {
            tokio::time::sleep(OBSERVE_RETRY).await;
        }
        match self.inner.read_leader(&self.keys, None).await {
            Ok((leader, seen)) => {
                self.failing = false;
                if std::mem::replace(&mut self.gap, false) {
                    self.ready.push_back(Ok(LeaderEvent::Missed));
                }
                self.ready.push_back(Ok(event(leader)));
                self.watch = Some(self.inner.watcher.watch_range(
                    &self.keys.range,
                    self.keys.election_end(),
                    seen.saturating_add(1),
                ));
            }
            Err(error) => {
                self.gap = true;
                if !std::mem::replace(&mut self.failing, true) {
                    self.ready.push_back(Err(error));
                }
            }
        }
    }

    /// The next item: what is ready, else the next change (woken by the watch), else a read.
    async fn next(&mut self) -> Result<LeaderEvent> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return item;
            }
            let Some(watch) = self.watch.as_mut() else {
                self.read_and_watch().await;
                continue;
            };
            match watch.next().await {
                WatchEvent::Changed { revisions } => {
                    for revision in revisions {
                        match self.inner.read_leader(&self.keys, Some(revision)).await {
                            Ok((leader, _)) => self.ready.push_back(Ok(event(leader))),
                            // Compacted since, or the server failed: read it as it is now,
                            // saying changes may have passed.
                            Err(_) => {
                                self.gap = true;
                                self.watch = None;
                                break;
                            }
                        }
                    }
                }
                WatchEvent::Deleted { .. } | WatchEvent::Reread => {
                    // The watch cannot go on from where it was (its history compacted away,
                    // or the client's watch stream gone with its runtime).
                    self.gap = true;
                    self.watch = None;
                }
            }
        }
    }
}

/// The stream of `keys`'s leader changes: the state now, then one state per revision that
/// touched the name's keys or record, each read at that revision. Dropping it cancels the
/// watch.
pub(crate) async fn observe(inner: Arc<Inner>, keys: NameKeys) -> Result<LeaderStream> {
    let mut observer = Observer {
        inner,
        keys,
        watch: None,
        ready: VecDeque::new(),
        gap: false,
        failing: false,
    };
    // The first state is read here, so a server that does not answer fails the call.
    let (leader, seen) = observer.inner.read_leader(&observer.keys, None).await?;
    observer.ready.push_back(Ok(event(leader)));
    observer.watch = Some(observer.inner.watcher.watch_range(
        &observer.keys.range,
        observer.keys.election_end(),
        seen.saturating_add(1),
    ));
    Ok(
        futures::stream::unfold(observer, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
        .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_api::LockName;

    #[test]
    fn a_record_is_found_from_a_key_of_its_name() {
        let keys = NameKeys::new("/p", &LockName::new("a/b c").unwrap());
        assert_eq!(record_of(&keys.key(0x1f, 3)), keys.leader_key());
    }

    #[test]
    fn records_round_trip_and_junk_is_nobody() {
        let record = encode(42, b"host:1:2");
        assert_eq!(decode(&record), Some((42, &b"host:1:2"[..])));
        assert_eq!(decode(&encode(7, b"")), Some((7, &b""[..])));
        assert_eq!(decode(b"no colon"), None);
        assert_eq!(decode(b"x:1"), None);
    }
}
