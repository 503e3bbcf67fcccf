//! The `redis` crate's clients, set up the way dlock's own connections are: the URL's
//! credentials, database and RESP3, TLS trusting the configured CA, and the primary the
//! Sentinels name. For tools that speak raw Redis to a deployment beside dlock (a benchmark's
//! floor, a health check): they reach the same servers, the same way, from the same URL.
//!
//! ```no_run
//! # async fn check() -> dlock_api::Result<()> {
//! use dlock_redis::{RedisConfig, driver, redis};
//!
//! let config = RedisConfig::from_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/locks")?;
//! let primary = driver::primary(&config).await?;
//! let client = driver::node_client(&config, &primary)?;
//! let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
//! let pong: String = redis::cmd("PING").query_async(&mut conn).await.expect("PING");
//! # let _ = pong;
//! # Ok(())
//! # }
//! ```

use dlock_api::{LockError, Result};

use crate::config::{RedisConfig, Topology};
use crate::error::{map_err, timed_out};

/// The address (`host:port`) of the server that takes writes: a single-node URL's node, or the
/// primary the Sentinels name now.
///
/// # Errors
/// [`LockError::Config`] for a Cluster (each slot has its own primary: use
/// [`cluster_client`]) or when no Sentinel knows the master; [`LockError::Unavailable`] when
/// no Sentinel answers within the connect timeout.
///
/// # Cancel safety
/// Cancel safe: it only asks.
pub async fn primary(config: &RedisConfig) -> Result<String> {
    match &config.topology {
        Topology::Single { node } => Ok(node.clone()),
        Topology::Sentinel { sentinels, master } => find_primary(config, sentinels, master).await,
        Topology::Cluster { .. } => Err(LockError::Config {
            backend: crate::BACKEND,
            reason: "a Redis Cluster has a primary per slot: use a cluster client".into(),
        }),
    }
}

/// The servers of a deployment, as a client of it meets them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Members {
    /// The servers the configuration lists (`host:port`): the node, the Sentinels, or the
    /// Cluster's seeds.
    pub listed: Vec<String>,
    /// The data nodes the listed servers announce, at the addresses they announce them
    /// (before any `nat_map`): a Sentinel's primary and its replicas, every node of a Cluster
    /// (its seeds too, as the Cluster names them). Empty for a single node.
    pub announced: Vec<String>,
}

/// Every server a client of `config` may connect to: what a tool needs to put each of them
/// behind a proxy (and map the announced ones to it with `nat_map`), or to check them all.
///
/// # Errors
/// [`LockError::Unavailable`] when the first listed server does not answer; a Sentinel that
/// does not know the master is a [`LockError::Config`].
///
/// # Cancel safety
/// Cancel safe: it only asks.
pub async fn members(config: &RedisConfig) -> Result<Members> {
    match &config.topology {
        Topology::Single { node } => Ok(Members {
            listed: vec![node.clone()],
            announced: Vec::new(),
        }),
        Topology::Sentinel { sentinels, master } => {
            let asked = async {
                let first = sentinels.first().map_or("", String::as_str);
                let mut conn = sentinel_client(config, first)?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(map_err)?;
                let Some(primary) = announced_primary(&mut conn, master).await? else {
                    return Err(LockError::Config {
                        backend: crate::BACKEND,
                        reason: format!("sentinel {first} does not know a master named `{master}`"),
                    });
                };
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg(master)
                        .query_async(&mut conn)
                        .await
                        .map_err(map_err)?;
                let mut announced = vec![primary];
                announced.extend(
                    replicas
                        .iter()
                        .filter_map(|r| Some(format!("{}:{}", r.get("ip")?, r.get("port")?))),
                );
                Ok(announced)
            };
            let announced = tokio::time::timeout(config.connect_timeout, asked)
                .await
                .map_err(|_| timed_out(config.connect_timeout))??;
            Ok(Members {
                listed: sentinels.clone(),
                announced,
            })
        }
        Topology::Cluster { nodes } => {
            let asked = async {
                let first = nodes.first().map_or("", String::as_str);
                let mut conn = node_client(config, first)?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(map_err)?;
                let listing: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut conn)
                    .await
                    .map_err(map_err)?;
                Ok::<_, LockError>(listing)
            };
            let listing = tokio::time::timeout(config.connect_timeout, asked)
                .await
                .map_err(|_| timed_out(config.connect_timeout))??;
            // `<id> <ip:port@bus-port[,hostname]> <flags> …`, a line per node; a node without
            // an address yet (`:0@0`, flag `noaddr`) has nothing to reach.
            let announced = listing
                .lines()
                .filter_map(|line| line.split_whitespace().nth(1)?.split(['@', ',']).next())
                .filter(|address| !address.starts_with(':'))
                .map(str::to_owned)
                .collect();
            Ok(Members {
                listed: nodes.clone(),
                announced,
            })
        }
    }
}

/// A driver client for the Cluster the configuration names (every listed node a seed), with its
/// credentials, TLS and CA, RESP3, and its connect and command timeouts.
///
/// # Errors
/// [`LockError::Config`] when the configuration is not a Cluster's, the CA file cannot be read,
/// or the driver refuses the nodes.
pub fn cluster_client(config: &RedisConfig) -> Result<redis::cluster::ClusterClient> {
    let Topology::Cluster { nodes } = &config.topology else {
        return Err(LockError::Config {
            backend: crate::BACKEND,
            reason: "not a Redis Cluster's configuration: use node_client".into(),
        });
    };
    let urls: Vec<String> = nodes.iter().map(|n| config.node_url(n, false)).collect();
    let mut builder = redis::cluster::ClusterClientBuilder::new(urls);
    if !config.nat_map.is_empty() {
        builder = builder.node_address_map(node_address_map(config)?);
    }
    #[cfg(feature = "tls-rustls")]
    let builder = match tls_certificates(config)? {
        Some(certificates) => builder.certs(certificates),
        None => builder,
    };
    builder
        .use_protocol(redis::ProtocolVersion::RESP3)
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.command_timeout)
        .build()
        .map_err(|e| LockError::Config {
            backend: crate::BACKEND,
            reason: e.to_string(),
        })
}

