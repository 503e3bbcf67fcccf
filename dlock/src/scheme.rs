//! Which backend a URL names.

use std::fmt;

use dlock_api::raw::Registration;
use dlock_api::{LockError, Result};
use url::Url;

use crate::backends::{KNOWN, Known};

/// A backend dlock knows, named by URL scheme: one of the list in `backends.rs`, compiled into
/// this build or not.
///
/// object_store's `ObjectStoreScheme`, without a variant per backend: the list is data, so
/// adding a backend adds no variant. Nothing is installed at start-up; a backend left out of
/// the build is still recognised, for an error that names the feature it needs.
#[derive(Clone, Copy)]
pub struct BackendScheme(&'static Known);

impl BackendScheme {
    /// Every backend this build knows, memory first.
    pub fn all() -> impl Iterator<Item = BackendScheme> {
        KNOWN.iter().map(BackendScheme)
    }

    /// The backend `url` names, from its scheme alone (compared without regard to case).
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
        Self::all()
            .find(|backend| {
                backend
                    .0
                    .schemes
                    .iter()
                    .any(|own| own.eq_ignore_ascii_case(scheme))
            })
            .ok_or_else(|| {
                let known: Vec<&str> = Self::all()
                    .flat_map(|b| b.schemes().iter().copied())
                    .collect();
                LockError::Config {
                    backend: "dlock",
                    reason: format!(
                        "unknown scheme `{}://`; dlock knows {}",
                        scheme.to_ascii_lowercase(),
                        known.join(", ")
                    ),
                }
            })
    }

    /// The backend's name in errors and logs: `memory`, `redis`, `redlock`, `mysql`,
    /// `postgres`, `etcd`, `zookeeper`.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The cargo feature of the dlock-rs package that compiles this backend in (`None` for
    /// memory, which is always in).
    pub fn feature(self) -> Option<&'static str> {
        self.0.feature
    }

    /// The URL schemes it serves.
    pub fn schemes(self) -> &'static [&'static str] {
        self.0.schemes
    }

    /// Whether this build has it.
    pub fn is_compiled_in(self) -> bool {
        self.0.registration.is_some()
    }

    /// How to connect to it, when compiled in.
    pub(crate) fn registration(self) -> Option<Registration> {
        self.0.registration
    }
}

impl PartialEq for BackendScheme {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for BackendScheme {}

impl fmt::Debug for BackendScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BackendScheme").field(&self.0.name).finish()
    }
}

impl fmt::Display for BackendScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
        let parsed = |url: &str| BackendScheme::parse(url).unwrap().name();
        assert_eq!(parsed("memory://"), "memory");
        assert_eq!(parsed("redis://127.0.0.1:6379"), "redis");
        assert_eq!(parsed("REDIS+Sentinel://h:26379/m"), "redis");
        assert_eq!(parsed("redlock://a:1,b:2,c:3"), "redlock");
        assert_eq!(parsed("mariadb://root@h/db"), "mysql");
        assert_eq!(parsed("postgresql://h/db"), "postgres");
        assert_eq!(parsed("zk://h:2181"), "zookeeper");
        let err = BackendScheme::parse("ftp://h").unwrap_err().to_string();
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
