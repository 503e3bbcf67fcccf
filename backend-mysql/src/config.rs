//! `MySqlConfig`: where the server is and how to talk to it, from a URL or key/value pairs.

use std::fmt;
use std::time::Duration;

use dlock_api::raw::config::{
    Secret, TlsFiles, UrlParts, bool_option, duration_option, join_host_port, unknown_option,
};
use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::tls::{SslMode, set_certificate_option};

/// Configuration of a [`MySqlLock`](crate::MySqlLock).
///
/// Built from a URL ([`MySqlConfig::from_url`]) and adjusted with [`set_option`](Self::set_option)
/// (the `[options]` table of a dlock config file uses the same keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `connect_timeout` | `2s` | TCP connect and handshake |
/// | `command_timeout` | `2s` | each command's reply (a blocking `GET_LOCK` gets its wait on top); no call waits longer on a dead server |
/// | `max_connections` | `10` | connections one client opens at most on each tokio runtime that uses it (sessions holding locks, blocked waiters, idle ones); at least 2 |
/// | `keepalive` | `1s` | how often a session connection is pinged: the bound on noticing a killed or broken session |
/// | `session_timeout` | `30s` | `SET SESSION wait_timeout`: the server drops a connection silent for this long, freeing its locks (the bound for a half-open connection of a vanished client); must exceed `keepalive` |
/// | `table` | `dlock_fence` | the fencing counter table on MySQL; on MariaDB the fencing sequence is this name with `_seq` (`name` or `database.name`); the elections' leaders table is this name with `_leaders` |
/// | `fencing` | `true` | fencing tokens (a sequence on MariaDB, a counter table on MySQL); `table`: the counter table on MariaDB too (a token per name, which `inspect` reports, at a row write per acquire); `false`: plain `GET_LOCK`, every token 0, no table |
/// | `create_table` | `true` | create the table (or sequence), and the leaders table, on first use; `false`: call [`MySqlLock::migrate`](crate::MySqlLock::migrate) or create them yourself |
/// | `prefix` | *(empty)* | prepended to every `GET_LOCK` key, to keep dlock's names apart from other users of named locks on the server |
/// | `socket` | none | path of the server's Unix socket: connect through it instead of TCP (host and port are then only for display) |
/// | `ssl_mode` | `DISABLED` | MySQL's modes ([`SslMode`](crate::SslMode)), in any case: `DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_CA`, `VERIFY_IDENTITY`; the last three need the `tls-rustls` feature |
/// | `ssl_ca` | (webpki roots) | PEM file of the CA to trust (a private CA); needs `tls-rustls` |
/// | `ssl_cert`, `ssl_key` | none | PEM files of a client certificate and its key, both or neither; need `tls-rustls` |
///
/// The TLS options also take MySQL's spelling: `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`.
///
/// `Debug` and `Display` never show the password.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MySqlConfig {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// User name.
    pub username: String,
    /// Password (never printed).
    pub password: Option<Secret>,
    /// Database: where the fencing table lives unless `table` names one.
    pub database: Option<String>,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Per-command timeout.
    pub command_timeout: Duration,
    /// Connections one client opens at most, on each tokio runtime that uses it.
    pub max_connections: usize,
    /// Ping interval of session connections.
    pub keepalive: Duration,
    /// The server-side idle limit of each connection (`wait_timeout`).
    pub session_timeout: Duration,
    /// The fencing counter table.
    pub table: String,
    /// Issue fencing tokens (a counter row per key).
    pub fencing: bool,
    /// Take tokens from the counter table even where the server has sequences (`fencing=table`).
    pub fence_table: bool,
    /// Create the fencing table on first use.
    pub create_table: bool,
    /// Prefix of every `GET_LOCK` key.
    pub prefix: String,
    /// The server's Unix socket, to connect through instead of TCP.
    pub socket: Option<std::path::PathBuf>,
    /// How connections use TLS.
    pub ssl_mode: SslMode,
    /// The certificate files: `ssl_ca` is `ca_cert`, `ssl_cert` and `ssl_key` are
    /// `client_cert` and `client_key`.
    pub tls_files: TlsFiles,
}

impl Default for MySqlConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 3306,
            username: "root".into(),
            password: None,
            database: None,
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            max_connections: 10,
            keepalive: Duration::from_secs(1),
            session_timeout: Duration::from_secs(30),
            table: "dlock_fence".into(),
            fencing: true,
            fence_table: false,
            create_table: true,
            prefix: String::new(),
            socket: None,
            ssl_mode: SslMode::Disabled,
            tls_files: TlsFiles::default(),
        }
    }
}

pub(crate) fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

