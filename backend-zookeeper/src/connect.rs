//! Opening a client of the ensemble: the one place that builds the client library's connector,
//! so every session (the lock's own, the same one attached to again from another runtime, and
//! the one `expire_session` attaches to) gets the same credentials and TLS.

use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::{LockError, Result};
use tokio::time::Instant;
use zookeeper_client::{Client, Connector, SessionInfo};

use crate::BACKEND;
use crate::config::ZkConfig;
use crate::error::{map_err, no_response};

/// Connects a new client (a new session) within the connect timeout. The connector gives up
/// after one pass over the hosts (see [`connector`]); a pass that finds no host ready (all
/// down, or a handshake too slow on a loaded machine) is tried again, with a growing pause,
/// until the connect timeout. A refusal that another pass would not change (bad arguments,
/// failed authentication) ends it at once. Past the timeout the last pass's error is
/// returned, so a refused certificate is reported as such, not as a timeout.
pub(crate) async fn client(config: &ZkConfig) -> Result<Client> {
    let connector = connector(config)?;
    within_timeout(connector, config)
        .await
        .map_err(|refused| match refused {
            Refused::Server(error) => connect_error(error, config),
            Refused::TimedOut => LockError::command_timeout(BACKEND, config.connect_timeout),
        })
}

/// Connects a new client to the existing session `info`, as [`client`] does a new one.
/// `Ok(None)`: the server no longer has the session.
pub(crate) async fn reattach(config: &ZkConfig, info: SessionInfo) -> Result<Option<Client>> {
    let connector = connector(config)?.with_session(info);
    match within_timeout(connector, config).await {
        Ok(client) => Ok(Some(client)),
        Err(Refused::Server(zookeeper_client::Error::SessionExpired)) => Ok(None),
        Err(Refused::Server(error)) => Err(connect_error(error, config)),
        Err(Refused::TimedOut) => Err(LockError::command_timeout(BACKEND, config.connect_timeout)),
    }
}

/// Ends the session `info` on the server now rather than at its expiry, and with it its nodes:
/// for a session whose own client cannot close it any more (its runtime stopped). Best effort.
pub(crate) async fn close_session(config: &ZkConfig, info: SessionInfo) {
    if let Ok(Some(client)) = reattach(config, info).await {
        close(client, config.command_timeout).await;
    }
}

/// Drops the last clone of `client`, which closes its session, and waits (up to `bound`) for
/// the server to confirm: its nodes are gone once this returns in time.
pub(crate) async fn close(client: Client, bound: Duration) {
    let mut states = client.state_watcher();
    drop(client);
    let closed = async { while !states.changed().await.is_terminated() {} };
    let _ = tokio::time::timeout(bound, closed).await;
}

enum Refused {
    Server(zookeeper_client::Error),
    TimedOut,
}

/// Dials `connector` until a pass over the hosts answers, within the connect timeout.
async fn within_timeout(
    connector: Connector,
    config: &ZkConfig,
) -> std::result::Result<Client, Refused> {
    let hosts = config.connect_string();
    let deadline = after(Instant::now(), config.connect_timeout);
    let mut pause = FIRST_PAUSE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let dialled = dial(connector.clone(), config, &hosts);
        let error = match tokio::time::timeout(left, dialled).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(error)) if passes_again(&error) => error,
            Ok(Err(error)) => return Err(Refused::Server(error)),
            Err(_) => return Err(Refused::TimedOut),
        };
        if after(Instant::now(), pause) >= deadline {
            return Err(Refused::Server(error));
        }
        tokio::time::sleep(pause).await;
        pause = pause.saturating_mul(2).min(MAX_PAUSE);
    }
}

const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Whether another pass over the hosts may succeed where this one failed.
fn passes_again(error: &zookeeper_client::Error) -> bool {
    use zookeeper_client::Error;
    matches!(
        error,
        Error::NoHosts | Error::ConnectionLoss | Error::Timeout | Error::Throttled
    ) || no_response(error)
}

/// A connector with the configuration's session timeout, credentials and TLS. It fails fast
/// when every host refuses, instead of cycling until the session timeout.
///
/// # Errors
/// [`LockError::Config`] for a TLS file that cannot be read or used.
pub(crate) fn connector(config: &ZkConfig) -> Result<Connector> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_fail_eagerly();
    if let (Some(user), Some(password)) = (&config.username, &config.password) {
        let auth = format!("{user}:{}", password.expose());
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    #[cfg(feature = "tls")]
    if config.tls {
        connector = connector.with_tls(tls_options(config)?);
    }
    Ok(connector)
}

/// Connects `connector` (from [`connector`]) to `hosts`, over TLS if the configuration says so;
/// no timeout of its own.
pub(crate) async fn dial(
    connector: Connector,
    config: &ZkConfig,
    hosts: &str,
) -> std::result::Result<Client, zookeeper_client::Error> {
    #[cfg(feature = "tls")]
    if config.tls {
        return connector.secure_connect(hosts).await;
    }
    // Without the feature `zks://` is refused when the configuration is parsed.
    let _ = config.tls;
    connector.connect(hosts).await
}

fn connect_error(error: zookeeper_client::Error, config: &ZkConfig) -> LockError {
    match error {
        zookeeper_client::Error::BadArguments(_) => {
            dlock_api::raw::config::config_error(BACKEND, error.to_string())
        }
        // The client library says only this, whether the hosts refused the connection, closed
        // it, or failed the TLS handshake: say what to check.
        zookeeper_client::Error::NoHosts => LockError::unavailable_because(
            BACKEND,
            if config.tls {
                "no host answered: each refused the connection or failed the TLS handshake (check \
                 that the port serves TLS and that ca_cert signed the server's certificate)"
            } else {
                "no host answered: each refused or closed the connection (check the hosts and \
                 that the port serves ZooKeeper without TLS)"
            },
        ),
        error => map_err(error),
    }
}

/// Picks ring as rustls's provider unless the process has one: a build that enables two
/// providers (another crate's TLS) leaves rustls unable to choose, and it panics.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(feature = "tls")]
fn tls_options(config: &ZkConfig) -> Result<zookeeper_client::TlsOptions> {
    use dlock_api::raw::config::config_error;
    install_crypto_provider();
    let pem = config.tls_files.read(BACKEND)?;
    let bad = |e: zookeeper_client::Error| config_error(BACKEND, e.to_string());
    let mut tls = zookeeper_client::TlsOptions::new();
    if let Some(ca) = &pem.ca_cert {
        tls = tls.with_pem_ca(ca).map_err(bad)?;
    }
    if let Some((cert, key)) = &pem.identity {
        tls = tls.with_pem_identity(cert, key).map_err(bad)?;
    }
    Ok(tls)
}
