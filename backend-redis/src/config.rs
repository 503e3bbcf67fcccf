//! `RedisConfig`: where the servers are and how to talk to them, from a URL or key/value pairs.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dlock_api::raw::config::{Secret, UrlParts, duration_option, tls_not_built, unknown_option};
use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::keys::LockKeys;

/// How the Redis deployment is laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server (`redis://host:port`).
    Single {
        /// `host:port`.
        node: String,
    },
    /// A primary found through Sentinels (`redis+sentinel://s1:26379,s2:26379/MASTER`); the client
    /// follows failovers by asking the Sentinels again.
    Sentinel {
        /// The Sentinels' `host:port`s.
        sentinels: Vec<String>,
        /// The monitored primary's name.
        master: String,
    },
    /// A Redis Cluster (`redis+cluster://n1:6379,n2:6379`); any reachable nodes bootstrap it.
    Cluster {
        /// Seed nodes' `host:port`s.
        nodes: Vec<String>,
    },
}

/// Configuration of a [`RedisLock`](crate::RedisLock).
///
/// Built from a URL ([`RedisConfig::from_url`]) and adjusted with [`set_option`](Self::set_option)
/// (the `[options]` table of a dlock config file uses the same keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `dlock` | key prefix: keys are `PREFIX:{NAME}`, `PREFIX:{NAME}:fence` |
/// | `connect_timeout` | `2s` | one attempt at the TCP connect and handshake (TLS included); a connect tries twice before it reports the server unavailable |
/// | `command_timeout` | `2s` | each command's reply; no call waits longer on a dead server |
/// | `wait_replicas` | `0` | after acquiring, `WAIT` for this many replicas (narrows, does not close, the failover window) |
/// | `wait_replicas_timeout` | `100ms` | how long that `WAIT` may take; fewer acknowledgements fail the acquire |
/// | `ca_cert` | (system roots) | with `rediss://`: a PEM file of the CA to trust instead (a private CA) |
/// | `nat_map` | (none) | Sentinel and Cluster behind NAT (Docker, Kubernetes, a proxy): `ANNOUNCED=REACHABLE` pairs of `host:port`, comma-separated; where a Sentinel names a primary, or a Cluster a node, at an announced address, connect to the reachable one instead |
/// | `eviction_check` | `warn` | at connect (and behind Sentinels, at each new primary), when the server may evict lock keys (`maxmemory` set, `maxmemory-policy` not `noeviction`): `warn`, `refuse` (a [`LockError::Config`]) or `off` |
///
/// `Debug` and `Display` never show the password.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Where the servers are.
    pub topology: Topology,
    /// `rediss://`: TLS to the servers.
    pub tls: bool,
    /// ACL user name.
    pub username: Option<String>,
    /// Password (never printed).
    pub password: Option<Secret>,
    /// Database number (single node and Sentinel only; Cluster has one database).
    pub database: i64,
    /// Key prefix.
    pub prefix: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// Replicas to `WAIT` for after an acquire (0: none).
    pub wait_replicas: usize,
    /// How long that `WAIT` may take.
    pub wait_replicas_timeout: Duration,
    /// With TLS: a PEM file of the CA to trust instead of the system's roots.
    pub ca_cert: Option<std::path::PathBuf>,
    /// What connecting does when the server may evict lock keys.
    pub eviction_check: EvictionCheck,
    /// Addresses (`host:port`) the servers announce, mapped to where this client reaches them
    /// (option `nat_map`); see [`reachable`](Self::reachable).
    pub nat_map: BTreeMap<String, String>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            topology: Topology::Single {
                node: "127.0.0.1:6379".into(),
            },
            tls: false,
            username: None,
            password: None,
            database: 0,
            prefix: "dlock".into(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            wait_replicas: 0,
            wait_replicas_timeout: Duration::from_millis(100),
            ca_cert: None,
            eviction_check: EvictionCheck::Warn,
            nat_map: BTreeMap::new(),
        }
    }
}

fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

