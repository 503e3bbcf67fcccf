//! `EtcdLock`: the client, its session leases, the acquire transaction and the wait.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{Detach, Grant, PendingAcquire, RawLock, WaitRecovery};
use dlock_api::{
    Capabilities, Fencing, FencingToken, Inspection, LockError, LockName, LockOptions, LostReason,
    Renewal, Result,
};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::{is_lease_not_found, is_unavailable, map_err, timed_out};
use crate::keys::{KeyClaim, KeysInUse, NameKeys};
use crate::lease::{EtcdLease, LeaseKind as Kind};
use crate::session::{SessionLease, grant_lease, revoke_in_background, ttl_class};
use crate::watch::{WatchEvent, WatchHandle, Watcher};

/// How often a waiter re-reads the queue, and a holder its key, even without a watch event: a
/// fallback against an event lost by the server (etcd 3.4 before 3.4.31/3.4.36 can lose one
/// after a compaction).
pub(crate) const FALLBACK_REREAD: Duration = Duration::from_secs(3);

/// Up to how many keys ahead of its own a waiter tracks: when its read saw all of them, the
/// waiter watches every deletion under the name and holds the lock once it has seen each of
/// them go, without reading the queue again, which saves a linearizable read on each hand-off.
/// A longer queue costs a read after the predecessor's deletion, as in etcd's own recipe.
const PREDECESSORS_WATCHED: usize = 8;

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

pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    pub(crate) client: Client,
    /// Session leases by TTL class (whole seconds).
    sessions: tokio::sync::Mutex<HashMap<i64, Arc<SessionLease>>>,
    pub(crate) watcher: Watcher,
    /// Starts the watch on each held key a moment after its grant.
    pub(crate) timer: dlock_api::raw::GuardTimer,
    /// Fires when the client is dropped: stops the keep-alives (which revoke their leases) and
    /// the watch stream.
    pub(crate) shutdown: CancellationToken,
    /// The keys this client may have on the server, so that each is named again only once gone.
    keys_in_use: KeysInUse,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
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

/// The outcome of the acquire transaction, or of a re-read of the queue.
enum Queue {
    /// No key with a lower create revision: held.
    First,
    /// Keys below ours: wait.
    Behind(Behind),
    /// Our key is gone (its lease ended, or someone deleted it).
    Gone,
}

/// Where our key stands in a queue read.
struct Behind {
    /// The key just below ours.
    key: String,
    /// The keys below that one, when the read saw all of them (at most
    /// [`PREDECESSORS_WATCHED`]); `None` when there may be more.
    older: Option<Vec<String>>,
    /// The revision the read saw.
    seen: i64,
}

