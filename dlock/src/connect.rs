//! From a URL (and options) to a lock service.

use std::sync::Arc;

use dlock_api::{DistributedLock, LockError, MemoryLock, Result};
use url::Url;

use crate::scheme::{BackendScheme, redact};

/// Connects to the lock service `url` names and returns it as `Arc<dyn DistributedLock>`.
///
/// | URL | backend |
/// |---|---|
/// | `memory://` or `memory://STORE` | in-process; all `connect`s of one STORE in a process share locks |
/// | `redis://host:port`, `rediss://…`, `redis+sentinel://…`, `redis+cluster://…` | Redis (feature `redis`) |
/// | `redlock://host1:port,host2:port,…`, `redlocks://…` | Redlock over independent Redis nodes (feature `redlock`; `redlocks://` also `tls-rustls`) |
/// | `mysql://user:pass@host/db`, `mariadb://…` | MySQL / MariaDB `GET_LOCK` (feature `mysql`) |
/// | `postgres://user:pass@host/db` | Postgres advisory locks (feature `postgres`) |
/// | `etcd://host:port[,host:port][/prefix]`, `etcds://…` | etcd (feature `etcd`; `etcds://` also `etcd-tls`) |
/// | `zk://host:port[,host:port][/prefix]`, `zks://…` | ZooKeeper (feature `zookeeper`; `zks://` also `zookeeper-tls`) |
///
/// # Errors
/// [`LockError::Config`] for a malformed URL, an unknown scheme, or a backend not compiled into
/// this build (the message names the feature to enable); the backend's connect errors
/// ([`LockError::Unavailable`]) when its server cannot be reached, their cause preceded by a
/// [`Connecting`](crate::Connecting) naming the URL. Passwords never appear in errors.
///
/// # Examples
/// ```
/// # async fn demo() -> dlock::Result<()> {
/// use dlock::{DistributedLockExt, LockOptions};
/// let locks = dlock::connect("memory://").await?;
/// let guard = locks.acquire_str("coupon:1", &LockOptions::new()).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    connect_with(url, std::iter::empty::<(String, String)>()).await
}

/// [`connect`] with backend options as key/value pairs (the `[options]` table of a config
/// file), which override the URL's query parameters.
///
/// # Errors
/// As [`connect`]; an unknown or malformed option is a [`LockError::Config`].
pub async fn connect_with<I, K, V>(url: &str, options: I) -> Result<Arc<dyn DistributedLock>>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let options: Vec<(String, String)> = options
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
        .collect();
    connect_backend(url, &options)
        .await
        .map_err(|error| error.connecting_to(redact(url)))
}

async fn connect_backend(
    url: &str,
    options: &[(String, String)],
) -> Result<Arc<dyn DistributedLock>> {
    match BackendScheme::parse(url)? {
        BackendScheme::Memory => connect_memory(url, options),
        #[cfg(feature = "redis")]
        BackendScheme::Redis => {
            let mut config = dlock_redis::RedisConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(dlock_redis::RedisLock::connect(config).await?))
        }
        #[cfg(feature = "redlock")]
        BackendScheme::Redlock => {
            let mut config = dlock_redlock::RedlockConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(dlock_redlock::Redlock::connect(config).await?))
        }
        #[cfg(feature = "mysql")]
        BackendScheme::MySql => {
            let mut config = dlock_mysql::MySqlConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(dlock_mysql::MySqlLock::connect(config).await?))
        }
        #[cfg(feature = "postgres")]
        BackendScheme::Postgres => {
            let mut config = dlock_postgres::PostgresConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(
                dlock_postgres::PostgresLock::connect(config).await?,
            ))
        }
        #[cfg(feature = "etcd")]
        BackendScheme::Etcd => {
            let mut config = dlock_etcd::EtcdConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(dlock_etcd::EtcdLock::connect(config).await?))
        }
        #[cfg(feature = "zookeeper")]
        BackendScheme::ZooKeeper => {
            let mut config = dlock_zookeeper::ZkConfig::from_url(url)?;
            for (key, value) in options {
                config.set_option(key, value)?;
            }
            Ok(Arc::new(dlock_zookeeper::ZkLock::connect(config).await?))
        }
        // Reached only for a backend whose feature is off (never with every feature on).
        #[allow(unreachable_patterns)]
        other => not_available(other),
    }
}

fn connect_memory(url: &str, options: &[(String, String)]) -> Result<Arc<dyn DistributedLock>> {
    let url = Url::parse(url).map_err(|e| LockError::Config {
        backend: "memory",
        reason: format!("`{}` is not a URL: {e}", redact(url)),
    })?;
    let mut keys = options
        .iter()
        .map(|(k, _)| k.clone())
        .chain(url.query_pairs().map(|(k, _)| k.into_owned()));
    if let Some(key) = keys.next() {
        return Err(LockError::Config {
            backend: "memory",
            reason: format!("unknown option `{key}`: memory takes none"),
        });
    }
    let store = url
        .host_str()
        .filter(|h| !h.is_empty())
        .unwrap_or("default");
    Ok(Arc::new(MemoryLock::shared(store)))
}

fn not_available(scheme: BackendScheme) -> Result<Arc<dyn DistributedLock>> {
    let compiled: Vec<&str> = BackendScheme::ALL
        .iter()
        .filter(|(s, _, _)| compiled_in(*s))
        .map(|(s, _, _)| s.tag())
        .collect();
    Err(LockError::Config {
        backend: scheme.tag(),
        // The package, not the library: `dlock-rs` is what a Cargo.toml names.
        reason: format!(
            "backend `{scheme}` not compiled in: enable feature `{}` of the dlock-rs package \
             (compiled in: {})",
            scheme.feature(),
            compiled.join(", ")
        ),
    })
}

fn compiled_in(scheme: BackendScheme) -> bool {
    match scheme {
        BackendScheme::Memory => true,
        BackendScheme::Redis => cfg!(feature = "redis"),
        BackendScheme::Redlock => cfg!(feature = "redlock"),
        BackendScheme::MySql => cfg!(feature = "mysql"),
        BackendScheme::Postgres => cfg!(feature = "postgres"),
        BackendScheme::Etcd => cfg!(feature = "etcd"),
        BackendScheme::ZooKeeper => cfg!(feature = "zookeeper"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backend_not_compiled_in_names_its_feature_and_package() {
        for (scheme, spellings, _) in BackendScheme::ALL {
            // The message itself, for every backend: a build with every feature (as CI's) has
            // none left out, and would otherwise check nothing.
            let error = not_available(*scheme).err().map(|e| e.to_string());
            let error = error.expect("not_available is an error");
            assert!(
                error.contains(&format!("feature `{}`", scheme.feature()))
                    && error.contains("dlock-rs")
                    && error.contains("compiled in: memory"),
                "{scheme}: {error}"
            );
            // And the path to it, for the backends this build leaves out.
            if !compiled_in(*scheme) {
                let url = format!("{}://127.0.0.1:1", spellings[0]);
                let from_connect = connect(&url).await.err().map(|e| e.to_string());
                assert_eq!(from_connect, Some(error), "{url}");
            }
        }
    }
}
