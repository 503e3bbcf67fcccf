//! From a URL (and options) to a lock service.

use std::sync::Arc;

use dlock_api::raw::{Connecting, Registration};
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
    let backend = BackendScheme::parse(url)?;
    match backend.registration() {
        Some(registration) => registration.connect(url, options).await,
        None => Err(not_compiled_in(backend)),
    }
}

/// The in-process backend, always compiled in.
pub(crate) const MEMORY: Registration = Registration::new("memory", &["memory"], connect_memory);

fn connect_memory<'a>(url: &'a str, options: &'a [(String, String)]) -> Connecting<'a> {
    Box::pin(std::future::ready(memory_store(url, options).map(
        |store| -> Arc<dyn DistributedLock> { Arc::new(MemoryLock::shared(&store)) },
    )))
}

/// The store a `memory://[STORE]` URL names; memory takes no options.
fn memory_store(url: &str, options: &[(String, String)]) -> Result<String> {
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
    Ok(url
        .host_str()
        .filter(|h| !h.is_empty())
        .unwrap_or("default")
        .to_owned())
}

fn not_compiled_in(backend: BackendScheme) -> LockError {
    let compiled: Vec<&str> = BackendScheme::all()
        .filter(|b| b.is_compiled_in())
        .map(BackendScheme::name)
        .collect();
    LockError::Config {
        backend: backend.name(),
        // The package, not the library: `dlock-rs` is what a Cargo.toml names.
        reason: format!(
            "backend `{backend}` not compiled in: enable feature `{}` of the dlock-rs package \
             (compiled in: {})",
            backend.feature().unwrap_or("?"),
            compiled.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_backend_not_compiled_in_names_its_feature_and_package() {
        for backend in BackendScheme::all().filter(|b| b.feature().is_some()) {
            // The message itself, for every backend: a build with every feature (as CI's) has
            // none left out, and would otherwise check nothing.
            let error = not_compiled_in(backend).to_string();
            assert!(
                error.contains(&format!("feature `{}`", backend.feature().unwrap()))
                    && error.contains("dlock-rs")
                    && error.contains("compiled in: memory"),
                "{backend}: {error}"
            );
            // And the path to it, for the backends this build leaves out.
            if !backend.is_compiled_in() {
                let url = format!("{}://127.0.0.1:1", backend.schemes()[0]);
                let from_connect = connect(&url).await.err().map(|e| e.to_string());
                assert_eq!(from_connect, Some(error), "{url}");
            }
        }
    }
}