impl RedisConfig {
    /// Parses `redis://`, `rediss://`, `redis+sentinel://` and `redis+cluster://` URLs:
    ///
    /// - `redis://[[user]:password@]host[:port][/db][?option=value…]`
    /// - `redis+sentinel://[[user]:password@]s1:26379,s2:26379/MASTER[/db][?…]` (the password is the
    ///   data nodes'; Sentinels are reached without one)
    /// - `redis+cluster://[[user]:password@]n1:6379,n2:6379[?…]` (`rediss+cluster://` for TLS)
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong; no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse(BACKEND, url, crate::SCHEMES)?;
        let (tls, kind) = match parts.scheme.as_str() {
            "redis" => (false, "single"),
            "rediss" => (true, "single"),
            "redis+sentinel" => (false, "sentinel"),
            "rediss+sentinel" => (true, "sentinel"),
            _ => (parts.scheme.starts_with("rediss"), "cluster"),
        };
        if tls && !cfg!(feature = "tls-rustls") {
            return Err(tls_not_built(
                BACKEND,
                "rediss",
                "`tls-rustls` (of dlock-redis, or of dlock)",
            ));
        }
        let mut config = Self {
            tls,
            username: parts.user.clone(),
            password: parts.password.clone(),
            ..Self::default()
        };
        let hosts = parts.host_ports(6379);
        let mut segments = parts.path.iter();
        config.topology = match kind {
            "single" => {
                if hosts.len() > 1 {
                    return Err(config_error(
                        "redis:// takes one host; use redis+cluster:// or redis+sentinel://",
                    ));
                }
                Topology::Single {
                    node: hosts[0].clone(),
                }
            }
            "sentinel" => {
                let master = segments.next().ok_or_else(|| {
                    config_error("redis+sentinel:// needs the master name as the path: /MASTER")
                })?;
                Topology::Sentinel {
                    sentinels: hosts,
                    master: master.to_owned(),
                }
            }
            _ => Topology::Cluster { nodes: hosts },
        };
        if let Some(db) = segments.next() {
            if matches!(config.topology, Topology::Cluster { .. }) {
                return Err(config_error("Redis Cluster has no database numbers"));
            }
            config.database = db
                .parse()
                .map_err(|_| config_error(format!("database `{db}` is not a number")))?;
        }
        if let Some(extra) = segments.next() {
            return Err(config_error(format!("unexpected path segment `{extra}`")));
        }
        parts.apply_options(|key, value| config.set_option(key, value))?;
        Ok(config)
    }

    /// Sets one option by name (see the table on [`RedisConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "prefix" => {
                LockKeys::check_prefix(BACKEND, value)?;
                self.prefix = value.to_owned();
            }
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            "wait_replicas" => {
                self.wait_replicas = value
                    .parse()
                    .map_err(|_| config_error("option `wait_replicas` takes a number"))?
            }
            "wait_replicas_timeout" => {
                self.wait_replicas_timeout = duration_option(BACKEND, key, value)?
            }
            "ca_cert" => self.ca_cert = Some(value.into()),
            "eviction_check" => self.eviction_check = value.parse()?,
            "nat_map" => self.nat_map = parse_nat_map(value)?,
            other => {
                return Err(unknown_option(
                    BACKEND,
                    other,
                    "prefix, connect_timeout, command_timeout, wait_replicas, wait_replicas_timeout, ca_cert, eviction_check, nat_map",
                ));
            }
        }
        Ok(())
    }

    /// Where this client reaches a server that announces itself at `announced` (`host:port`,
    /// as a Sentinel or a Cluster's slot map names it): its `nat_map` entry, else `announced`.
    pub fn reachable<'a>(&'a self, announced: &'a str) -> &'a str {
        self.nat_map
            .get(announced)
            .map_or(announced, String::as_str)
    }

    /// A `redis://` (or `rediss://`) URL for one node, with credentials and database, for the driver.
    pub(crate) fn node_url(&self, node: &str, with_db: bool) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let auth = match (&self.username, &self.password) {
            (None, None) => String::new(),
            (user, password) => format!(
                "{}:{}@",
                encode(user.as_deref().unwrap_or("")),
                encode(password.as_ref().map_or("", Secret::expose))
            ),
        };
        let db = if with_db {
            format!("/{}", self.database)
        } else {
            String::new()
        };
        format!("{scheme}://{auth}{node}{db}?protocol=resp3")
    }
}

/// `ANNOUNCED=REACHABLE[,ANNOUNCED=REACHABLE…]`, each side a `host:port`.
fn parse_nat_map(value: &str) -> Result<BTreeMap<String, String>> {
    let address = |text: &str| -> Result<String> {
        let text = text.trim();
        match text.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                Ok(text.to_owned())
            }
            _ => Err(config_error(format!(
                "option `nat_map`: `{text}` is not a host:port"
            ))),
        }
    };
    value
        .split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((announced, reachable)) => Ok((address(announced)?, address(reachable)?)),
            None => Err(config_error(format!(
                "option `nat_map` takes ANNOUNCED=REACHABLE pairs of host:port, not `{pair}`"
            ))),
        })
        .collect()
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.topology {
            Topology::Single { node } => write!(f, "{node}"),
            Topology::Sentinel { sentinels, master } => {
                write!(f, "sentinel {master}@{}", sentinels.join(","))
            }
            Topology::Cluster { nodes } => write!(f, "cluster {}", nodes.join(",")),
        }
    }
}

