//! `EtcdLock`: the acquire (a key on a lease, joining the name's queue), the wait for the keys
//! ahead to go (`lock/wait.rs`), a free set in one transaction (`lock/at_once.rs`), and
//! inspection. The client they share is in `client`, the queue in `queue`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::{Claim, Detach, Grant, PendingAcquire, RawLock};
use dlock_api::{
    Capabilities, Fencing, FencingToken, Inspection, LockName, LockOptions, Renewal, Result,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::{Inner, lease_gone};
use crate::config::EtcdConfig;
use crate::keys::{KeyClaim, NameKeys};
use crate::lease::{EtcdLease, LeaseKind as Kind};
use crate::queue::{Queue, limit_of};
use crate::session::{SessionLease, ttl_class};

mod at_once;
mod wait;

/// A distributed lock on etcd: one key per acquire under the name's range, queued by create
/// revision, riding a lease this client keeps alive. Cheap to clone; clones share the client,
/// its session leases and its watch stream.
///
/// Created by [`connect`](Self::connect) or [`connect_url`](Self::connect_url). Dropping the last
/// clone (and every guard) stops the keep-alives and revokes the leases, which frees any lock
/// still held.
#[derive(Clone)]
pub struct EtcdLock {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for EtcdLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd({})", self.inner.config)
    }
}

impl EtcdLock {
    /// Connects with `config`, then proves the cluster answers (a linearizable read, which needs
    /// a leader) within the connect timeout: the client crate's own connect touches no server,
    /// so a dead cluster would otherwise look connected.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for a configuration the client refuses (a certificate file that
    /// cannot be read); [`LockError::Unavailable`](dlock_api::LockError::Unavailable) when no member answers within the connect
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held before it returns.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        Ok(Self {
            inner: Inner::connect(config).await?,
        })
    }

    /// Parses `url` ([`EtcdConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// As [`EtcdConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held before it returns.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(EtcdConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// For dlock's fault tests: while `lose` is on, this client's watch stream drops the
    /// deletion events it receives, as etcd 3.4 before 3.4.31 can after a compaction, so only
    /// the fallback re-reads can notice a deletion. Not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn lose_watch_deletions(&self, lose: bool) {
        let probe = &self.inner.watcher.probe;
        probe
            .lose_deletions
            .store(lose, std::sync::atomic::Ordering::Relaxed);
    }

    /// For dlock's fault tests: how many of this client's watches the server answered
    /// "compacted" (each was then re-read). Not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn compacted_watches(&self) -> u64 {
        let probe = &self.inner.watcher.probe;
        probe.compacted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The lease an acquire with `options` rides: the class's kept-alive one, or with renewal off a
/// lease of its own that nobody keeps alive.
async fn lease_for(inner: &Inner, options: &LockOptions) -> Result<Kind> {
    match options.renewal() {
        Renewal::Off => {
            let ttl = ttl_class(options.ttl());
            let (id, _granted, valid_until) = inner.grant_lease(ttl).await?;
            Ok(Kind::own(id, ttl, valid_until))
        }
        _ => Ok(Kind::Session(inner.session_lease(options.ttl()).await?)),
    }
}

impl EtcdLock {
    /// The lease for an acquire, and the key on it. A session lease the server no longer knows
    /// is replaced once.
    async fn prepare(
        &self,
        name: &LockName,
        options: &LockOptions,
    ) -> Result<(Kind, NameKeys, Arc<KeyClaim>)> {
        let inner = &self.inner;
        let kind = lease_for(inner, options).await?;
        let keys = NameKeys::new(&inner.config.prefix, name);
        let claim = inner.keys_in_use.claim(&keys, kind.id());
        Ok((kind, keys, claim))
    }

