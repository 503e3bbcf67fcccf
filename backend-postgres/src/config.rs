//! `PostgresConfig`: where the server is and how the client behaves, from a URL or key/value pairs.

use std::fmt;
use std::time::Duration;

use dlock_api::raw::config::{
    Secret, TlsFiles, UrlParts, bool_option, duration_option, join_host_port, unknown_option,
};
use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::tls::{SslMode, certificate_option};

/// Configuration of a [`PostgresLock`](crate::PostgresLock).
///
/// Built from a URL ([`PostgresConfig::from_url`]) and adjusted with
/// [`set_option`](Self::set_option) (the `[options]` table of a dlock config file uses the same
/// keys as the URL's query):
///
/// | option | default | meaning |
/// |---|---|---|
/// | `host` | the URL's | a host name or address, or the directory of the server's Unix socket (an absolute path), as libpq's `host` |
/// | `port`, `dbname`, `user`, `password` | the URL's | as libpq's, for URLs that do not give them in place |
/// | `connect_timeout` | `2s` | TCP connect and startup handshake |
/// | `command_timeout` | `2s` | each non-waiting statement's reply; no call waits longer on a dead server |
/// | `max_connections` | `10` | most connections one client opens on each tokio runtime that uses it (lock sessions plus blocking waits) |
/// | `keepalive` | `1s` | how often a connection holding locks is pinged; a failed ping fires `lost` on its guards |
/// | `wait_slice` | `10s` | longest single server-side wait; longer waits re-issue the wait, so a dead server is noticed within `wait_slice + command_timeout` |
/// | `fencing` | `true` | take a fencing token from a sequence with every acquire (`false`: tokens are 0) |
/// | `fence_sequence` | `dlock_fence_seq` | the sequence tokens come from, optionally `schema.name`; the fence window's objects and the elections' leaders table (`NAME_leaders`) are named after it |
/// | `fence_window` | `1000000` | tokens reserved per durable write (one WAL flush); `0`: a `nextval` on the sequence per acquire, one flush per 32 (always so before PostgreSQL 15) |
/// | `create_fence` | `true` | create the sequence (and the leaders table) on connect if missing (`false`: run [`PostgresLock::migrate`](crate::PostgresLock::migrate) once, or create them yourself) |
/// | `tcp_keepalives_idle` | `10s` | server-side TCP keepalive: idle time before the first probe |
/// | `tcp_keepalives_interval` | `5s` | server-side TCP keepalive: time between probes |
/// | `tcp_keepalives_count` | `3` | server-side TCP keepalive: unanswered probes before the server drops the session (and its locks) |
/// | `application_name` | `dlock` | shown in `pg_stat_activity` |
/// | `sslmode` | `disable` | libpq's modes ([`SslMode`](crate::SslMode)): `disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`; those past `prefer` need the `tls-rustls` feature |
/// | `sslrootcert` | (webpki roots) | PEM file of the CA to trust (a private CA); needs `tls-rustls` |
/// | `sslcert`, `sslkey` | none | PEM files of a client certificate and its key, both or neither; need `tls-rustls` |
///
/// `Debug` and `Display` never show the password.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// Server host name or address.
    pub host: String,
    /// Server port.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password (never printed).
    pub password: Option<Secret>,
    /// Database name.
    pub database: String,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Per-statement timeout for statements that do not wait for a lock.
    pub command_timeout: Duration,
    /// Most connections one client keeps open, on each tokio runtime that uses it.
    pub max_connections: usize,
    /// Ping interval of connections that hold locks.
    pub keepalive: Duration,
    /// Longest single server-side wait.
    pub wait_slice: Duration,
    /// Whether acquires take fencing tokens.
    pub fencing: bool,
    /// The sequence fencing tokens come from (`name` or `schema.name`).
    pub fence_sequence: String,
    /// How many tokens one durable write reserves (`0`: `nextval` on the sequence per acquire).
    pub fence_window: u64,
    /// Create the fence sequence on connect when it is missing.
    pub create_fence: bool,
    /// Server-side `tcp_keepalives_idle`.
    pub tcp_keepalives_idle: Duration,
    /// Server-side `tcp_keepalives_interval`.
    pub tcp_keepalives_interval: Duration,
    /// Server-side `tcp_keepalives_count`.
    pub tcp_keepalives_count: u32,
    /// `application_name` of the client's connections.
    pub application_name: String,
    /// How connections use TLS.
    pub sslmode: SslMode,
    /// The certificate files: `sslrootcert` (the CA to trust instead of the webpki roots) is
    /// `ca_cert`, `sslcert` and `sslkey` (a client certificate and its key) are `client_cert`
    /// and `client_key`.
    pub tls_files: TlsFiles,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 5432,
            user: "postgres".into(),
            password: None,
            database: "postgres".into(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            max_connections: 10,
            keepalive: Duration::from_secs(1),
            wait_slice: Duration::from_secs(10),
            fencing: true,
            fence_sequence: "dlock_fence_seq".into(),
            fence_window: 1_000_000,
            create_fence: true,
            tcp_keepalives_idle: Duration::from_secs(10),
            tcp_keepalives_interval: Duration::from_secs(5),
            tcp_keepalives_count: 3,
            application_name: "dlock".into(),
            sslmode: SslMode::Disable,
            tls_files: TlsFiles::default(),
        }
    }
}

