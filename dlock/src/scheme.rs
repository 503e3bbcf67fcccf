//! Which backend a URL names.

use std::fmt;

use dlock_api::{LockError, Result};
use url::Url;

// A compiled-in backend's schemes are its own `SCHEMES`, so the facade cannot drift from it; the
// copies below only serve the error that names the feature a left-out backend needs.
#[cfg(feature = "redis")]
const REDIS: &[&str] = dlock_redis::SCHEMES;
#[cfg(not(feature = "redis"))]
const REDIS: &[&str] = &[
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];
#[cfg(feature = "mysql")]
const MYSQL: &[&str] = dlock_mysql::SCHEMES;
#[cfg(not(feature = "mysql"))]
const MYSQL: &[&str] = &["mysql", "mariadb"];
#[cfg(feature = "etcd")]
const ETCD: &[&str] = dlock_etcd::SCHEMES;
#[cfg(not(feature = "etcd"))]
const ETCD: &[&str] = &["etcd", "etcds"];
#[cfg(feature = "redlock")]
const REDLOCK: &[&str] = dlock_redlock::SCHEMES;
#[cfg(not(feature = "redlock"))]
const REDLOCK: &[&str] = &["redlock", "redlocks"];
#[cfg(feature = "zookeeper")]
const ZOOKEEPER: &[&str] = dlock_zookeeper::SCHEMES;
#[cfg(not(feature = "zookeeper"))]
const ZOOKEEPER: &[&str] = &["zk", "zks"];
#[cfg(feature = "postgres")]
const POSTGRES: &[&str] = dlock_postgres::SCHEMES;
#[cfg(not(feature = "postgres"))]
const POSTGRES: &[&str] = &["postgres", "postgresql"];

/// The backends dlock knows, named by URL scheme.
///
/// A closed list with a `cfg`'d match (object_store's `ObjectStoreScheme`): no global registry,
/// nothing to install at start-up, and a clear error for a backend left out of the build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendScheme {
    /// `memory://[STORE]`: the in-process backend.
    Memory,
    /// `redis://`, `rediss://`, `redis+sentinel://`, `redis+cluster://`.
    Redis,
    /// `redlock://host1,host2,…`, `redlocks://…`.
    Redlock,
    /// `mysql://`, `mariadb://`.
    MySql,
    /// `postgres://`, `postgresql://`.
    Postgres,
    /// `etcd://`, `etcds://`.
    Etcd,
    /// `zk://`, `zks://`.
    ZooKeeper,
}

impl BackendScheme {
    /// Every scheme, with its URL schemes and cargo feature.
    pub const ALL: &[(BackendScheme, &[&str], &str)] = &[
        (Self::Memory, &["memory"], "(always)"),
        (Self::Redis, REDIS, "redis"),
        (Self::Redlock, REDLOCK, "redlock"),
        (Self::MySql, MYSQL, "mysql"),
        (Self::Postgres, POSTGRES, "postgres"),
        (Self::Etcd, ETCD, "etcd"),
        (Self::ZooKeeper, ZOOKEEPER, "zookeeper"),
    ];

    /// The backend `url` names, from its scheme alone.
    ///
    /// Takes the URL as text because some backends' URLs list several hosts
    /// (`redlock://h1:6379,h2:6379`), which a generic URL parser refuses; each backend parses the
    /// rest of its own URL.
    ///
    /// # Errors
    /// [`LockError::Config`] for text without `scheme://`, or a scheme dlock does not know
    /// (the message lists the ones it does).
    pub fn parse(url: &str) -> Result<Self> {
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(LockError::Config {
                backend: "dlock",
                reason: format!(
                    "`{}` is not a backend URL: expected `scheme://…`, e.g. memory:// or redis://host:6379",
                    redact(url)
                ),
            });
        };
        let scheme = scheme.to_ascii_lowercase();
        let scheme = scheme.as_str();
        Self::ALL
            .iter()
            .find(|(_, schemes, _)| schemes.contains(&scheme))
            .map(|(s, _, _)| *s)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL
                    .iter()
                    .flat_map(|(_, s, _)| s.iter().copied())
                    .collect();
                LockError::Config {
                    backend: "dlock",
                    reason: format!(
                        "unknown scheme `{scheme}://`; dlock knows {}",
                        known.join(", ")
                    ),
                }
            })
    }

    /// The cargo feature that compiles this backend in.
    pub fn feature(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _, _)| *s == self)
            .map(|(_, _, f)| *f)
            .unwrap_or("?")
    }

    /// The backend's tag in errors and logs.
    pub fn tag(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Redlock => "redlock",
            Self::MySql => "mysql",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
            Self::ZooKeeper => "zookeeper",
        }
    }
}

impl fmt::Display for BackendScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tag())
    }
}

/// `url` with its password replaced by `***`, for errors and logs: the one in the user info, and
/// a `password` option (libpq's form).
pub fn redact(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut parsed) => {
            let in_user_info = parsed.password().is_some();
            if in_user_info {
                let _ = parsed.set_password(Some("***"));
            }
            let in_query = parsed.query_pairs().any(|(key, _)| key == "password");
            if in_query {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(key, value)| {
                        let value = if key == "password" {
                            "***".into()
                        } else {
                            value
                        };
                        (key.into_owned(), value.into_owned())
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            if in_user_info || in_query {
                parsed.to_string()
            } else {
                url.to_owned()
            }
        }
        // Unparsable: drop anything that looks like user info rather than risk printing a secret.
        Err(_) => match (url.find("://"), url.rfind('@')) {
            (Some(start), Some(at)) if at > start => {
                format!(
                    "{}***@{}",
                    &url[..start.saturating_add(3)],
                    &url[at.saturating_add(1)..]
                )
            }
            _ => url.to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_schemes() {
        let parse = BackendScheme::parse;
        assert_eq!(parse("memory://").unwrap(), BackendScheme::Memory);
        assert_eq!(
            parse("redis://127.0.0.1:6379").unwrap(),
            BackendScheme::Redis
        );
        assert_eq!(
            parse("redlock://a:1,b:2,c:3").unwrap(),
            BackendScheme::Redlock
        );
        assert_eq!(parse("mariadb://root@h/db").unwrap(), BackendScheme::MySql);
        assert_eq!(parse("postgresql://h/db").unwrap(), BackendScheme::Postgres);
        assert_eq!(parse("zk://h:2181").unwrap(), BackendScheme::ZooKeeper);
        let err = parse("ftp://h").unwrap_err().to_string();
        assert!(
            err.contains("unknown scheme `ftp://`") && err.contains("redis"),
            "{err}"
        );
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("redis://:s3cret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("mysql://u:pw@h/db"), "mysql://u:***@h/db");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("postgres:///db?host=/run&password=pw&sslmode=require"),
            "postgres:///db?host=%2Frun&password=***&sslmode=require"
        );
        assert!(!redact("bad url://u:pw@h").contains("pw"));
    }
}