/// The configuration's `nat_map` as the driver takes it: applied as it connects to a node the
/// slot map (or a `MOVED` redirect) names, which keeps the announced address as the node's name.
fn node_address_map(
    config: &RedisConfig,
) -> Result<std::collections::HashMap<redis::cluster::NodeAddress, redis::cluster::NodeAddress>> {
    let node = |address: &str| {
        address
            .rsplit_once(':')
            .and_then(|(host, port)| {
                Some(redis::cluster::NodeAddress::new(host, port.parse().ok()?))
            })
            .ok_or_else(|| LockError::Config {
                backend: crate::BACKEND,
                reason: format!("option `nat_map`: `{address}` is not a host:port"),
            })
    };
    config
        .nat_map
        .iter()
        .map(|(announced, reachable)| Ok((node(announced)?, node(reachable)?)))
        .collect()
}

/// The CA to trust, read from the configured PEM file (TLS with a private CA).
#[cfg(feature = "tls-rustls")]
fn tls_certificates(config: &RedisConfig) -> Result<Option<redis::TlsCertificates>> {
    // Every client of this module passes through here before it connects.
    if config.tls {
        install_crypto_provider();
    }
    let Some(path) = config.ca_cert.as_ref() else {
        return Ok(None);
    };
    if !config.tls {
        return Err(LockError::Config {
            backend: crate::BACKEND,
            reason: "ca_cert is for TLS: use rediss:// (or rediss+sentinel://, rediss+cluster://)"
                .into(),
        });
    }
    let root_cert = std::fs::read(path).map_err(|e| LockError::Config {
        backend: crate::BACKEND,
        reason: format!("cannot read ca_cert {}: {e}", path.display()),
    })?;
    if !root_cert
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(LockError::Config {
            backend: crate::BACKEND,
            reason: format!("ca_cert {} holds no PEM certificate", path.display()),
        });
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    }))
}

/// rustls needs one process-wide crypto provider and panics at the first TLS connection without
/// one; install ring's unless the application installed its own.
#[cfg(feature = "tls-rustls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A driver client for `node` (`host:port`) with the configuration's credentials, database and
/// TLS, trusting its CA when it names one. Nothing is connected yet.
///
/// # Errors
/// [`LockError::Config`] when the CA file cannot be read or holds no certificate, or when the
/// driver refuses the address.
pub fn node_client(config: &RedisConfig, node: &str) -> Result<redis::Client> {
    client_with_tls(config, node, config.node_url(node, true))
}

/// A client of a Sentinel: without the data nodes' credentials and database, but with their
/// TLS and its certificates (a private CA signs the Sentinels too).
pub(crate) fn sentinel_client(config: &RedisConfig, sentinel: &str) -> Result<redis::Client> {
    let scheme = if config.tls { "rediss" } else { "redis" };
    client_with_tls(config, sentinel, format!("{scheme}://{sentinel}"))
}

fn client_with_tls(config: &RedisConfig, node: &str, url: String) -> Result<redis::Client> {
    #[cfg(feature = "tls-rustls")]
    let client = match tls_certificates(config)? {
        Some(certificates) => redis::Client::build_with_tls(url, certificates),
        None => redis::Client::open(url),
    };
    #[cfg(not(feature = "tls-rustls"))]
    let client = {
        // Without TLS built in, its settings were refused when the URL was parsed.
        let _ = config;
        redis::Client::open(url)
    };
    client.map_err(|e| LockError::Config {
        backend: crate::BACKEND,
        reason: format!("cannot use node {node}: {e}"),
    })
}

/// Where a Sentinel says the primary `master` is, as the primary announces itself (`host:port`,
/// before any `nat_map`); `None` when it does not know the name.
async fn announced_primary(
    conn: &mut redis::aio::MultiplexedConnection,
    master: &str,
) -> Result<Option<String>> {
    let reply: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(conn)
        .await
        .map_err(map_err)?;
    Ok(reply.map(|(host, port)| format!("{host}:{port}")))
}

/// Asks the Sentinels, in order, where the primary `master` is.
pub(crate) async fn find_primary(
    config: &RedisConfig,
    sentinels: &[String],
    master: &str,
) -> Result<String> {
    let (mut last_error, mut unknown) = (None, None);
    for sentinel in sentinels {
        let asked = async {
            let client = sentinel_client(config, sentinel)?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(map_err)?;
            announced_primary(&mut conn, master).await
        };
        match tokio::time::timeout(config.connect_timeout, asked).await {
            Ok(Ok(Some(announced))) => return Ok(config.reachable(&announced).to_owned()),
            // A Sentinel just replaced may not monitor the master yet: ask the next.
            Ok(Ok(None)) => {
                unknown = Some(LockError::Config {
                    backend: crate::BACKEND,
                    reason: format!("sentinel {sentinel} does not know a master named `{master}`"),
                });
            }
            Ok(Err(e)) => last_error = Some(e),
            Err(_) => last_error = Some(timed_out(config.connect_timeout)),
        }
    }
    Err(unknown
        .or(last_error)
        .unwrap_or_else(|| timed_out(config.connect_timeout)))
}
