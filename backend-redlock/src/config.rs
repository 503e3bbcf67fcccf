//! `RedlockConfig`: the nodes, the quorum and the timing allowances, from a URL or key/value
//! pairs.

use std::fmt;
use std::time::Duration;

use dlock_api::raw::config::{Secret, UrlParts, duration_option, tls_not_built, unknown_option};
use dlock_api::{LockError, Result};
use dlock_redis::{EvictionCheck, LockKeys, RedisConfig, Topology};

use crate::BACKEND;

/// The port a node listens on when the URL gives none.
pub const DEFAULT_PORT: u16 = 6379;

/// Configuration of a [`Redlock`](crate::Redlock).
///
/// Built from a URL ([`RedlockConfig::from_url`]) and adjusted with
/// [`set_option`](Self::set_option) (the `[options]` table of a dlock config file uses the same
/// keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `dlock` | key prefix on every node: `PREFIX:{NAME}`, `PREFIX:{NAME}:fence` |
/// | `quorum` | a majority, `N/2 + 1` | nodes an acquire and an extend need; refused below a majority or above N |
/// | `node_timeout` | 5 % of the TTL, at least 5 ms | how long one node may take to answer an acquire or extend; capped by `command_timeout` |
/// | `drift_factor` | `0.01` | clock drift allowance per unit of TTL |
/// | `drift` | `2ms` | fixed drift allowance added to it |
/// | `min_validity` | `1ms` | the least validity a grant may have left; less fails the attempt (and releases it) |
/// | `retry_delay` | `10ms` | the longest random delay before trying again after a split vote |
/// | `connect_timeout` | `2s` | TCP connect and handshake, per node |
/// | `command_timeout` | `2s` | each release, subscription and fence write-back |
/// | `eviction_check` | `warn` | at connect, per node, when it may evict lock keys: `warn`, `refuse` or `off` (see [`EvictionCheck`]) |
///
/// `Debug` and `Display` never show the password.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// The nodes' `host:port`s, in order.
    pub nodes: Vec<String>,
    /// `redlocks://`: TLS to every node.
    pub tls: bool,
    /// ACL user name (the same on every node).
    pub username: Option<String>,
    /// Password (the same on every node; never printed).
    pub password: Option<Secret>,
    /// Database number on every node.
    pub database: i64,
    /// Key prefix.
    pub prefix: String,
    /// Nodes needed for an acquire or an extend (`None`: a majority).
    pub quorum: Option<usize>,
    /// One node's answer timeout; `None`: 5 % of the TTL, at least 5 ms.
    pub node_timeout: Option<Duration>,
    /// Drift allowance per unit of TTL.
    pub drift_factor: f64,
    /// Fixed drift allowance.
    pub drift: Duration,
    /// The least validity a grant may have left.
    pub min_validity: Duration,
    /// The longest random delay before trying again after a split vote.
    pub retry_delay: Duration,
    /// Connect timeout, per node.
    pub connect_timeout: Duration,
    /// Per-command timeout for releases, subscriptions and fence write-backs.
    pub command_timeout: Duration,
    /// With TLS: a PEM file of the CA to trust instead of the system's roots.
    pub ca_cert: Option<std::path::PathBuf>,
    /// What connecting does when a node may evict lock keys.
    pub eviction_check: EvictionCheck,
}

impl RedlockConfig {
    /// The shortest TTL this configuration accepts: a round over every node (each allowed 5 %
    /// of the TTL, at least 5 ms) plus the drift allowance must still leave `min_validity`, with
    /// room to spare on a loaded machine; never under 100 ms.
    pub fn min_ttl(&self) -> Duration {
        let needed = self
            .drift
            .saturating_add(self.min_validity)
            .saturating_add(Duration::from_millis(5));
        let usable = (1.0 - self.drift_factor - 0.05).max(0.1);
        needed.div_f64(usable).max(Duration::from_millis(100))
    }
}