    /// Arms the cleanup of an acquire's key (and of its own lease): if the acquire is dropped
    /// before its grant exists, the key goes, also when the create's reply was lost. The create
    /// runs detached (it finishes even if the acquire is dropped) and reports through the
    /// returned sender, so the cleanup's delete is never overtaken by the create it undoes.
    fn arm(&self, kind: &Kind, claim: &Arc<KeyClaim>) -> (PendingAcquire, oneshot::Sender<bool>) {
        let inner = self.inner.clone();
        let claim = claim.clone();
        let own = kind.own_id();
        let (created, outcome) = oneshot::channel::<bool>();
        let pending = PendingAcquire::arm(move || {
            dlock_api::raw::spawn_cleanup(async move {
                let known = outcome.await.unwrap_or(false);
                let rounds = if known { 1 } else { 2 };
                for round in 0..rounds {
                    if round > 0 {
                        // The create's answer was lost: it may still land; look again.
                        tokio::time::sleep(inner.command_timeout()).await;
                    }
                    match own {
                        // Revoking the lease deletes the key with it.
                        Some(id) => {
                            let _ = inner
                                .idempotent(|client| async move {
                                    client.lease_client().revoke(id).await
                                })
                                .await;
                        }
                        None => {
                            if inner.delete_key(claim.key(), None).await.is_err() {
                                claim.burn();
                            }
                        }
                    }
                }
            });
        });
        (pending, created)
    }

    /// The grant of our key, created at `revision`; a candidate's key that `leads_with` its
    /// campaign value led with it from the moment it held.
    fn grant(
        &self,
        (name, limit): (&LockName, u32),
        kind: Kind,
        (claim, leads_with): (Arc<KeyClaim>, Option<Arc<[u8]>>),
        revision: i64,
    ) -> Grant {
        let token = FencingToken::new(u64::try_from(revision).unwrap_or(0));
        let (lease, state, renewed_by) =
            EtcdLease::start(self.inner.clone(), name, kind, claim, (revision, limit));
        if let Some(value) = leads_with {
            lease.led_at_grant(value);
        }
        Grant::new(name.clone(), token, lease, state, renewed_by)
    }

    /// Runs `attempt` with a fresh lease and key; when the server says the session lease is
    /// gone (revoked from elsewhere), drops that session and tries once more on a new one.
    async fn with_lease<T, F, Fut>(
        &self,
        name: &LockName,
        options: &LockOptions,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Kind, NameKeys, Arc<KeyClaim>) -> Fut,
        Fut: Future<Output = (Result<T>, Option<Arc<SessionLease>>)>,
    {
        let mut tries: u32 = 0;
        loop {
            let (kind, keys, key) = self.prepare(name, options).await?;
            let (result, session) = attempt(kind, keys, key).await;
            if !self.replace_gone_session(&mut tries, &result, session.as_ref()) {
                return result;
            }
        }
    }

    /// Whether an attempt on `session` that ended with `result` is made again: on its first
    /// try, when the server said the lease is gone (revoked from elsewhere); that session is
    /// dropped, so the next attempt gets a new one.
    fn replace_gone_session<T>(
        &self,
        tries: &mut u32,
        result: &Result<T>,
        session: Option<&Arc<SessionLease>>,
    ) -> bool {
        match (result, session) {
            (Err(e), Some(session)) if *tries == 0 && lease_gone(e) => {
                self.inner.drop_session(session);
                *tries = tries.saturating_add(1);
                true
            }
            _ => false,
        }
    }
}

/// The most permits a semaphore of this backend has. A read that grants a permit returns every
/// key ahead of ours (fewer than the limit), each with its name: a name of
/// [`LockName::MAX_BYTES`] percent-encodes to up to 3 KiB, so at 512 the longest answer stays
/// near 1.7 MB, under half of the client's 4 MiB message limit, and a waiter's list of the keys
/// ahead stays short. A wider semaphore is better kept as several names.
const MAX_PERMITS: u32 = 512;

