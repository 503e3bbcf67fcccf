//! The etcd connection a client uses, and what runs on the tokio runtime it was made on.
//!
//! A `Client` lives partly in a task of the runtime it connected on (tonic's channel worker), and
//! this crate runs its background work there too: the watch stream, the keep-alive loops, the
//! held keys' watches. A client kept longer than that runtime (in a `static` shared by
//! `#[tokio::test]`s, each on a runtime of its own) would find all of that dropped with it and
//! every call failing. So every use of the connection first asks whether its runtime has stopped
//! (one atomic load); the first caller that finds it so connects again on its own runtime, and
//! each piece of background work is started again there ([`Running`]). Leases and keys live on
//! the server, not in the connection: a guard held across the runtime's end still holds once its
//! lease is kept alive again, and is told lost if the lease ended meanwhile.

use std::future::Future;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use dlock_api::raw::RuntimeLife;
use dlock_api::{LockError, Result};
use etcd_client::{Client, ConnectOptions};
use tokio::runtime::Handle;

use crate::BACKEND;
use crate::config::EtcdConfig;

/// A client and the runtime its channel, and the background work started with it, run on.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    life: RuntimeLife,
    runtime: Handle,
}

impl Conn {
    /// Connects with `config` on the runtime this is called on. The client crate's connect
    /// touches no server (unless it authenticates).
    pub(crate) async fn open(config: &EtcdConfig) -> Result<Self> {
        let (Some(life), Ok(runtime)) = (RuntimeLife::current(), Handle::try_current()) else {
            return Err(LockError::unexpected(
                BACKEND,
                "connecting outside a tokio runtime",
            ));
        };
        let client = Client::connect(config.endpoint_urls(), Some(config.driver_options()?))
            .await
            .map_err(|e| match e {
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => {
                    dlock_api::raw::config::config_error(BACKEND, e.to_string())
                }
                // Whatever else fails a connect (a refused or unreachable member) is an outage,
                // unless the configuration must change (credentials, certificates).
                e => {
                    let said = crate::error::InOneSentence::new(e);
                    crate::error::to_fix_in_config(&said)
                        .unwrap_or_else(|| LockError::unavailable(BACKEND, said))
                }
            })?;
        Ok(Self {
            client,
            life,
            runtime,
        })
    }

    /// Whether the runtime it was made on has shut down, taking the channel's worker with it.
    pub(crate) fn has_stopped(&self) -> bool {
        self.life.has_stopped()
    }
}

/// The connection in use: read on every request, replaced when its runtime has stopped.
pub(crate) struct Connection(RwLock<Conn>);

impl Connection {
    pub(crate) fn new(conn: Conn) -> Self {
        Self(RwLock::new(conn))
    }

    /// The connection in use, even one whose runtime has stopped.
    pub(crate) fn current(&self) -> Conn {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What `pick` takes of the client (the client itself, or one of its service clients),
    /// unless its runtime has stopped.
    pub(crate) fn live_with<C>(&self, pick: fn(&Client) -> C) -> Option<C> {
        let conn = self.0.read().unwrap_or_else(|e| e.into_inner());
        (!conn.has_stopped()).then(|| pick(&conn.client))
    }

    pub(crate) fn set(&self, conn: Conn) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = conn;
    }
}

/// The runtime one piece of background work (a keep-alive loop, the watch stream) runs on, so
/// that it is started again, once, on the next connection's runtime after that one stopped.
#[derive(Debug, Default)]
pub(crate) struct Running(Mutex<Option<RuntimeLife>>);

impl Running {
    /// Spawns `task()` on `conn`'s runtime unless it already runs on a runtime that has not
    /// stopped. Nothing when `conn`'s own runtime has stopped: whoever connects again starts it.
    pub(crate) fn ensure<F>(&self, conn: &Conn, task: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut on = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if on.as_ref().is_some_and(|life| !life.has_stopped()) || conn.has_stopped() {
            return;
        }
        conn.runtime.spawn(task());
        *on = Some(conn.life.clone());
    }
}

impl EtcdConfig {
    /// The etcd-client options of every client dlock makes: the timeouts, HTTP/2 keep-alive,
    /// `require_leader`, credentials and TLS (certificate files read now). For tools that talk
    /// to the same cluster with etcd-client directly, as `dlock bench` does for its raw floors.
    ///
    /// # Errors
    /// [`LockError::Config`] if a certificate file cannot be read.
    #[cfg(feature = "driver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "driver")))]
    pub fn connect_options(&self) -> Result<ConnectOptions> {
        self.driver_options()
    }

    /// [`connect_options`](Self::connect_options), for this crate's own connections.
    pub(crate) fn driver_options(&self) -> Result<ConnectOptions> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.command_timeout)
            .with_keep_alive(Duration::from_secs(1), self.command_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&self.username, &self.password) {
            options = options
                .with_user(user.clone(), password.expose().to_owned())
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "tls")]
        if self.tls {
            options = options.with_tls(tls_options(self)?);
        }
        Ok(options)
    }
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
