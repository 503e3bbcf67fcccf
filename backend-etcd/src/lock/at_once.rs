//! A free set of locks in one transaction: every name's range compared empty, and this client's
//! key put under each, as a single try puts it (`Inner::create_if_free`), or nothing written.

use std::sync::Arc;

use dlock_api::raw::{Claim, Detach, GrantedAtOnce, PendingAcquire};
use dlock_api::{LockError, LockName, LockOptions, Result};
use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdLock, Kind, lease_for};
use crate::client::Inner;
use crate::keys::{KeyClaim, NameKeys};
use crate::queue::{claim_value, limit_of, oldest_key};

/// The most names one transaction takes; a larger set goes one by one. etcd refuses a
/// transaction of more than `--max-txn-ops` (128 by default) operations in a branch, and this
/// one has one compare, one put and one read per name; 64 names of the longest encoded form
/// also stay well under its 1.5 MiB request limit.
const MOST_AT_ONCE: usize = 64;

/// One member of the set: its name, the lease its key rides, and its key.
struct Member<'a> {
    name: &'a LockName,
    kind: Kind,
    range: String,
    claim: Arc<KeyClaim>,
}

/// What the set's transaction did.
enum SetTried {
    /// Every key of ours was put, at this revision.
    Taken(i64),
    /// A name has a key: nothing of ours was written.
    Busy,
    /// A name is in use with another limit (a semaphore's), or the server refused a
    /// transaction this large: nothing of ours was written, and a single try decides.
    OneByOne,
    /// Some keys of ours exist and not all: an answer lost, and a key gone since. Ours must go.
    Partly,
}

impl EtcdLock {
    /// [`RawLock::try_grant_at_once`](dlock_api::raw::RawLock::try_grant_at_once): one
    /// transaction for the whole set, each member's cleanup armed across it as a single try's
    /// is. A session lease the server no longer knows is replaced once.
    pub(super) async fn try_set_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<GrantedAtOnce> {
        if names.len() > MOST_AT_ONCE {
            return Ok(GrantedAtOnce::OneByOne);
        }
        let mut tries: u32 = 0;
        loop {
            let members = self.prepare_set(names, options).await?;
            let session = members.first().and_then(|m| m.kind.session().cloned());
            let result = self.try_set(members).await;
            if !self.replace_gone_session(&mut tries, &result, session.as_ref()) {
                return result;
            }
        }
    }

    /// Each member's lease and key: the one kept-alive lease of the TTL's class for all of
    /// them, or with renewal off a lease of each one's own, as its single try would have.
    async fn prepare_set<'a>(
        &self,
        names: &'a [LockName],
        options: &LockOptions,
    ) -> Result<Vec<Member<'a>>> {
        let inner = &self.inner;
        let first = lease_for(inner, options).await?;
        let session = first.session().cloned();
        let mut kinds = Vec::with_capacity(names.len());
        kinds.push(first);
        match session {
            Some(session) => {
                kinds.extend(names.iter().skip(1).map(|_| Kind::Session(session.clone())));
            }
            None => {
                let rest = names.iter().skip(1).map(|_| lease_for(inner, options));
                let mut failed = None;
                for granted in futures::future::join_all(rest).await {
                    match granted {
                        Ok(kind) => kinds.push(kind),
                        Err(error) => failed = Some(error),
                    }
                }
                if let Some(error) = failed {
                    kinds
                        .iter()
                        .filter_map(Kind::own_id)
                        .for_each(|id| inner.revoke_in_background(id));
                    return Err(error);
                }
            }
        }
        Ok(names
            .iter()
            .zip(kinds)
            .map(|(name, kind)| {
                let keys = NameKeys::new(&inner.config.prefix, name);
                let claim = inner.keys_in_use.claim(&keys, kind.id());
                Member {
                    name,
                    kind,
                    range: keys.range,
                    claim,
                }
            })
            .collect())
    }

    /// One transaction for `members`, run to its end even if this is dropped; each member's
    /// armed cleanup deletes its key (or revokes its own lease) unless its grant is made.
    async fn try_set(&self, members: Vec<Member<'_>>) -> Result<GrantedAtOnce> {
        let (pending, created): (Vec<PendingAcquire>, Vec<_>) =
            members.iter().map(|m| self.arm(&m.kind, &m.claim)).unzip();
        let puts: Vec<(String, String, i64)> = members
            .iter()
            .map(|m| (m.range.clone(), m.claim.key().to_owned(), m.kind.id()))
            .collect();
        let inner = self.inner.clone();
        let tried = Detach::new(async move {
            let result = inner.create_all_if_free(&puts).await;
            for created in created {
                let _ = created.send(result.is_ok());
            }
            result
        })
        .await;
        match tried {
            Ok(SetTried::Taken(revision)) => {
                let grants = members
                    .into_iter()
                    .map(|m| {
                        self.grant(
                            (m.name, Claim::LOCK.limit),
                            m.kind,
                            (m.claim, None),
                            revision,
                        )
                    })
                    .collect();
                pending.into_iter().for_each(PendingAcquire::disarm);
                Ok(GrantedAtOnce::Taken(grants))
            }
            Ok(SetTried::Busy) => Ok(self.nothing_written(&members, pending, GrantedAtOnce::Busy)),
            Ok(SetTried::OneByOne) => {
                Ok(self.nothing_written(&members, pending, GrantedAtOnce::OneByOne))
            }
            // The armed cleanups delete the keys of ours that exist.
            Ok(SetTried::Partly) => {
                drop(pending);
                Ok(GrantedAtOnce::Busy)
            }
            // Maybe applied: the armed cleanups delete the keys that exist.
            Err(error) => {
                drop(pending);
                Err(error)
            }
        }
    }

    /// The transaction wrote nothing of ours: no key to clean up, and the members' own leases
    /// (with renewal off) go.
    fn nothing_written(
        &self,
        members: &[Member<'_>],
        pending: Vec<PendingAcquire>,
        answer: GrantedAtOnce,
    ) -> GrantedAtOnce {
        pending.into_iter().for_each(PendingAcquire::disarm);
        members
            .iter()
            .filter_map(|m| m.kind.own_id())
            .for_each(|id| self.inner.revoke_in_background(id));
        answer
    }
}