#[dlock_api::raw::async_trait]
impl RawLock for EtcdLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &dlock_api::raw::Holdings {
        &self.inner.holdings
    }

    async fn shutdown(&self, _deadline: Instant) {
        self.inner.close().await;
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Strict,
            fifo: true,
            survives_failover: true,
            min_ttl: Some(self.inner.shortest_lease.get()),
            // A TTL becomes a lease of whole seconds, rounded up, which the leader expires on a
            // sweep every 500 ms: a 2 s lease of a vanished holder ended 2.30-2.35 s after its
            // last renewal, a 3 s one 3.32-3.43 s after.
            expiry_lag: Duration::from_millis(1500),
            inspect: true,
            takeover_signal: true,
            max_permits: MAX_PERMITS,
            one_limit_per_name: true,
            elections: true,
            reader_writer: true,
            ..Capabilities::TTL_LEASE
        }
    }

    /// A linearizable read of the name's oldest key (the holder: the queue is ordered by create
    /// revision) and of how many keys the name has (the rest wait), and of the whole line where
    /// readers may hold or wait; then the holder's lease's time to live.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let inner = &self.inner;
        let (oldest, count) = inner
            .read_oldest(&NameKeys::new(&inner.config.prefix, name))
            .await?;
        let keys = usize::try_from(count).unwrap_or(0);
        let Some(mut holder) = oldest else {
            return Ok(Inspection::free(Some(keys)).with_readers(0, 0));
        };
        let (mut keys, mut readers, mut waiting_readers) = (keys, 0, 0);
        if keys > 1 || crate::queue::readers_in(std::slice::from_ref(&holder)).0 > 0 {
            // Readers may hold or wait: only the whole line tells them from writers.
            let line = inner
                .read_line(&NameKeys::new(&inner.config.prefix, name))
                .await?;
            let Some(first) = line.first() else {
                return Ok(Inspection::free(Some(0)).with_readers(0, 0));
            };
            holder = first.clone();
            keys = line.len();
            (readers, waiting_readers) = crate::queue::readers_in(&line);
        }
        let token = u64::try_from(holder.create_revision()).ok();
        let held = Inspection::held(token.map(FencingToken::new))
            .with_waiters(keys.saturating_sub(readers.max(1)))
            .with_readers(readers, waiting_readers)
            .with_holder(format!("lease {:016x}", holder.lease()));
        let lease = holder.lease();
        if lease == 0 {
            return Ok(held);
        }
        let ttl = inner
            .idempotent(|mut client| async move { client.lease_time_to_live(lease, None).await })
            .await?
            .ttl();
        // -1: the lease ended since the read; its key goes with it.
        Ok(match u64::try_from(ttl) {
            Ok(seconds) => held.with_remaining(Duration::from_secs(seconds)),
            Err(_) => held,
        })
    }

    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        self.try_grant_of(name, Claim::new(limit, options), options)
            .await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.wait_grant_of(name, Claim::new(limit, options), options, deadline)
            .await
    }

    /// One linearizable read (a transaction of two reads) of the name's oldest key and its
    /// leader record: the record counts only if its term is that key's create revision.
    async fn leader(&self, name: &LockName) -> Result<Option<dlock_api::Leader>> {
        let keys = NameKeys::new(&self.inner.config.prefix, name);
        Ok(self.inner.read_leader(&keys, None).await?.0)
    }

    /// One watch on the name's keys and its record, from just after a read of the leader; each
    /// change is read again at its revision.
    async fn observe_leader(&self, name: &LockName) -> Result<dlock_api::LeaderStream> {
        let keys = NameKeys::new(&self.inner.config.prefix, name);
        crate::election::observe(self.inner.clone(), keys).await
    }

    /// `min(live keys of the name, the oldest key's limit)`: the keys past the limit wait. One
    /// linearizable read (the range's count and its oldest key), so a count right after an
    /// acknowledged release or grant never shows the line before it, as a serializable read of
    /// a lagging member could.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        let inner = &self.inner;
        let (oldest, count) = inner
            .read_oldest(&NameKeys::new(&inner.config.prefix, name))
            .await?;
        let limit = oldest.as_ref().map_or(0, limit_of);
        let keys = u32::try_from(count).unwrap_or(u32::MAX);
        Ok(keys.min(limit))
    }

    /// One transaction for a free set (`lock/at_once.rs`): every name's range empty, and a
    /// key of this client's under each.
    async fn try_grant_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<dlock_api::raw::GrantedAtOnce> {
        self.try_set_at_once(names, options).await
    }
}

