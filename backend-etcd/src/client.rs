//! The client every guard and waiter of one `EtcdLock` shares: the connection (made again when
//! the runtime it was made on has shut down), its session leases by TTL class, the watch stream,
//! and the requests they all make (retried where a retry is safe).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::{LockError, LostReason, Result};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp, TxnResponse};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::EtcdConfig;
use crate::connection::{Conn, Connection};
use crate::error::{is_lease_not_found, is_unavailable, map_err, timed_out};
use crate::held::HeldKeys;
use crate::keys::KeysInUse;
use crate::session::{SessionLease, ShortestLease, grant_lease, ttl_class};
use crate::watch::Watcher;

/// How often a waiter re-reads the queue, and a holder its key, even without a watch event: a
/// fallback against an event lost by the server (etcd 3.4 before 3.4.31/3.4.36 can lose one
/// after a compaction).
pub(crate) const FALLBACK_REREAD: Duration = Duration::from_secs(3);

/// One `EtcdLock`'s shared state; the last clone's drop ends its keep-alives and watch stream.
pub(crate) struct Inner {
    pub(crate) config: EtcdConfig,
    connection: Connection,
    /// One caller at a time connects again; the others then find its connection.
    reconnecting: tokio::sync::Mutex<()>,
    /// Session leases by TTL class (whole seconds).
    sessions: Mutex<HashMap<i64, Arc<SessionLease>>>,
    /// One grant of a session lease at a time, so that concurrent acquires share one.
    granting: tokio::sync::Mutex<()>,
    pub(crate) watcher: Watcher,
    /// Starts the watch on each held key a moment after its grant.
    pub(crate) timer: dlock_api::raw::GuardTimer,
    /// The guards this client holds, which `close` releases.
    pub(crate) holdings: dlock_api::raw::Holdings,
    /// Fires when the client is dropped: stops the keep-alives (which revoke their leases) and
    /// the watch stream.
    pub(crate) shutdown: CancellationToken,
    /// The keys this client may have on the server, so that each is named again only once gone.
    pub(crate) keys_in_use: KeysInUse,
    /// The keys held now, whose watches a new connection starts again.
    pub(crate) held: HeldKeys,
    /// The cluster's shortest lease: `min_ttl` in the capabilities.
    pub(crate) shortest_lease: ShortestLease,
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

impl Inner {
    /// Connects with `config`, then proves the cluster answers (a linearizable read, which needs
    /// a leader) within the connect timeout: the client crate's own connect touches no server,
    /// so a dead cluster would otherwise look connected.
    pub(crate) async fn connect(config: EtcdConfig) -> Result<Arc<Self>> {
        let probe_by = after(Instant::now(), config.connect_timeout);
        let conn = tokio::time::timeout_at(probe_by, Conn::open(&config))
            .await
            .map_err(|_| timed_out(config.connect_timeout))??;
        let client = conn.client.clone();
        let shutdown = CancellationToken::new();
        let inner = Arc::new(Inner {
            watcher: Watcher::new(shutdown.clone()),
            timer: dlock_api::raw::GuardTimer::new(),
            holdings: dlock_api::raw::Holdings::default(),
            connection: Connection::new(conn.clone()),
            reconnecting: tokio::sync::Mutex::new(()),
            config,
            sessions: Mutex::new(HashMap::new()),
            granting: tokio::sync::Mutex::new(()),
            shutdown,
            keys_in_use: KeysInUse::default(),
            held: HeldKeys::default(),
            shortest_lease: ShortestLease::new(),
        });
        inner.watcher.run_on(&conn);
        // The probe is a one-second lease: its grant needs a leader, as a linearizable read
        // does, and its answer is the cluster's shortest lease. Nothing rides it; it is revoked.
        let mut last = None;
        loop {
            let mut leases = client.lease_client();
            match tokio::time::timeout_at(probe_by, leases.grant(1, None)).await {
                Ok(Ok(probe)) => {
                    inner.shortest_lease.learn(1, probe.ttl());
                    let (id, timeout) = (probe.id(), inner.command_timeout());
                    dlock_api::raw::spawn_cleanup(async move {
                        let _ = tokio::time::timeout(timeout, leases.revoke(id)).await;
                    });
                    break;
                }
                Ok(Err(e)) if is_unavailable(&e) => last = Some(e),
                Ok(Err(e)) => return Err(map_err(e)),
                Err(_) => {
                    return Err(match last {
                        Some(e) => map_err(e),
                        None => timed_out(inner.config.connect_timeout),
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(inner)
    }

    /// Grants a lease of `ttl` seconds that nobody keeps alive (see [`grant_lease`]).
    pub(crate) async fn grant_lease(&self, ttl: i64) -> Result<(i64, i64, Instant)> {
        let client = self.client().await?;
        grant_lease(&client, ttl, self.command_timeout(), &self.shortest_lease).await
    }

    /// The client to make a request with: the connection's, made again on this runtime if the
    /// one it was made on has shut down.
    pub(crate) async fn client(&self) -> Result<Client> {
        self.client_with(Client::clone).await
    }

    /// What `pick` takes of [`client`](Self::client): one service client
    /// (`Client::kv_client`) costs an eighth of the whole client's clone, which clones each of
    /// its eight services' channels.
    pub(crate) async fn client_with<C>(&self, pick: fn(&Client) -> C) -> Result<C> {
        match self.connection.live_with(pick) {
            Some(client) => Ok(client),
            None => self.reconnect().await.map(|client| pick(&client)),
        }
    }

    /// The connection in use, whose runtime may have stopped.
    pub(crate) fn connection(&self) -> Conn {
        self.connection.current()
    }

    /// Connects again on this runtime, and starts there the watch stream, the keep-alive of every
    /// session lease still in use (its guards hold on if the server still has it, and are told
    /// lost if not) and the watches on held keys. From the connect on, nothing awaits: a cancelled
    /// caller leaves either the old connection, which the next caller replaces, or all of this.
    async fn reconnect(&self) -> Result<Client> {
        let _one = self.reconnecting.lock().await;
        if let Some(client) = self.connection.live_with(Client::clone) {
            return Ok(client);
        }
        let timeout = self.config.connect_timeout;
        let conn = tokio::time::timeout(timeout, Conn::open(&self.config))
            .await
            .map_err(|_| timed_out(timeout))??;
        tracing::debug!("the etcd client's runtime shut down; connected again on this one");
        // Before any request can see the new connection, so none watches on the old stream.
        self.watcher.run_on(&conn);
        self.connection.set(conn.clone());
        // A lease or a held key added from now on finds the new connection itself.
        let sessions: Vec<_> = self.sessions().values().cloned().collect();
        for lease in sessions {
            lease.keep_alive_on(&conn, self.command_timeout());
        }
        self.held.watch_on(&conn);
        Ok(conn.client)
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<SessionLease>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn command_timeout(&self) -> Duration {
        self.config.command_timeout
    }

    /// Runs a transaction that is safe to retry (its retry finds what the first try did), as
    /// [`idempotent`](Self::idempotent) runs a request.
    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let (response, _) = self
            .idempotent_resent_with(Client::kv_client, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok(response)
    }

    /// Runs an idempotent request, retried (perhaps on another member: the client's balancer
    /// picks again) while the failure is one a retry can fix, within three command timeouts.
    pub(crate) async fn idempotent<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        Ok(self.idempotent_resent(call).await?.0)
    }

    /// As [`idempotent`](Self::idempotent), and whether the answer is a retry's: an earlier
    /// try may then have been applied with its answer lost (its connection died with the
    /// runtime it ran on, say), so the answer may describe what that try did.
    async fn idempotent_resent<T, F, Fut>(&self, call: F) -> Result<(T, bool)>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.idempotent_resent_with(Client::clone, call).await
    }

    /// As [`idempotent_resent`](Self::idempotent_resent), calling with what `pick` takes of
    /// the client ([`client_with`](Self::client_with)).
    async fn idempotent_resent_with<C, T, F, Fut>(
        &self,
        pick: fn(&Client) -> C,
        mut call: F,
    ) -> Result<(T, bool)>
    where
        F: FnMut(C) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let timeout = self.command_timeout();
        let give_up = after(Instant::now(), timeout.saturating_mul(3));
        let mut attempt: u32 = 0;
        loop {
            let error = match self.client_with(pick).await {
                Ok(client) => match tokio::time::timeout(timeout, call(client)).await {
                    Ok(Ok(value)) => return Ok((value, attempt > 0)),
                    Ok(Err(e)) if is_unavailable(&e) => map_err(e),
                    Ok(Err(e)) => return Err(map_err(e)),
                    Err(_) => timed_out(timeout),
                },
                Err(e) if e.is_retryable() => e,
                Err(e) => return Err(e),
            };
            attempt = attempt.saturating_add(1);
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
        if let Some(lease) = self.usable_session(class) {
            return Ok(lease);
        }
        let _one = self.granting.lock().await;
        if let Some(lease) = self.usable_session(class) {
            return Ok(lease);
        }
        let client = self.client().await?;
        let lease = SessionLease::grant(
            &client,
            class,
            self.command_timeout(),
            &self.shortest_lease,
            self.shutdown.child_token(),
        )
        .await?;
        self.sessions().insert(class, lease.clone());
        // After the insert: a connection made meanwhile either restarted it or is read here.
        lease.keep_alive_on(&self.connection(), self.command_timeout());
        Ok(lease)
    }

    /// The kept-alive lease of `class`, if new guards may join it; one that may not is ended.
    fn usable_session(&self, class: i64) -> Option<Arc<SessionLease>> {
        let lease = self.sessions().get(&class).cloned()?;
        if lease.is_usable() {
            return Some(lease);
        }
        lease.end(LostReason::SessionExpired);
        None
    }

    /// Forgets a session lease the server no longer knows.
    pub(crate) fn drop_session(&self, lease: &SessionLease) {
        lease.end(LostReason::SessionExpired);
        let mut sessions = self.sessions();
        if sessions.get(&lease.class).is_some_and(|l| l.id == lease.id) {
            sessions.remove(&lease.class);
        }
    }

    /// Ends what the client keeps on the server, for `close`: its session leases revoked (any
    /// key still on them goes with them, at once rather than at their TTL), then its
    /// keep-alives and watch stream stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: a revoke cut short leaves its lease to run out at its TTL.
    pub(crate) async fn close(&self) {
        let leases: Vec<Arc<SessionLease>> = self.sessions().drain().map(|(_, l)| l).collect();
        for lease in &leases {
            lease.end(LostReason::ClientClosed);
        }
        if let Ok(client) = self.client().await {
            let revokes = leases.iter().map(|lease| {
                let mut leases = client.lease_client();
                let id = lease.id;
                async move {
                    let _ = leases.revoke(id).await;
                }
            });
            futures::future::join_all(revokes).await;
        }
        self.shutdown.cancel();
    }

    /// Revokes lease `id` in the background: one try, bounded by the command timeout.
    pub(crate) fn revoke_in_background(self: &Arc<Self>, id: i64) {
        let inner = self.clone();
        dlock_api::raw::spawn_cleanup(async move {
            let timeout = inner.command_timeout();
            let revoke = async {
                let mut leases = inner.client().await.ok()?.lease_client();
                leases.revoke(id).await.ok()
            };
            let _ = tokio::time::timeout(timeout, revoke).await;
        });
    }

    /// Deletes `key` if it is still ours (guarded by its create revision, or, when the create
    /// revision is unknown, by the unique key itself). Returns whether it was there; when the
    /// delete was resent after a lost answer, a key no longer ours counts as the first try's.
    pub(crate) async fn delete_key(&self, key: &str, revision: Option<i64>) -> Result<bool> {
        self.delete_key_and(key, revision, Vec::new()).await
    }

    /// As [`delete_key`](Self::delete_key), running `also` in the same transaction when the key
    /// is deleted (by its create revision) and is ours.
    pub(crate) async fn delete_key_and(
        &self,
        key: &str,
        revision: Option<i64>,
        also: Vec<TxnOp>,
    ) -> Result<bool> {
        let txn = match revision {
            Some(revision) => Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, revision)])
                .and_then(
                    std::iter::once(TxnOp::delete(key, None))
                        .chain(also)
                        .collect::<Vec<_>>(),
                ),
            None => Txn::new()
                .when([Compare::create_revision(key, CompareOp::Greater, 0)])
                .and_then([TxnOp::delete(key, None)]),
        };
        let (response, resent) = self
            .idempotent_resent_with(Client::kv_client, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        // A resent delete that finds the key gone: the first one landed.
        Ok(response.succeeded() || resent)
    }
}

/// Whether a failed create says the lease is gone on the server.
pub(crate) fn lease_gone(error: &LockError) -> bool {
    matches!(
        error,
        LockError::Backend { .. } | LockError::Unavailable { .. }
    ) && error
        .source_as::<crate::error::InOneSentence>()
        .is_some_and(|said| is_lease_not_found(said.error()))
}
