//! Choosing a backend and lock defaults from a TOML config file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockOptions, Renewal, Result};
use serde::Deserialize;

/// A dlock configuration: which backend, its options, and default lock options.
///
/// ```toml
/// url = "redis://127.0.0.1:6379"   # or "memory://", "postgres://…", …
///
/// [options]                        # backend options (same keys as URL query parameters)
///
/// [lock]                           # defaults for LockOptions
/// ttl = "30s"
/// wait_timeout = "10s"
/// renewal = true
/// max_hold = "5m"
/// ```
///
/// # Examples
/// ```
/// # async fn demo() -> dlock::Result<()> {
/// let config = dlock::Config::from_toml("url = 'memory://'\n[lock]\nttl = '10s'")?;
/// let locks = config.connect().await?;
/// let opts = config.lock_options();
/// assert_eq!(opts.ttl(), std::time::Duration::from_secs(10));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Config {
    /// The backend URL (see [`connect`](crate::connect)).
    pub url: String,
    /// Backend options, overriding the URL's query parameters. In the file, a value may be
    /// written as TOML's number or boolean too (`wait_replicas = 1`, `fencing = false`): it is
    /// kept as the text a URL would carry.
    #[serde(default, deserialize_with = "option_values::deserialize")]
    pub options: BTreeMap<String, String>,
    /// Default lock options.
    #[serde(default)]
    pub lock: LockDefaults,
}

/// The `[lock]` table: defaults for [`LockOptions`]. Durations are written like `"30s"`,
/// `"500ms"`, `"5m"`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LockDefaults {
    /// Lease length.
    #[serde(default, with = "opt_duration")]
    pub ttl: Option<Duration>,
    /// How long `acquire` waits.
    #[serde(default, with = "opt_duration")]
    pub wait_timeout: Option<Duration>,
    /// Whether the watchdog renews the lease (default true).
    pub renewal: Option<bool>,
    /// Longest hold time.
    #[serde(default, with = "opt_duration")]
    pub max_hold: Option<Duration>,
}

mod option_values {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer};

    /// A scalar as a URL's query parameter would carry it.
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a string, a number or a boolean")]
    enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
        Boolean(bool),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, String>, D::Error> {
        let values = BTreeMap::<String, Scalar>::deserialize(d)?;
        Ok(values
            .into_iter()
            .map(|(key, value)| {
                let text = match value {
                    Scalar::Text(text) => text,
                    Scalar::Integer(n) => n.to_string(),
                    Scalar::Float(x) => x.to_string(),
                    Scalar::Boolean(b) => b.to_string(),
                };
                (key, text)
            })
            .collect())
    }
}

mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| humantime::parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl Config {
    /// Parses a config from TOML text.
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong and where.
    pub fn from_toml(text: &str) -> Result<Self> {
        let config: Self = toml::from_str(text).map_err(|e| LockError::Config {
            backend: "dlock",
            reason: format!("config: {e}"),
        })?;
        config.lock_options().validate()?;
        Ok(config)
    }

    /// Reads and parses a config file.
    ///
    /// # Errors
    /// [`LockError::Config`] if it cannot be read or parsed.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LockError::Config {
            backend: "dlock",
            reason: format!("cannot read config file {}: {e}", path.display()),
        })?;
        Self::from_toml(&text)
    }

    /// Connects to the configured backend.
    ///
    /// # Errors
    /// As [`connect_with`](crate::connect_with).
    pub async fn connect(&self) -> Result<Arc<dyn DistributedLock>> {
        crate::connect_with(&self.url, &self.options).await
    }

    /// [`LockOptions`] with the `[lock]` defaults applied.
    pub fn lock_options(&self) -> LockOptions {
        let mut opts = LockOptions::new();
        if let Some(ttl) = self.lock.ttl {
            opts = opts.with_ttl(ttl);
        }
        if let Some(wait) = self.lock.wait_timeout {
            opts = opts.with_wait_timeout(wait);
        }
        if self.lock.renewal == Some(false) {
            opts = opts.with_renewal(Renewal::Off);
        }
        if let Some(max_hold) = self.lock.max_hold {
            opts = opts.with_max_hold(max_hold);
        }
        opts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_config() {
        let c = Config::from_toml(
            "url = 'memory://x'\n[options]\na = 'b'\n[lock]\nttl = '5s'\nwait_timeout = '250ms'\nrenewal = false\nmax_hold = '1m'",
        )
        .unwrap();
        let o = c.lock_options();
        assert_eq!(o.ttl(), Duration::from_secs(5));
        assert_eq!(o.wait_timeout(), Some(Duration::from_millis(250)));
        assert_eq!(o.renewal(), Renewal::Off);
        assert_eq!(o.max_hold(), Some(Duration::from_secs(60)));
    }

    #[test]
    fn option_values_may_be_numbers_and_booleans() {
        let c = Config::from_toml(
            "url = 'memory://'\n[options]\nwait_replicas = 1\nfencing = false\nratio = 0.5\nprefix = 'app'",
        )
        .unwrap();
        let options: Vec<(&str, &str)> = c
            .options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            options,
            [
                ("fencing", "false"),
                ("prefix", "app"),
                ("ratio", "0.5"),
                ("wait_replicas", "1")
            ]
        );
        let nested = Config::from_toml("url = 'memory://'\n[options]\nhosts = ['a', 'b']");
        let Err(LockError::Config { reason, .. }) = nested else {
            panic!("an array is no option value: {nested:?}");
        };
        assert!(
            reason.contains("a string, a number or a boolean"),
            "{reason}"
        );
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(matches!(
            Config::from_toml("url = 'memory://'\nttl = '5s'"),
            Err(LockError::Config { .. })
        ));
        assert!(matches!(
            Config::from_toml("url = 'memory://'\n[lock]\nttl = 'soon'"),
            Err(LockError::Config { .. })
        ));
        assert!(matches!(
            Config::from_toml("url = 'memory://'\n[lock]\nttl = '0s'"),
            Err(LockError::InvalidArgument { .. })
        ));
    }
}