impl Inner {
    /// Puts each `(range, key, lease)`'s key on its lease, as a lock's key, if no range has a
    /// key at all: a `CREATE` compare over a range holds for every key in it, and over an empty
    /// range compares a key that does not exist (create revision 0). Otherwise reads each
    /// range's oldest key, which says whether a retry finds the first try's keys (a name's
    /// oldest key is ours when ours exists: it was put into an empty range) or another holder
    /// and its limit.
    async fn create_all_if_free(&self, puts: &[(String, String, i64)]) -> Result<SetTried> {
        let compares: Vec<Compare> = puts
            .iter()
            .map(|(range, _, _)| {
                Compare::create_revision(range.as_str(), CompareOp::Equal, 0).with_prefix()
            })
            .collect();
        let writes: Vec<TxnOp> = puts
            .iter()
            .map(|(_, key, lease)| {
                let lease = PutOptions::new().with_lease(*lease);
                TxnOp::put(key.as_str(), claim_value(Claim::LOCK, None), Some(lease))
            })
            .collect();
        let reads: Vec<TxnOp> = puts
            .iter()
            .map(|(range, _, _)| TxnOp::get(range.as_str(), Some(oldest_key())))
            .collect();
        let txn = Txn::new().when(compares).and_then(writes).or_else(reads);
        let response = match self.txn(txn).await {
            Ok(response) => response,
            Err(error) if refused_as_too_large(&error) => return Ok(SetTried::OneByOne),
            Err(error) => return Err(error),
        };
        if response.succeeded() {
            return Ok(SetTried::Taken(
                response.header().map_or(0, |h| h.revision()),
            ));
        }
        let oldest: Vec<Option<KeyValue>> = response
            .op_responses()
            .into_iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(mut get) => Some(get.take_kvs().into_iter().next()),
                _ => None,
            })
            .collect();
        let ours: Vec<i64> = puts
            .iter()
            .zip(&oldest)
            .filter_map(|((_, key, _), kv)| {
                kv.as_ref()
                    .filter(|kv| kv.key() == key.as_bytes())
                    .map(KeyValue::create_revision)
            })
            .collect();
        if let Some(&revision) = ours.first() {
            // A retry of a transaction that was applied finds every key of ours, of one revision.
            let whole = ours.len() == puts.len() && ours.iter().all(|&r| r == revision);
            return Ok(if whole {
                SetTried::Taken(revision)
            } else {
                SetTried::Partly
            });
        }
        let other_limit = oldest.iter().flatten().any(|kv| limit_of(kv) != 1);
        Ok(if other_limit {
            SetTried::OneByOne
        } else {
            SetTried::Busy
        })
    }
}

/// Whether the server refused the transaction for its size (more operations than the cluster's
/// `--max-txn-ops`, or more bytes than its request limit): nothing was applied.
fn refused_as_too_large(error: &LockError) -> bool {
    error
        .source_as::<crate::error::InOneSentence>()
        .is_some_and(|said| {
            let said = said.to_string();
            said.contains("too many operations in txn request")
                || said.contains("request is too large")
        })
}