fn identifier(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 64
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

/// The longest prefix accepted: the rest of the 64 characters must hold a digest key.
const MAX_PREFIX: usize = 24;

const KNOWN: &str = "connect_timeout, command_timeout, max_connections, keepalive, session_timeout, table, fencing, create_table, prefix, socket, ssl_mode, ssl_ca, ssl_cert, ssl_key";

impl MySqlConfig {
    /// Parses `mysql://[user[:password]@]host[:port][/database][?option=value…]`; `mariadb://` is
    /// the same. The user defaults to `root`, the port to 3306. With `socket=PATH` the host may
    /// be left out (`mysql://app@/shop?socket=/run/mysqld/mysqld.sock`); it then shows as
    /// `localhost`.
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong; no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse_host_optional(BACKEND, url, crate::SCHEMES)?;
        let mut config = Self::default();
        if let Some(user) = parts.user.clone() {
            config.username = user;
        }
        config.password = parts.password.clone();
        if parts.hosts.is_empty() {
            config.host = "localhost".into();
        } else {
            (config.host, config.port) = parts.one_host(BACKEND, config.port)?;
        }
        parts.at_most_segments(BACKEND, 1)?;
        config.database = parts.path.first().cloned();
        parts.apply_options(|key, value| config.set_option(key, value))?;
        if parts.hosts.is_empty() && config.socket.is_none() {
            return Err(config_error(
                "the URL names no host: give one, or the server's Unix socket with `?socket=PATH`",
            ));
        }
        config.check()?;
        Ok(config)
    }

    /// Sets one option by name (see the table on [`MySqlConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            "keepalive" => self.keepalive = duration_option(BACKEND, key, value)?,
            "session_timeout" => {
                let d = duration_option(BACKEND, key, value)?;
                if d < Duration::from_secs(1) {
                    return Err(config_error(
                        "option `session_timeout` is whole seconds: at least 1s",
                    ));
                }
                self.session_timeout = d;
            }
            "max_connections" => {
                let n: usize = value.parse().map_err(|_| {
                    config_error("option `max_connections` takes a number (at least 2)")
                })?;
                if n < 2 {
                    return Err(config_error(
                        "option `max_connections` must be at least 2: one connection holds locks while another waits",
                    ));
                }
                self.max_connections = n;
            }
            "table" => {
                let parts: Vec<&str> = value.split('.').collect();
                if parts.len() > 2 || !parts.iter().all(|p| identifier(p)) {
                    return Err(config_error(format!(
                        "option `table`: `{value}` is not `name` or `database.name` of letters, digits, `_` and `$`"
                    )));
                }
                self.table = value.to_owned();
            }
            "create_table" => self.create_table = bool_option(BACKEND, key, value)?,
            "fencing" if value.eq_ignore_ascii_case("table") => {
                self.fencing = true;
                self.fence_table = true;
            }
            "fencing" => {
                self.fencing = bool_option(BACKEND, key, value).map_err(|_| {
                    config_error(format!(
                        "option `fencing` takes true, false or table, not `{value}`"
                    ))
                })?;
                self.fence_table = false;
            }
            "prefix" => {
                if value.len() > MAX_PREFIX
                    || !value.chars().all(|c| c.is_ascii_graphic() && c != '~')
                {
                    return Err(config_error(format!(
                        "option `prefix` takes at most {MAX_PREFIX} printable ASCII characters without spaces or `~`"
                    )));
                }
                self.prefix = value.to_owned();
            }
            "socket" => self.socket = Some(value.into()),
            "ssl_mode" | "ssl-mode" => self.ssl_mode = SslMode::parse(value)?,
            other => {
                if !set_certificate_option(&mut self.tls_files, other, value)? {
                    return Err(unknown_option(BACKEND, other, KNOWN));
                }
            }
        }
        Ok(())
    }

    /// Checks the options against each other.
    pub(crate) fn check(&self) -> Result<()> {
        // The fields are public, so a config built in code gets the same checks as a URL's.
        let keepalive_round = self.keepalive.saturating_add(self.command_timeout);
        if self.session_timeout <= keepalive_round {
            return Err(config_error(format!(
                "option `session_timeout` ({:?}) must exceed `keepalive` + `command_timeout` ({:?}), or the server drops live sessions",
                self.session_timeout, keepalive_round
            )));
        }
        if self.max_connections < 2 {
            return Err(config_error(
                "option `max_connections` must be at least 2: one connection holds locks while another waits",
            ));
        }
        if self.prefix.len() > MAX_PREFIX
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_graphic() && c != '~')
        {
            return Err(config_error(format!(
                "option `prefix` takes at most {MAX_PREFIX} printable ASCII characters without spaces or `~`"
            )));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
            ("keepalive", self.keepalive),
            ("session_timeout", self.session_timeout),
        ] {
            if value.is_zero() || value > dlock_api::raw::config::MAX_OPTION_DURATION {
                return Err(config_error(format!(
                    "option `{key}` must be above zero and at most a year, not {value:?}"
                )));
            }
        }
        if self.fencing && !self.table.contains('.') && self.database.is_none() {
            return Err(config_error(
                "the fencing table needs a database: put it in the URL (mysql://host/DATABASE) or set `table=database.name`",
            ));
        }
        Ok(())
    }

    /// The fencing table (MySQL), quoted for SQL: `` `name` `` or `` `database`.`name` ``.
    pub fn quoted_table(&self) -> String {
        quote_path(&self.table)
    }

    /// The elections' leaders table: the table's name with `_leaders`, quoted for SQL.
    pub(crate) fn quoted_leaders(&self) -> String {
        quote_path(&format!("{}_leaders", self.table))
    }

    /// The fencing sequence (MariaDB): the table's name with `_seq`, quoted for SQL.
    pub fn quoted_sequence(&self) -> String {
        quote_path(&format!("{}_seq", self.table))
    }
}