impl EtcdLock {
    /// Connects with `config`, then proves the cluster answers (a linearizable read, which needs
    /// a leader) within the connect timeout: the client crate's own connect touches no server,
    /// so a dead cluster would otherwise look connected.
    ///
    /// # Errors
    /// [`LockError::Config`] for a configuration the client refuses (a certificate file that
    /// cannot be read); [`LockError::Unavailable`] when no member answers within the connect
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held before it returns.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        let options = connect_options(&config)?;
        let probe_by = after(Instant::now(), config.connect_timeout);
        let client = tokio::time::timeout_at(
            probe_by,
            Client::connect(config.endpoint_urls(), Some(options)),
        )
        .await
        .map_err(|_| timed_out(config.connect_timeout))?
        .map_err(|e| match e {
            etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => {
                dlock_api::raw::config::config_error(BACKEND, e.to_string())
            }
            e => LockError::unavailable(BACKEND, e),
        })?;
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            watcher: Watcher::start(client.clone(), shutdown.clone()),
            timer: dlock_api::raw::GuardTimer::new(),
            client,
            config,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            shutdown,
            keys_in_use: KeysInUse::default(),
        });
        let probe_key = format!("{}/", inner.config.prefix);
        let mut last = None;
        loop {
            let mut kv = inner.client.kv_client();
            match tokio::time::timeout_at(
                probe_by,
                kv.get(probe_key.clone(), Some(GetOptions::new().with_count_only())),
            )
            .await
            {
                Ok(Ok(_)) => break,
                Ok(Err(e)) if is_unavailable(&e) => last = Some(e),
                Ok(Err(e)) => return Err(map_err(e)),
                Err(_) => {
                    return Err(match last {
                        Some(e) => LockError::unavailable(BACKEND, e),
                        None => timed_out(inner.config.connect_timeout),
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self { inner })
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
    #[doc(hidden)]
    pub fn lose_watch_deletions(&self, lose: bool) {
        let probe = &self.inner.watcher.probe;
        probe
            .lose_deletions
            .store(lose, std::sync::atomic::Ordering::Relaxed);
    }

    /// For dlock's fault tests: how many of this client's watches the server answered
    /// "compacted" (each was then re-read). Not part of the API.
    #[doc(hidden)]
    pub fn compacted_watches(&self) -> u64 {
        let probe = &self.inner.watcher.probe;
        probe.compacted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn connect_options(config: &EtcdConfig) -> Result<ConnectOptions> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.command_timeout)
        .with_keep_alive(Duration::from_secs(1), config.command_timeout)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let (Some(user), Some(password)) = (&config.username, &config.password) {
        options = options
            .with_user(user.clone(), password.expose().to_owned())
            .with_auto_token_refresh(true);
    }
    #[cfg(feature = "tls")]
    if config.tls {
        options = options.with_tls(tls_options(config)?);
    }
    Ok(options)
}

#[cfg(feature = "tls")]
fn tls_options(config: &EtcdConfig) -> Result<etcd_client::TlsOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let pem = config.tls_files.read(BACKEND)?;
    let mut tls = TlsOptions::new().with_native_roots();
    if let Some(ca) = pem.ca_cert {
        tls = tls.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = pem.identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

impl Inner {
    fn command_timeout(&self) -> Duration {
        self.config.command_timeout
    }

    /// Runs a transaction that is safe to retry (its retry finds what the first try did), as
    /// [`idempotent`](Self::idempotent) runs a request.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.idempotent(|mut client| {
            let txn = txn.clone();
            async move { client.txn(txn).await }
        })
        .await
    }

    /// Runs an idempotent request, retried (perhaps on another member: the client's balancer
    /// picks again) while the failure is one a retry can fix, within three command timeouts.
    pub(crate) async fn idempotent<T, F, Fut>(&self, mut call: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let timeout = self.command_timeout();
        let give_up = after(Instant::now(), timeout * 3);
        let mut attempt: u32 = 0;
        loop {
            let answer = tokio::time::timeout(timeout, call(self.client.clone())).await;
            let error = match answer {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if is_unavailable(&e) => map_err(e),
                Ok(Err(e)) => return Err(map_err(e)),
                Err(_) => timed_out(timeout),
            };
            attempt += 1;
            let pause = Duration::from_millis(10u64 << attempt.min(5));
            if after(Instant::now(), pause) >= give_up {
                return Err(error);
            }
            tracing::debug!(%error, attempt, "etcd request failed; trying again");
            tokio::time::sleep(pause).await;
        }
    }

    /// The kept-alive lease for `ttl`'s class, granted on first use (or after the last one
    /// ended).
    pub(crate) async fn session_lease(&self, ttl: Duration) -> Result<Arc<SessionLease>> {
        let class = ttl_class(ttl);
        let mut sessions = self.sessions.lock().await;
        if let Some(lease) = sessions.get(&class) {
            if lease.is_usable() {
                return Ok(lease.clone());
            }
            lease.end(LostReason::SessionExpired);
        }
        let lease = SessionLease::grant(
            &self.client,
            class,
            self.command_timeout(),
            self.shutdown.child_token(),
        )
        .await?;
        sessions.insert(class, lease.clone());
        Ok(lease)
    }

    /// Forgets a session lease the server no longer knows.
    pub(crate) async fn drop_session(&self, lease: &SessionLease) {
        lease.end(LostReason::SessionExpired);
        let mut sessions = self.sessions.lock().await;
        if sessions.get(&lease.class).is_some_and(|l| l.id == lease.id) {
            sessions.remove(&lease.class);
        }
    }

    /// The lease an acquire with `options` rides: the class's kept-alive one, or with renewal
    /// off a lease of its own that nobody keeps alive.
    async fn lease_for(&self, options: &LockOptions) -> Result<Kind> {
        match options.renewal() {
            Renewal::Off => {
                let ttl = ttl_class(options.ttl());
                let (id, _granted, valid_until) =
                    grant_lease(&self.client, ttl, self.command_timeout()).await?;
                Ok(Kind::own(id, ttl, valid_until))
            }
            _ => Ok(Kind::Session(self.session_lease(options.ttl()).await?)),
        }
    }

    /// Deletes `key` if it is still ours (guarded by its create revision, or, when the create
    /// revision is unknown, by the unique key itself). Returns whether it was there.
    pub(crate) async fn delete_key(&self, key: &str, revision: Option<i64>) -> Result<bool> {
        let txn = match revision {
            Some(revision) => Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, revision)])
                .and_then([TxnOp::delete(key, None)]),
            None => Txn::new()
                .when([Compare::create_revision(key, CompareOp::Greater, 0)])
                .and_then([TxnOp::delete(key, None)]),
        };
        let response = self.txn(txn).await?;
        Ok(response.succeeded())
    }

    /// Reads the queue as seen from our key: the highest key created at or below our revision
    /// should be ours; the one below it, if any, is the one we wait for (and the ones below
    /// that, if few). Linearizable, so a member that lags cannot hide a live predecessor.
    async fn read_queue(&self, keys: &NameKeys, key: &str, revision: i64) -> Result<Queue> {
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
    async fn create(&self, keys: &NameKeys, key: &str, lease: i64) -> Result<(i64, Queue)> {
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
    async fn create_if_free(&self, keys: &NameKeys, key: &str, lease: i64) -> Result<Option<i64>> {
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
struct QueueWatch {
    watch: WatchHandle,
    /// The keys ahead of ours that the read showed and no deletion has removed since.
    ahead: Vec<String>,
    /// The read showed every key ahead of ours (at most [`PREDECESSORS_WATCHED`]).
    complete: bool,
    /// The key just ahead of ours.
    predecessor: String,
}

/// What a waiter does after an event of its [`QueueWatch`].
enum Next {
    /// Nothing that concerns us: wait on.
    Wait,
    /// Every key ahead of ours is gone, and ours is not: the lock is ours.
    Held,
    /// Read the queue to know.
    Read,
}

impl QueueWatch {
    fn start(watcher: &Watcher, keys: &NameKeys, queue: Behind) -> Self {
        let mut ahead = queue.older.clone().unwrap_or_default();
        ahead.push(queue.key.clone());
        Self {
            // From just after the read: no deletion can fall between.
            watch: watcher.watch_deletions_under(&keys.range, queue.seen + 1),
            ahead,
            complete: queue.older.is_some(),
            predecessor: queue.key,
        }
    }

    fn on(&mut self, event: WatchEvent, ours: &str) -> Next {
        let WatchEvent::Deleted { key, .. } = event else {
            return Next::Read;
        };
        if *key == *ours.as_bytes() {
            // The read finds our key gone and says so.
            return Next::Read;
        }
        let Some(at) = self.ahead.iter().position(|k| *k.as_bytes() == *key) else {
            // A key behind ours.
            return Next::Wait;
        };
        let deleted = self.ahead.swap_remove(at);
        if self.complete && self.ahead.is_empty() {
            // No key created before ours can appear any more, and ours was not deleted first.
            Next::Held
        } else if !self.complete && deleted == self.predecessor {
            Next::Read
        } else {
            Next::Wait
        }
    }
}

/// Whether a failed create says the lease is gone on the server.
pub(crate) fn lease_gone(error: &LockError) -> bool {
    matches!(
        error,
        LockError::Backend { .. } | LockError::Unavailable { .. }
    ) && error
        .source_as::<etcd_client::Error>()
        .is_some_and(is_lease_not_found)
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
        let kind = inner.lease_for(options).await?;
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
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return;
            };
            handle.spawn(async move {
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

    fn grant(&self, name: &LockName, kind: Kind, claim: Arc<KeyClaim>, revision: i64) -> Grant {
        let token = FencingToken::new(u64::try_from(revision).unwrap_or(0));
        let (lease, state, renewed_by) =
            EtcdLease::start(self.inner.clone(), name, kind, claim, revision);
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
        let mut tries = 0;
        loop {
            let (kind, keys, key) = self.prepare(name, options).await?;
            let (result, session) = attempt(kind, keys, key).await;
            match (result, session) {
                (Err(e), Some(session)) if tries == 0 && lease_gone(&e) => {
                    self.inner.drop_session(&session).await;
                    tries += 1;
                }
                (result, _) => return result,
            }
        }
    }
}

/// etcd's shortest lease on default timing (`ceil(1.5 × election timeout)`); it raises shorter
/// ones to it.
const MIN_TTL: Duration = Duration::from_secs(2);

#[dlock_api::raw::async_trait]
impl RawLock for EtcdLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Strict,
            fifo: true,
            survives_failover: true,
            min_ttl: Some(MIN_TTL),
            inspect: true,
            ..Capabilities::TTL_LEASE
        }
    }

    /// A linearizable read of the name's oldest key (the holder: the queue is ordered by create
    /// revision) and of how many keys the name has (the rest wait), then the holder's lease's
    /// time to live.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let inner = &self.inner;
        let range = NameKeys::new(&inner.config.prefix, name).range;
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
            .with_keys_only();
        let response = inner
            .idempotent(|mut client| {
                let (range, oldest) = (range.clone(), oldest.clone());
                async move { client.get(range, Some(oldest)).await }
            })
            .await?;
        let keys = usize::try_from(response.count()).unwrap_or(0);
        let Some(holder) = response.kvs().first() else {
            return Ok(Inspection::free(Some(keys)));
        };
        let token = u64::try_from(holder.create_revision()).ok();
        let held = Inspection::held(token.map(FencingToken::new))
            .with_waiters(keys.saturating_sub(1))
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

    async fn try_grant(&self, name: &LockName, options: &LockOptions) -> Result<Option<Grant>> {
        self.with_lease(name, options, |kind, keys, claim| async move {
            let session = kind.session().cloned();
            let (pending, created) = self.arm(&kind, &claim);
            let create = {
                let (inner, claim, id) = (self.inner.clone(), claim.clone(), kind.id());
                Detach::new(async move {
                    let result = inner.create_if_free(&keys, claim.key(), id).await;
                    let _ = created.send(result.is_ok());
                    result
                })
            };
            let created = create.await;
            let result = match created {
                Ok(Some(revision)) => {
                    let grant = self.grant(name, kind, claim, revision);
                    pending.disarm();
                    Ok(Some(grant))
                }
                Ok(None) => {
                    pending.disarm();
                    if let Some(id) = kind.own_id() {
                        revoke_in_background(&self.inner.client, id, self.inner.command_timeout());
                    }
                    Ok(None)
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

    async fn wait_grant(
        &self,
        name: &LockName,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.with_lease(name, options, |kind, keys, claim| async move {
            let session = kind.session().cloned();
            let result = self.wait(name, kind, keys, claim, options, deadline).await;
            (result, session)
        })
        .await
    }
}

impl EtcdLock {
    async fn wait(
        &self,
        name: &LockName,
        kind: Kind,
        keys: NameKeys,
        claim: Arc<KeyClaim>,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let inner = &self.inner;
        let key = claim.key().to_owned();
        let (pending, created) = self.arm(&kind, &claim);
        let create = {
            let (inner, keys, claim, id) = (inner.clone(), keys.clone(), claim.clone(), kind.id());
            Detach::new(async move {
                let result = inner.create(&keys, claim.key(), id).await;
                let _ = created.send(result.is_ok());
                result
            })
        };
        let (revision, read) = create.await?;
        // What the last read said, until the loop acts on it.
        let mut queue = Some(read);
        let mut watching: Option<QueueWatch> = None;
        let mut reread_at = after(Instant::now(), FALLBACK_REREAD);
        let session = kind.session().map(|s| s.session.clone());
        let mut recovery = WaitRecovery::new(
            inner
                .config
                .connect_timeout
                .max(inner.config.command_timeout * 3),
        );
        let retry = options.retry();
        loop {
            match queue.take() {
                Some(Queue::First) => {
                    let grant = self.grant(name, kind, claim, revision);
                    pending.disarm();
                    return Ok(Some(grant));
                }
                Some(Queue::Gone) => {
                    // Our key went while we waited: the lease ended under us.
                    drop(pending);
                    return Err(LockError::Lost {
                        name: name.to_string(),
                        reason: LostReason::SessionExpired,
                    });
                }
                Some(Queue::Behind(behind)) => {
                    watching = Some(QueueWatch::start(&inner.watcher, &keys, behind));
                    reread_at = after(Instant::now(), FALLBACK_REREAD);
                }
                // Still waiting on the same watch.
                None => {}
            }
            let Some(queue_watch) = watching.as_mut() else {
                continue;
            };
            let wake = deadline.map_or(reread_at, |d| d.min(reread_at));
            let session_ended = async {
                match &session {
                    Some(session) => session.ended().await,
                    None => std::future::pending().await,
                }
            };
            // A waiter on a lease of its own keeps it alive while it queues.
            let renew_at = kind
                .own_timing()
                .map(|(until, every)| until.checked_sub(every * 2).unwrap_or(until));
            let renew = async {
                match renew_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = queue_watch.watch.next() => match queue_watch.on(event, &key) {
                    Next::Wait => continue,
                    // The last deletion ahead of ours may reach a waiter that was paused long
                    // after it happened, with our lease (and key) gone since: past the lease's
                    // validity the read decides.
                    Next::Held if Instant::now() < kind.valid_until() => {
                        queue = Some(Queue::First);
                        continue;
                    }
                    Next::Held | Next::Read => {}
                },
                reason = session_ended => {
                    drop(pending);
                    return Err(LockError::Lost { name: name.to_string(), reason });
                }
                () = renew => {
                    if let Err(error) = kind.renew_own(inner).await {
                        recovery.pause_or_give_up(error, retry, deadline).await?;
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        // Out of time: take our key out of the queue before answering.
                        match kind.own_id() {
                            Some(id) => {
                                let _ = inner.idempotent(|client| async move {
                                    client.lease_client().revoke(id).await
                                }).await;
                            }
                            None => {
                                if inner.delete_key(&key, Some(revision)).await.is_err() {
                                    drop(pending);
                                    return Ok(None);
                                }
                            }
                        }
                        pending.disarm();
                        return Ok(None);
                    }
                }
            }
            loop {
                match inner.read_queue(&keys, &key, revision).await {
                    Ok(read) => {
                        recovery.reached_server();
                        queue = Some(read);
                        break;
                    }
                    Err(error) => recovery.pause_or_give_up(error, retry, deadline).await?,
                }
            }
        }
    }
}
