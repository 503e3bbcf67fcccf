//! `EtcdConfig`: where the cluster is and how to talk to it, from a URL or key/value pairs.

use std::fmt;
use std::time::Duration;

use dlock_api::raw::config::{
    Secret, TlsFiles, UrlParts, duration_option, tls_not_built, unknown_option,
};
use dlock_api::{LockError, Result};

use crate::BACKEND;

/// The client port etcd listens on by default.
pub const DEFAULT_PORT: u16 = 2379;

/// Configuration of an [`EtcdLock`](crate::EtcdLock).
///
/// Built from a URL ([`EtcdConfig::from_url`]) and adjusted with [`set_option`](Self::set_option)
/// (the `[options]` table of a dlock config file uses the same keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `dlock` (or the URL's path) | key prefix: keys are `PREFIX/NAME/LEASE-SLOT` |
/// | `connect_timeout` | `2s` | connecting to a member, and the probe that proves the cluster answers |
/// | `command_timeout` | `2s` | each request's reply, and each keep-alive answer |
/// | `ca_cert` | (system roots) | with `etcds://`: a PEM file of the CA to trust |
/// | `cert`, `key` | (none) | with `etcds://`: a PEM client certificate and its key |
///
/// `Debug` and `Display` never show the password. `etcd://user:pass@…` sends the password in
/// clear; use `etcds://` where the network is not trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The members' `host:port`s.
    pub endpoints: Vec<String>,
    /// `etcds://`: TLS to the members.
    pub tls: bool,
    /// User name for etcd's authentication.
    pub username: Option<String>,
    /// Password (never printed).
    pub password: Option<Secret>,
    /// Key prefix (no leading or trailing `/`).
    pub prefix: String,
    /// Connect timeout, and the bound on the first probe.
    pub connect_timeout: Duration,
    /// Per-request timeout, and the bound on each keep-alive answer.
    pub command_timeout: Duration,
    /// With TLS: the CA to trust instead of the system's roots, and a client certificate.
    pub tls_files: TlsFiles,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            tls: false,
            username: None,
            password: None,
            prefix: "dlock".into(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            tls_files: TlsFiles::default(),
        }
    }
}

fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

fn check_prefix(prefix: &str) -> Result<String> {
    let trimmed = prefix.trim_matches('/');
    if trimmed.is_empty() {
        return Err(config_error("the key prefix must not be empty"));
    }
    if trimmed.contains('\0') {
        return Err(config_error("the key prefix must not contain NUL"));
    }
    Ok(trimmed.to_owned())
}

impl EtcdConfig {
    /// Parses `etcd://[user:password@]host[:port][,host[:port]…][/prefix…][?option=value…]`
    /// and `etcds://…` (TLS, feature `tls`). The port defaults to 2379; the path, if any, is the
    /// key prefix (`etcd://h/apps/locks` keeps keys under `apps/locks/`).
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong; no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse(BACKEND, url, crate::SCHEMES)?;
        let tls = parts.scheme == "etcds";
        if tls && !cfg!(feature = "tls") {
            return Err(tls_not_built(
                BACKEND,
                "etcds",
                "`tls` (of dlock-etcd, or `etcd-tls` of dlock)",
            ));
        }
        if parts.user.is_none() && parts.password.is_some() {
            return Err(config_error("a password needs a user name"));
        }
        let mut config = Self {
            tls,
            username: parts.user.clone(),
            password: parts.password.clone(),
            endpoints: parts.host_ports(DEFAULT_PORT),
            ..Self::default()
        };
        if config.username.is_some() && config.password.is_none() {
            return Err(config_error("a user name needs a password"));
        }
        if !parts.path.is_empty() {
            config.prefix = check_prefix(&parts.path.join("/"))?;
        }
        parts.apply_options(|key, value| config.set_option(key, value))?;
        config.tls_files.check(BACKEND, tls, "etcds")?;
        Ok(config)
    }

    /// Sets one option by name (see the table on [`EtcdConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        if self.tls_files.set_option(key, value) {
            return Ok(());
        }
        match key {
            "prefix" => self.prefix = check_prefix(value)?,
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            other => {
                return Err(unknown_option(
                    BACKEND,
                    other,
                    &format!(
                        "prefix, connect_timeout, command_timeout, {}",
                        TlsFiles::OPTIONS
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The endpoints as the client crate takes them (`http://host:port` or `https://…`).
    pub fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.endpoints.join(","), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = EtcdConfig::from_url(
            "etcd://u:p%40ss@a:1,b,[::1]:3/apps/locks?command_timeout=500ms&connect_timeout=1s",
        )
        .unwrap();
        assert_eq!(c.endpoints, ["a:1", "b:2379", "[::1]:3"]);
        assert_eq!(c.prefix, "apps/locks");
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(c.command_timeout, Duration::from_millis(500));
        assert_eq!(c.connect_timeout, Duration::from_secs(1));
        assert_eq!(
            c.endpoint_urls(),
            ["http://a:1", "http://b:2379", "http://[::1]:3"]
        );
        let d = EtcdConfig::from_url("etcd://h?prefix=/x/").unwrap();
        assert_eq!(d.prefix, "x");
        assert_eq!(EtcdConfig::from_url("ETCD://h").unwrap().prefix, "dlock");
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        for bad in [
            "etcd://",
            "etcd://a,,b",
            "etcd://h:port",
            "etcd://h?nope=1",
            "etcd://h?command_timeout=soon",
            "etcd://h?command_timeout=0s",
            "etcd://h?prefix=/",
            "etcd://h?ca_cert=/ca.pem",
            "etcd://user@h",
            "etcd://:pw@h",
            "http://h",
        ] {
            assert!(
                matches!(EtcdConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_needs_the_feature() {
        let result = EtcdConfig::from_url("etcds://h:2379?ca_cert=/ca.pem&cert=/c.pem&key=/k.pem");
        if cfg!(feature = "tls") {
            let c = result.unwrap();
            assert!(c.tls);
            assert_eq!(c.endpoint_urls(), ["https://h:2379"]);
        } else {
            assert!(matches!(result, Err(LockError::Config { .. })));
        }
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let c = EtcdConfig::from_url("etcd://user:hunter2@h:1").unwrap();
        assert!(!format!("{c:?} {c}").contains("hunter2"));
    }
}
