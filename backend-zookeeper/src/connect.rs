//! Opening a client of the ensemble: the one place that builds the client library's connector,
//! so every session (the lock's own, and the one `expire_session` attaches to) gets the same
//! credentials and TLS.

use dlock_api::{LockError, Result};
use zookeeper_client::{Client, Connector};

use crate::BACKEND;
use crate::config::ZkConfig;
use crate::error::map_err;

/// Connects a new client (a new session) within the connect timeout.
pub(crate) async fn client(config: &ZkConfig) -> Result<Client> {
    let hosts = config.connect_string();
    let connecting = dial(connector(config)?, config, &hosts);
    tokio::time::timeout(config.connect_timeout, connecting)
        .await
        .map_err(|_| LockError::command_timeout(BACKEND, config.connect_timeout))?
        .map_err(connect_error)
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

fn connect_error(error: zookeeper_client::Error) -> LockError {
    match error {
        zookeeper_client::Error::BadArguments(_) => {
            dlock_api::raw::config::config_error(BACKEND, error.to_string())
        }
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