impl Default for RedlockConfig {
    fn default() -> Self {
        Self {
            nodes: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            tls: false,
            username: None,
            password: None,
            database: 0,
            prefix: "dlock".into(),
            quorum: None,
            node_timeout: None,
            drift_factor: 0.01,
            drift: Duration::from_millis(2),
            min_validity: Duration::from_millis(1),
            retry_delay: Duration::from_millis(10),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            ca_cert: None,
            eviction_check: EvictionCheck::Warn,
        }
    }
}

fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

/// The shortest per-node timeout derived from a TTL: below it a loopback round trip on a loaded
/// machine would count as a failed node.
const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(5);

impl RedlockConfig {
    /// Parses `redlock://[[user]:password@]h1[:port],h2[:port],…[/db][?option=value…]`, and
    /// `redlocks://…` for TLS to every node (feature `tls-rustls`). The port defaults to 6379.
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong (a node listed twice, a quorum below a majority,
    /// an unknown option); no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse(BACKEND, url, crate::SCHEMES)?;
        let tls = parts.scheme == "redlocks";
        if tls && !cfg!(feature = "tls-rustls") {
            return Err(tls_not_built(
                BACKEND,
                "redlocks",
                "`tls-rustls` (of dlock-redlock, or of dlock)",
            ));
        }
        let mut config = Self {
            tls,
            username: parts.user.clone(),
            password: parts.password.clone(),
            nodes: parts.host_ports(DEFAULT_PORT),
            ..Self::default()
        };
        if let Some(db) = parts.path.first() {
            config.database = db
                .parse()
                .map_err(|_| config_error(format!("database `{db}` is not a number")))?;
        }
        parts.at_most_segments(BACKEND, 1)?;
        parts.apply_options(|key, value| config.set_option(key, value))?;
        config.validate()?;
        Ok(config)
    }

    /// Sets one option by name (see the table on [`RedlockConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "prefix" => {
                LockKeys::check_prefix(BACKEND, value)?;
                self.prefix = value.to_owned();
            }
            "quorum" => {
                self.quorum = Some(
                    value
                        .parse()
                        .map_err(|_| config_error("option `quorum` takes a number of nodes"))?,
                )
            }
            "node_timeout" => self.node_timeout = Some(duration_option(BACKEND, key, value)?),
            "drift_factor" => {
                let factor: f64 = value
                    .parse()
                    .map_err(|_| config_error("option `drift_factor` takes a number"))?;
                if !(0.0..0.5).contains(&factor) {
                    return Err(config_error(
                        "option `drift_factor` must be at least 0 and below 0.5",
                    ));
                }
                self.drift_factor = factor;
            }
            "drift" => self.drift = zero_or_duration(key, value)?,
            "min_validity" => self.min_validity = zero_or_duration(key, value)?,
            "retry_delay" => self.retry_delay = duration_option(BACKEND, key, value)?,
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            "ca_cert" => self.ca_cert = Some(value.into()),
            "eviction_check" => self.eviction_check = value.parse()?,
            other => {
                return Err(unknown_option(
                    BACKEND,
                    other,
                    "prefix, quorum, node_timeout, drift_factor, drift, min_validity, retry_delay, connect_timeout, command_timeout, ca_cert, eviction_check",
                ));
            }
        }
        Ok(())
    }

    /// Checks what single options cannot: the node list and the quorum.
    ///
    /// # Errors
    /// [`LockError::Config`]: no node, a node listed twice, a quorum below a majority or above
    /// the number of nodes.
    pub fn validate(&self) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(config_error("Redlock needs at least one node"));
        }
        if self.nodes.len() > 64 {
            return Err(config_error("Redlock takes at most 64 nodes"));
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if self.nodes[..i].contains(node) {
                return Err(config_error(format!(
                    "node {node} is listed twice; each node must be an independent server"
                )));
            }
        }
        if let Some(quorum) = self.quorum {
            let n = self.nodes.len();
            if quorum < majority(n) || quorum > n {
                return Err(config_error(format!(
                    "quorum {quorum} of {n} nodes: it must be a majority ({} to {n}), or two clients could both hold the lock",
                    majority(n)
                )));
            }
        }
        Ok(())
    }

    /// The nodes an acquire or extend needs.
    pub fn quorum(&self) -> usize {
        self.quorum.unwrap_or_else(|| majority(self.nodes.len()))
    }

    /// One node's answer timeout for a lease of `ttl`.
    pub fn node_timeout_for(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| {
                ttl.checked_div(20)
                    .unwrap_or_default()
                    .max(MIN_NODE_TIMEOUT)
            })
            .min(self.command_timeout)
    }

    /// The clock drift allowance for a lease of `ttl`: `ttl × drift_factor + drift`.
    pub fn drift_for(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor).saturating_add(self.drift)
    }

    /// The single-node configuration of node `i`: its address with the URL's credentials,
    /// database, TLS and timeouts, as each node is connected.
    ///
    /// # Panics
    /// If `i` is not below the number of nodes.
    pub fn node_config(&self, i: usize) -> RedisConfig {
        let mut config = RedisConfig::default();
        config.topology = Topology::Single {
            node: self.nodes[i].clone(),
        };
        config.tls = self.tls;
        config.username.clone_from(&self.username);
        config.password.clone_from(&self.password);
        config.database = self.database;
        config.prefix.clone_from(&self.prefix);
        config.connect_timeout = self.connect_timeout;
        config.command_timeout = self.command_timeout;
        config.ca_cert.clone_from(&self.ca_cert);
        config.eviction_check = self.eviction_check;
        config
    }
}