/// What [`RedisLock::connect`](crate::RedisLock::connect) does when the server may evict lock keys
/// (option `eviction_check`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum EvictionCheck {
    /// Log a warning and go on (the default: many managed Redis services default to
    /// `volatile-lru`, and refusing would make dlock unusable there without a word of why).
    #[default]
    Warn,
    /// Fail the connect with [`LockError::Config`].
    Refuse,
    /// Do not ask (for servers that deny `CONFIG GET`, or a policy known to be safe).
    Off,
}

impl FromStr for EvictionCheck {
    type Err = LockError;

    fn from_str(value: &str) -> Result<Self> {
        match value {
            "warn" => Ok(Self::Warn),
            "refuse" => Ok(Self::Refuse),
            "off" => Ok(Self::Off),
            other => Err(dlock_api::raw::config::config_error(
                BACKEND,
                format!("option `eviction_check` takes warn, refuse or off, not `{other}`"),
            )),
        }
    }
}

impl fmt::Display for EvictionCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Warn => "warn",
            Self::Refuse => "refuse",
            Self::Off => "off",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_node_urls() {
        let c = RedisConfig::from_url(
            "redis://:p%40ss@127.0.0.1:7000/2?prefix=app&command_timeout=500ms",
        )
        .unwrap();
        assert_eq!(
            c.topology,
            Topology::Single {
                node: "127.0.0.1:7000".into()
            }
        );
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("p@ss"));
        assert_eq!(c.database, 2);
        assert_eq!(c.prefix, "app");
        assert_eq!(c.command_timeout, Duration::from_millis(500));
        assert_eq!(
            RedisConfig::from_url("redis://localhost").unwrap().topology,
            Topology::Single {
                node: "localhost:6379".into()
            }
        );
    }

    #[test]
    fn parses_sentinel_and_cluster_urls() {
        let s = RedisConfig::from_url("redis+sentinel://a:26379,b:26380/mymaster/1").unwrap();
        assert_eq!(
            s.topology,
            Topology::Sentinel {
                sentinels: vec!["a:26379".into(), "b:26380".into()],
                master: "mymaster".into()
            }
        );
        assert_eq!(s.database, 1);
        let c = RedisConfig::from_url("redis+cluster://a:7000,b:7001").unwrap();
        assert_eq!(
            c.topology,
            Topology::Cluster {
                nodes: vec!["a:7000".into(), "b:7001".into()]
            }
        );
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        for bad in [
            "redis://",
            "redis://a:1,b:2",
            "redis+sentinel://a:1",
            "redis+cluster://a:1/3",
            "redis://h/x",
            "redis://h?nope=1",
            "redis://h?command_timeout=soon",
            "redis://h?command_timeout=0s",
            "redis://h?prefix=a{b}",
        ] {
            assert!(
                matches!(RedisConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn nat_map_maps_announced_addresses_and_nothing_else() {
        let c = RedisConfig::from_url(
            "redis+cluster://a:7000?nat_map=10.0.0.5:6379%3D127.0.0.1:16379,10.0.0.6:6379=localhost:16380",
        )
        .unwrap();
        assert_eq!(c.reachable("10.0.0.5:6379"), "127.0.0.1:16379");
        assert_eq!(c.reachable("10.0.0.6:6379"), "localhost:16380");
        assert_eq!(c.reachable("10.0.0.7:6379"), "10.0.0.7:6379");
        for bad in ["a:1", "a:1=b", "a=b:2", ":1=b:2", "a:x=b:2"] {
            assert!(
                matches!(
                    RedisConfig::from_url(&format!("redis+cluster://a:7000?nat_map={bad}")),
                    Err(LockError::Config { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_needs_the_feature() {
        let result = RedisConfig::from_url("rediss://h:6380");
        if cfg!(feature = "tls-rustls") {
            assert!(result.unwrap().tls);
        } else {
            assert!(matches!(result, Err(LockError::Config { .. })));
        }
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let c = RedisConfig::from_url("redis://user:hunter2@h:1").unwrap();
        assert!(!format!("{c:?} {c}").contains("hunter2"));
        assert!(c.node_url("h:1", true).contains("hunter2"));
    }
}
