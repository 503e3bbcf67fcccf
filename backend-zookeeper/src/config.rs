//! `ZkConfig`: where the ensemble is and how to talk to it, from a URL or key/value pairs.

use std::fmt;
use std::time::Duration;

use dlock_api::raw::config::{
    Secret, TlsFiles, UrlParts, duration_option, tls_not_built, unknown_option,
};
use dlock_api::{LockError, LockName, Result};

use crate::BACKEND;
use crate::names::{check_segment, name_segment};

/// The client port ZooKeeper listens on by default.
pub const DEFAULT_PORT: u16 = 2181;

/// Who may touch the nodes this client creates (the ACL they are created with).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeAcl {
    /// Anyone may read, change and delete them (ZooKeeper's `OPEN_ACL_UNSAFE`). The default
    /// without credentials.
    Open,
    /// Only clients authenticated as the creator (`CREATOR_ALL_ACL`). The default with
    /// credentials; needs them.
    Creator,
}

/// Configuration of a [`ZkLock`](crate::ZkLock).
///
/// Built from a URL ([`ZkConfig::from_url`]) and adjusted with [`set_option`](Self::set_option)
/// (the `[options]` table of a dlock config file uses the same keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `/dlock` (or the URL's path) | the node under which every name gets its own node; created on demand |
/// | `session_timeout` | `10s` | the session timeout asked of the server (it may grant another, within its `minSessionTimeout`..`maxSessionTimeout`) |
/// | `connect_timeout` | `5s` | opening a session |
/// | `command_timeout` | `2s` | each request's reply (the client library has none of its own) |
/// | `acl` | `open`, or `creator` with credentials | the ACL of created nodes: `open` or `creator` |
/// | `ca_cert` | (required with `zks://`) | a PEM file of the CA to trust (the client library loads no system roots) |
/// | `cert`, `key` | (none) | with `zks://`: a PEM client certificate and its key |
///
/// `zk://user:password@…` authenticates with the `digest` scheme (sent in clear; use `zks://`
/// where the network is not trusted). `Debug` and `Display` never show the password.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZkConfig {
    /// The servers' `host:port`s.
    pub hosts: Vec<String>,
    /// `zks://`: TLS to the servers.
    pub tls: bool,
    /// User name for `digest` authentication.
    pub username: Option<String>,
    /// Password (never printed).
    pub password: Option<Secret>,
    /// The prefix node, an absolute path without a trailing `/` (e.g. `/dlock`).
    pub prefix: String,
    /// The session timeout asked for.
    pub session_timeout: Duration,
    /// Bound on opening a session.
    pub connect_timeout: Duration,
    /// Bound on each request's reply.
    pub command_timeout: Duration,
    /// The ACL of created nodes.
    pub acl: NodeAcl,
    /// With TLS: the CA to trust (required), and a client certificate.
    pub tls_files: TlsFiles,
}

impl Default for ZkConfig {
    fn default() -> Self {
        Self {
            hosts: vec![format!("127.0.0.1:{DEFAULT_PORT}")],
            tls: false,
            username: None,
            password: None,
            prefix: "/dlock".into(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            command_timeout: Duration::from_secs(2),
            acl: NodeAcl::Open,
            tls_files: TlsFiles::default(),
        }
    }
}

fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

/// A prefix as an absolute path: segments ZooKeeper accepts, not `/zookeeper` (the server's
/// own subtree), no trailing `/`.
fn check_prefix(prefix: &str) -> Result<String> {
    let segments: Vec<&str> = prefix.split('/').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() {
        return Err(config_error("the prefix node must not be the root"));
    }
    for segment in &segments {
        check_segment(segment)
            .map_err(|reason| config_error(format!("the prefix segment `{segment}` {reason}")))?;
    }
    if segments[0] == "zookeeper" {
        return Err(config_error(
            "the prefix must not be under /zookeeper, the server's own subtree",
        ));
    }
    Ok(format!("/{}", segments.join("/")))
}

impl ZkConfig {
    /// Parses `zk://[user:password@]host[:port][,host[:port]…][/prefix…][?option=value…]`
    /// and `zks://…` (TLS, feature `tls`). The port defaults to 2181; the path, if any, is the
    /// prefix node (`zk://h/apps/locks` keeps locks under `/apps/locks`), created on demand.
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong; no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse(BACKEND, url, crate::SCHEMES)?;
        let tls = parts.scheme == "zks";
        if tls && !cfg!(feature = "tls") {
            return Err(tls_not_built(
                BACKEND,
                "zks",
                "`tls` (of dlock-zookeeper, or `zookeeper-tls` of dlock)",
            ));
        }
        if parts.user.is_some() != parts.password.is_some() {
            return Err(config_error(
                "a user name and a password go together (digest authentication)",
            ));
        }
        if parts.user.as_deref().is_some_and(|u| u.contains(':')) {
            return Err(config_error("the user name must not contain `:`"));
        }
        let mut config = Self {
            tls,
            username: parts.user.clone(),
            password: parts.password.clone(),
            hosts: parts.host_ports(DEFAULT_PORT),
            ..Self::default()
        };
        if config.username.is_some() {
            config.acl = NodeAcl::Creator;
        }
        if !parts.path.is_empty() {
            config.prefix = check_prefix(&parts.path.join("/"))?;
        }
        parts.apply_options(|key, value| config.set_option(key, value))?;
        config.check()?;
        Ok(config)
    }