pub(crate) fn config_error(reason: impl Into<String>) -> LockError {
    dlock_api::raw::config::config_error(BACKEND, reason)
}

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .map_err(|_| config_error(format!("option `{key}` takes a number, not `{value}`")))
}

/// Checks `name` or `schema.name` made of plain identifier characters, and quotes it for SQL.
pub(crate) fn quote_qualified(name: &str) -> Result<String> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2
        || parts.iter().any(|p| {
            p.is_empty()
                || p.len() > 63
                || !p
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        })
    {
        return Err(config_error(format!(
            "`{name}` is not a valid `name` or `schema.name` (letters, digits, `_`, `$`; at most 63 bytes each)"
        )));
    }
    Ok(parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join("."))
}

/// `name_suffix` or `schema.name_suffix`, checked and quoted as [`quote_qualified`] does: the
/// fence window's objects, named after the fence sequence.
pub(crate) fn quote_qualified_suffixed(name: &str, suffix: &str) -> Result<String> {
    quote_qualified(&format!("{name}{suffix}"))
}

/// The largest `fence_window`: 2^40 tokens.
const MAX_FENCE_WINDOW: u64 = 1 << 40;

/// Where libpq looks for the server's socket when a URL names no host, as it was built on
/// Debian and on most other systems.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// The host of a URL that names none: the first socket directory with a socket for `port`.
fn default_host(port: u16) -> String {
    SOCKET_DIRS
        .iter()
        .find(|dir| std::path::Path::new(&format!("{dir}/.s.PGSQL.{port}")).exists())
        .map_or_else(|| "localhost".to_owned(), |dir| (*dir).to_owned())
}

fn non_empty(key: &str, value: &str) -> Result<String> {
    if value.is_empty() {
        return Err(config_error(format!("option `{key}` is empty")));
    }
    Ok(value.to_owned())
}

/// The longest suffix [`quote_qualified_suffixed`] is given (the leaders table's).
const LONGEST_SUFFIX: &str = crate::election::LEADERS_SUFFIX;

const KNOWN: &str = "host, port, dbname, user, password, connect_timeout, command_timeout, max_connections, keepalive, wait_slice, fencing, fence_sequence, fence_window, create_fence, tcp_keepalives_idle, tcp_keepalives_interval, tcp_keepalives_count, application_name, sslmode, sslrootcert, sslcert, sslkey";