/// `n / 2 + 1`.
pub(crate) fn majority(n: usize) -> usize {
    (n / 2).saturating_add(1)
}

fn zero_or_duration(key: &str, value: &str) -> Result<Duration> {
    if matches!(value, "0" | "0s" | "0ms") {
        return Ok(Duration::ZERO);
    }
    duration_option(BACKEND, key, value)
}

impl fmt::Display for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes, quorum {}: {}",
            self.nodes.len(),
            self.quorum(),
            self.nodes.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_node_lists_and_options() {
        let c = RedlockConfig::from_url(
            "redlock://:p%40ss@a:1,b,[::1]:3/2?quorum=3&node_timeout=20ms&drift=0&prefix=app",
        )
        .unwrap();
        assert_eq!(c.nodes, ["a:1", "b:6379", "[::1]:3"]);
        assert_eq!(c.quorum(), 3);
        assert_eq!(c.database, 2);
        assert_eq!(c.prefix, "app");
        assert_eq!(c.drift, Duration::ZERO);
        assert_eq!(
            c.node_timeout_for(Duration::from_secs(30)),
            Duration::from_millis(20)
        );
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert!(!format!("{c:?} {c}").contains("p@ss"));
        let d = RedlockConfig::from_url("redlock://a,b,c,d,e").unwrap();
        assert_eq!(d.quorum(), 3);
        assert_eq!(
            d.node_timeout_for(Duration::from_secs(10)),
            Duration::from_millis(500)
        );
        assert_eq!(
            d.node_timeout_for(Duration::from_millis(20)),
            MIN_NODE_TIMEOUT
        );
        assert_eq!(
            d.node_timeout_for(Duration::from_secs(3600)),
            d.command_timeout
        );
        assert_eq!(
            d.drift_for(Duration::from_secs(10)),
            Duration::from_millis(102)
        );
        assert_eq!(d.node_config(4).to_string(), "e:6379");
    }

    #[test]
    fn refuses_unsafe_and_malformed_configs() {
        for bad in [
            "redlock://",
            "redis://a,b,c",
            "redlock://a,b,c?quorum=1",
            "redlock://a,b,c,d?quorum=2",
            "redlock://a,b,c?quorum=4",
            "redlock://a,b,c?quorum=many",
            "redlock://a,b,a",
            "redlock://a:1,a:1,b",
            "redlock://a,b,c/x",
            "redlock://a,b,c/1/2",
            "redlock://a,b,c?drift_factor=2",
            "redlock://a,b,c?node_timeout=0s",
            "redlock://a,b,c?retry_delay=soon",
            "redlock://a,b,c?sentinel=1",
            "redlock://a,b,c?prefix=",
        ] {
            assert!(
                matches!(RedlockConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
        let tls = RedlockConfig::from_url("redlocks://a,b,c");
        assert_eq!(tls.is_ok(), cfg!(feature = "tls-rustls"));
    }
}
