//! The client every guard and waiter of one `EtcdLock` shares: the connection, its session
//! leases by TTL class, the watch stream, and the requests they all make (retried where a retry
//! is safe).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::{LockError, LostReason, Result};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, TxnResponse,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::BACKEND;
use crate::config::EtcdConfig;
use crate::error::{is_lease_not_found, is_unavailable, map_err, timed_out};
use crate::keys::KeysInUse;
use crate::session::{SessionLease, ttl_class};
use crate::watch::Watcher;

/// How often a waiter re-reads the queue, and a holder its key, even without a watch event: a
/// fallback against an event lost by the server (etcd 3.4 before 3.4.31/3.4.36 can lose one
/// after a compaction).
pub(crate) const FALLBACK_REREAD: Duration = Duration::from_secs(3);

/// One `EtcdLock`'s shared state; the last clone's drop ends its keep-alives and watch stream.
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
    pub(crate) keys_in_use: KeysInUse,
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
        Ok(inner)
    }

    pub(crate) fn command_timeout(&self) -> Duration {
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

/// Whether a failed create says the lease is gone on the server.
pub(crate) fn lease_gone(error: &LockError) -> bool {
    matches!(
        error,
        LockError::Backend { .. } | LockError::Unavailable { .. }
    ) && error
        .source_as::<etcd_client::Error>()
        .is_some_and(is_lease_not_found)
}