impl PostgresConfig {
    /// Parses `postgres://[user[:password]@][host][:port][/database][?option=value…]` (also
    /// `postgresql://`), as libpq reads it. The user defaults to `postgres`, the port to 5432,
    /// the database to the user name. Options are listed on [`PostgresConfig`].
    ///
    /// The host is a name or an address, or a directory holding the server's Unix socket: an
    /// absolute path, percent-encoded in the authority (`postgres://app@%2Fvar%2Frun%2Fpostgresql/db`)
    /// or given as the `host` option (`postgres:///db?host=/var/run/postgresql`). A URL without
    /// one, as libpq, uses the socket in `/var/run/postgresql` or `/tmp`, whichever has one for
    /// the port, and `localhost` if neither has.
    ///
    /// # Errors
    /// [`LockError::Config`] saying what is wrong; no network call is made.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = UrlParts::parse_host_optional(BACKEND, url, crate::SCHEMES)?;
        if parts.hosts.len() > 1 {
            return Err(config_error(
                "postgres:// takes one host (multi-host failover URLs are not supported)",
            ));
        }
        let mut config = Self::default();
        if let Some(user) = parts.user.clone() {
            config.user = user;
        }
        config.password = parts.password.clone();
        config.host.clear();
        if !parts.hosts.is_empty() {
            (config.host, config.port) = parts.one_host(BACKEND, config.port)?;
        }
        parts.at_most_segments(BACKEND, 1)?;
        config.database = parts.path.first().cloned().unwrap_or_default();
        parts.apply_options(|key, value| config.set_option(key, value))?;
        if config.database.is_empty() {
            // Like libpq: the database defaults to the user's name.
            config.database = config.user.clone();
        }
        if config.host.is_empty() {
            config.host = default_host(config.port);
        }
        Ok(config)
    }

    /// Sets one option by name (see the table on [`PostgresConfig`]).
    ///
    /// # Errors
    /// [`LockError::Config`] for an unknown option or a malformed value.
    pub fn set_option(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "connect_timeout" => self.connect_timeout = duration_option(BACKEND, key, value)?,
            "command_timeout" => self.command_timeout = duration_option(BACKEND, key, value)?,
            "keepalive" => self.keepalive = duration_option(BACKEND, key, value)?,
            "wait_slice" => self.wait_slice = duration_option(BACKEND, key, value)?,
            "max_connections" => {
                let n: usize = parse_number(key, value)?;
                if n == 0 {
                    return Err(config_error("option `max_connections` must be at least 1"));
                }
                self.max_connections = n;
            }
            "fencing" => self.fencing = bool_option(BACKEND, key, value)?,
            "create_fence" => self.create_fence = bool_option(BACKEND, key, value)?,
            "fence_sequence" => {
                quote_qualified(value)?;
                // The window's objects and the leaders table are named after it: they must fit
                // too.
                quote_qualified_suffixed(value, LONGEST_SUFFIX)?;
                self.fence_sequence = value.to_owned();
            }
            "tcp_keepalives_idle" => {
                self.tcp_keepalives_idle = duration_option(BACKEND, key, value)?
            }
            "tcp_keepalives_interval" => {
                self.tcp_keepalives_interval = duration_option(BACKEND, key, value)?
            }
            "tcp_keepalives_count" => self.tcp_keepalives_count = parse_number(key, value)?,
            "fence_window" => {
                let window: u64 = parse_number(key, value)?;
                // Tokens are bigints: a window must leave room for a great many renewals.
                if window > MAX_FENCE_WINDOW {
                    return Err(config_error(format!(
                        "option `fence_window` is at most {MAX_FENCE_WINDOW}, not {window}"
                    )));
                }
                self.fence_window = window;
            }
            "application_name" => {
                if !value
                    .chars()
                    .all(|c| c.is_ascii_graphic() && c != '\\' && c != '\'')
                {
                    return Err(config_error(
                        "option `application_name` takes printable ASCII without spaces, quotes or backslashes",
                    ));
                }
                self.application_name = value.to_owned();
            }
            "host" => self.host = non_empty(key, value)?,
            "port" => self.port = parse_number(key, value)?,
            "dbname" => self.database = non_empty(key, value)?,
            "user" => self.user = non_empty(key, value)?,
            "password" => self.password = Some(Secret::new(value)),
            "sslmode" => self.sslmode = SslMode::parse(value)?,
            "sslrootcert" => self.tls_files.ca_cert = Some(certificate_option(key, value)?),
            "sslcert" => self.tls_files.client_cert = Some(certificate_option(key, value)?),
            "sslkey" => self.tls_files.client_key = Some(certificate_option(key, value)?),
            other => return Err(unknown_option(BACKEND, other, KNOWN)),
        }
        Ok(())
    }

    /// The fence sequence's name, quoted for SQL.
    pub(crate) fn quoted_sequence(&self) -> Result<String> {
        quote_qualified(&self.fence_sequence)
    }
}

impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            join_host_port(&self.host, self.port),
            self.database
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let c = PostgresConfig::from_url(
            "postgres://app:p%40ss@db.local:6543/orders?command_timeout=500ms&max_connections=4",
        )
        .unwrap();
        assert_eq!(c.host, "db.local");
        assert_eq!(c.port, 6543);
        assert_eq!(c.user, "app");
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("p@ss"));
        assert_eq!(c.database, "orders");
        assert_eq!(c.command_timeout, Duration::from_millis(500));
        assert_eq!(c.max_connections, 4);
        let d = PostgresConfig::from_url("postgresql://localhost").unwrap();
        assert_eq!((d.host.as_str(), d.port), ("localhost", 5432));
        assert_eq!(
            (d.user.as_str(), d.database.as_str()),
            ("postgres", "postgres")
        );
        let e = PostgresConfig::from_url("postgres://bob@[::1]:5433").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("::1", 5433));
        assert_eq!(e.database, "bob");
        let f = PostgresConfig::from_url(
            "postgres://h/db?fencing=off&fence_sequence=locks.fence&sslmode=prefer",
        )
        .unwrap();
        assert!(!f.fencing);
        assert_eq!(f.quoted_sequence().unwrap(), "\"locks\".\"fence\"");
        assert_eq!(f.fence_window, 1_000_000);
        let g = PostgresConfig::from_url("postgres://h/db?fence_window=0").unwrap();
        assert_eq!(g.fence_window, 0);
        // The window's objects are named after the sequence and must fit in 63 bytes too.
        let longest = "s".repeat(63 - LONGEST_SUFFIX.len());
        assert!(
            PostgresConfig::from_url(&format!("postgres://h/db?fence_sequence={longest}")).is_ok()
        );
        assert!(matches!(
            PostgresConfig::from_url(&format!("postgres://h/db?fence_sequence={longest}s")),
            Err(LockError::Config { .. })
        ));
    }

    #[test]
    fn parses_libpq_host_options_and_urls_without_a_host() {
        let c = PostgresConfig::from_url(
            "postgresql:///orders?host=%2Frun%2Fpg&port=6000&user=app&password=pw",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("/run/pg", 6000));
        assert_eq!((c.user.as_str(), c.database.as_str()), ("app", "orders"));
        assert_eq!(c.password.as_ref().map(|p| p.expose()), Some("pw"));
        // The database defaults to the user's name, wherever the user was given.
        let d = PostgresConfig::from_url("postgres://h?user=app").unwrap();
        assert_eq!(d.database, "app");
        let e = PostgresConfig::from_url("postgres://h/x?dbname=y&host=other").unwrap();
        assert_eq!((e.host.as_str(), e.database.as_str()), ("other", "y"));
        // No host at all: a default socket directory that has the port's socket, or localhost.
        for url in ["postgres://", "postgres:///db", "postgres://app@/db"] {
            let f = PostgresConfig::from_url(url).unwrap();
            let socket = format!("{}/.s.PGSQL.{}", f.host, f.port);
            assert!(
                f.host == "localhost"
                    || (SOCKET_DIRS.contains(&f.host.as_str())
                        && std::path::Path::new(&socket).exists()),
                "{url}: {}",
                f.host
            );
        }
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        for bad in [
            "mysql://h/db",
            "postgres//h",
            "postgres://h:port/db",
            "postgres://a,b/db",
            "postgres://h/db/extra",
            "postgres://h/db?nope=1",
            "postgres://h/db?command_timeout=soon",
            "postgres://h/db?command_timeout=0s",
            "postgres://h/db?max_connections=0",
            "postgres://h/db?fencing=maybe",
            "postgres://h/db?host=",
            "postgres://h/db?user=",
            "postgres://h/db?port=99999",
            "postgres://h/db?fence_sequence=a;drop",
            "postgres://h/db?fence_sequence=a.b.c",
            "postgres://h/db?fence_window=-1",
            "postgres://h/db?fence_window=many",
            "postgres://h/db?fence_window=1099511627777",
            "postgres://h/db?sslmode=required",
        ] {
            assert!(
                matches!(PostgresConfig::from_url(bad), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
        // Without TLS in the build, nothing that needs it parses.
        for tls_only in [
            "postgres://h/db?sslmode=require",
            "postgres://h/db?sslmode=verify-full",
            "postgres://h/db?sslrootcert=/ca.pem",
        ] {
            assert_eq!(
                PostgresConfig::from_url(tls_only).is_ok(),
                cfg!(feature = "tls-rustls"),
                "{tls_only}"
            );
        }
        let mut c = PostgresConfig::default();
        let e = c.set_option("bogus", "1").unwrap_err().to_string();
        assert!(e.contains("known:") && e.contains("max_connections"), "{e}");
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let c = PostgresConfig::from_url("postgres://user:hunter2@h:1/db").unwrap();
        let shown = format!("{c:?} {c}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(c.to_string(), "h:1/db");
    }
}