/// What a try's transaction did.
enum Tried {
    /// Our key holds, created at this revision.
    Held(i64),
    /// Busy (`None`) or in use with another limit: nothing of ours was written.
    Refused(Option<u32>),
    /// Our key, created at this revision, joined the line but holds nothing (busy, or in use
    /// with another limit): it must leave.
    Joined(i64, Option<u32>),
}

impl EtcdLock {
    /// One attempt at what `asked` (one of the name's permits, a lock's one, or a reader's
    /// share), without waiting.
    async fn try_grant_of(
        &self,
        name: &LockName,
        asked: Claim,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        self.with_lease(name, options, |kind, keys, claim| async move {
            let session = kind.session().cloned();
            let (pending, created) = self.arm(&kind, &claim);
            let create = {
                let (inner, claim, id) = (self.inner.clone(), claim.clone(), kind.id());
                Detach::new(async move {
                    let result = if asked == Claim::LOCK {
                        inner.create_if_free(&keys, claim.key(), id).await.map(
                            |tried| match tried {
                                Ok(revision) => Tried::Held(revision),
                                Err(in_use) => Tried::Refused(in_use),
                            },
                        )
                    } else {
                        // "Fewer than N keys" (or "no writer's key") is no compare etcd has:
                        // join the line, and leave it again when the answer is not a grant.
                        inner
                            .create(&keys, claim.key(), id, (asked, None))
                            .await
                            .map(|(revision, queue)| match queue {
                                Queue::First => Tried::Held(revision),
                                Queue::Mismatch(in_use) => Tried::Joined(revision, Some(in_use)),
                                Queue::Behind(_) | Queue::Gone => Tried::Joined(revision, None),
                            })
                    };
                    let _ = created.send(result.is_ok());
                    result
                })
            };
            let answer = |in_use: Option<u32>| match in_use {
                Some(in_use) => Err(dlock_api::raw::permits_mismatch(name, asked.limit, in_use)),
                None => Ok(None),
            };
            let result = match create.await {
                Ok(Tried::Held(revision)) => {
                    let grant = self.grant((name, asked.limit), kind, (claim, None), revision);
                    pending.disarm();
                    Ok(Some(grant))
                }
                Ok(Tried::Refused(in_use)) => {
                    pending.disarm();
                    if let Some(id) = kind.own_id() {
                        self.inner.revoke_in_background(id);
                    }
                    answer(in_use)
                }
                Ok(Tried::Joined(revision, in_use)) => {
                    self.leave(&kind, claim.key(), revision, pending).await;
                    answer(in_use)
                }
                Err(e) => {
                    // Maybe applied: the armed cleanup deletes the key if it exists.
                    drop(pending);
                    Err(e)
                }
            };
            (result, session)
        })
        .await
    }

    /// Takes our key out of the line before answering, so nothing is left behind: deleted
    /// if it is still ours (by its create revision), or with its lease when it rides one of
    /// its own. When the server cannot be reached, the armed cleanup deletes it in the
    /// background.
    async fn leave(&self, kind: &Kind, key: &str, revision: i64, pending: PendingAcquire) {
        let inner = &self.inner;
        match kind.own_id() {
            Some(id) => {
                let _ = inner
                    .idempotent(|client| async move { client.lease_client().revoke(id).await })
                    .await;
            }
            None => {
                if inner.delete_key(key, Some(revision)).await.is_err() {
                    drop(pending);
                    return;
                }
            }
        }
        pending.disarm();
    }
}