/// `name` or `database.name`, quoted for SQL (the parts were checked to need no escaping).
fn quote_path(path: &str) -> String {
    path.split('.')
        .map(|part| format!("`{part}`"))
        .collect::<Vec<_>>()
        .join(".")
}

impl fmt::Display for MySqlConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.socket {
            Some(socket) => write!(f, "{}", socket.display())?,
            None => f.write_str(&join_host_port(&self.host, self.port))?,
        }
        if let Some(db) = &self.database {
            write!(f, "/{db}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = MySqlConfig::from_url(
            "mysql://app:p%40ss@db.example:3307/shop?command_timeout=500ms&max_connections=4&table=locks.fence",
        )
        .unwrap();
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 3307);
        assert_eq!(c.username, "app");
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("p@ss"));
        assert_eq!(c.database.as_deref(), Some("shop"));
        assert_eq!(c.command_timeout, Duration::from_millis(500));
        assert_eq!(c.max_connections, 4);
        assert_eq!(c.quoted_table(), "`locks`.`fence`");
        let m = MySqlConfig::from_url("mariadb://root@127.0.0.1/test").unwrap();
        assert_eq!((m.host.as_str(), m.port), ("127.0.0.1", 3306));
        assert_eq!(m.username, "root");
        assert_eq!(m.password, None);
        let v6 = MySqlConfig::from_url("mysql://[::1]:3310/test").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("::1", 3310));
        assert_eq!(v6.to_string(), "[::1]:3310/test");
    }

    #[test]
    fn takes_a_socket_without_a_host() {
        let c = MySqlConfig::from_url("mysql://app@/shop?socket=/run/mysqld/mysqld.sock").unwrap();
        assert_eq!((c.host.as_str(), c.port), ("localhost", 3306));
        assert_eq!(c.database.as_deref(), Some("shop"));
        assert_eq!(
            c.socket.as_deref(),
            Some(std::path::Path::new("/run/mysqld/mysqld.sock"))
        );
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        for bad in [
            "mysql://",
            "mysql:///db",
            "mysql://app@/db?ssl_mode=required",
            "postgres://h/db",
            "mysql://h:port/db",
            "mysql://a,b/db",
            "mysql://h/db/extra",
            "mysql://h/db?nope=1",
            "mysql://h/db?command_timeout=soon",
            "mysql://h/db?command_timeout=0s",
            "mysql://h/db?max_connections=1",
            "mysql://h/db?table=a;drop",
            "mysql://h/db?table=a.b.c",
            "mysql://h/db?prefix=has%20space",
            "mysql://h/db?create_table=maybe",
            "mysql://h/db?session_timeout=2s",
            "mysql://h",
        ] {
            assert!(
                matches!(MySqlConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
        assert!(MySqlConfig::from_url("mysql://h?table=db.fence").is_ok());
        assert!(
            !MySqlConfig::from_url("mysql://h?fencing=off")
                .unwrap()
                .fencing
        );
        let table = MySqlConfig::from_url("mysql://h/db?fencing=table").unwrap();
        assert!(table.fencing && table.fence_table);
        assert!(MySqlConfig::from_url("mysql://h/db?fencing=rows").is_err());
    }

    #[test]
    fn unknown_option_lists_known_ones() {
        let err = MySqlConfig::from_url("mysql://h/db?colour=red").unwrap_err();
        assert!(err.to_string().contains("max_connections"), "{err}");
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let c = MySqlConfig::from_url("mysql://user:hunter2@h:1/db").unwrap();
        assert!(!format!("{c:?} {c}").contains("hunter2"));
        assert_eq!(c.to_string(), "h:1/db");
    }
}