    /// Checks options that depend on each other.
    fn check(&self) -> Result<()> {
        if self.tls && self.tls_files.ca_cert.is_none() {
            return Err(config_error(
                "zks:// needs option `ca_cert`, the CA to trust (the client library loads no system roots)",
            ));
        }
        self.tls_files.check(BACKEND, self.tls, "zks")?;
        if self.acl == NodeAcl::Creator && self.username.is_none() {
            return Err(config_error(
                "acl=creator needs credentials (zk://user:password@…)",
            ));
        }
        Ok(())
    }

    /// Sets one option by name (see the table on [`ZkConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        if self.tls_files.set_option(key, value) {
            return Ok(());
        }
        match key {
            "prefix" => self.prefix = check_prefix(value)?,
            "session_timeout" => {
                self.session_timeout = duration_option(BACKEND, key, value)?;
                if self.session_timeout > Duration::from_secs(24 * 3600) {
                    return Err(config_error("option `session_timeout` is over a day"));
                }
            }
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            "acl" => {
                self.acl = match value {
                    "open" => NodeAcl::Open,
                    "creator" => NodeAcl::Creator,
                    other => {
                        return Err(config_error(format!(
                            "option `acl` takes `open` or `creator`, not `{other}`"
                        )));
                    }
                }
            }
            other => {
                return Err(unknown_option(
                    BACKEND,
                    other,
                    &format!(
                        "prefix, session_timeout, connect_timeout, command_timeout, acl, {}",
                        TlsFiles::OPTIONS
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The connect string the client library takes: `h1:p1,h2:p2`.
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The node of one lock name: `PREFIX/ENCODED-NAME`. Every acquire of the name creates one
    /// ephemeral sequential child under it. Names that ZooKeeper could not take as one path
    /// segment as they are (a `/`, `.` or `..`, a character ZooKeeper forbids, a `~`) are
    /// mapped to a readable part and a digest, so no two names share a node and none reaches
    /// outside the prefix.
    pub fn name_path(&self, name: &LockName) -> String {
        format!("{}/{}", self.prefix, name_segment(name))
    }
}

impl fmt::Display for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.hosts.join(","), self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = ZkConfig::from_url(
            "zk://u:p%40ss@a:1,b,[::1]:3/apps/locks?session_timeout=4s&command_timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.hosts, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(c.prefix, "/apps/locks");
        assert_eq!(c.username.as_deref(), Some("u"));
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(c.acl, NodeAcl::Creator);
        assert_eq!(c.session_timeout, Duration::from_secs(4));
        assert_eq!(c.command_timeout, Duration::from_millis(500));
        assert_eq!(c.connect_string(), "a:1,b:2181,[::1]:3");
        let d = ZkConfig::from_url("zk://h?prefix=/x/y/").unwrap();
        assert_eq!(d.prefix, "/x/y");
        assert_eq!(d.acl, NodeAcl::Open);
        assert_eq!(ZkConfig::from_url("ZK://h").unwrap().prefix, "/dlock");
        let name = LockName::new("orders/42").unwrap();
        assert!(d.name_path(&name).starts_with("/x/y/orders"));
        assert!(!d.name_path(&name)["/x/y/".len()..].contains('/'));
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        for bad in [
            "zk://",
            "zk://a,,b",
            "zk://h:port",
            "zk://h?nope=1",
            "zk://h?session_timeout=soon",
            "zk://h?command_timeout=0s",
            "zk://h?prefix=/",
            "zk://h/zookeeper",
            "zk://h/zookeeper/x",
            "zk://h/a/../b",
            "zk://h/a/./b",
            "zk://h?ca_cert=/ca.pem",
            "zk://h?acl=creator",
            "zk://h?acl=everyone",
            "zk://user@h",
            "zk://:pw@h",
            "http://h",
        ] {
            assert!(
                matches!(ZkConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_needs_the_feature() {
        let result = ZkConfig::from_url("zks://h:2281?ca_cert=/ca.pem&cert=/c.pem&key=/k.pem");
        if cfg!(feature = "tls") {
            assert!(result.unwrap().tls);
        } else {
            assert!(matches!(result, Err(LockError::Config { .. })));
        }
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let c = ZkConfig::from_url("zk://user:hunter2@h:1").unwrap();
        assert!(!format!("{c:?} {c}").contains("hunter2"));
    }
}
