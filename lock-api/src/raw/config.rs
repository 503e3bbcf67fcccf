//! Helpers for backend configurations: option values and URL parts, parsed the same way and
//! refused with the same messages in every backend.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{LockError, Result};

/// A [`LockError::Config`] for `backend`.
pub fn config_error(backend: &'static str, reason: impl Into<String>) -> LockError {
    LockError::Config {
        backend,
        reason: reason.into(),
    }
}

/// The refusal of an option `key` a backend does not take; `known` lists the ones it does.
pub fn unknown_option(backend: &'static str, key: &str, known: &str) -> LockError {
    config_error(backend, format!("unknown option `{key}` (known: {known})"))
}

/// The refusal of a TLS URL (`scheme://`) by a build without TLS; `feature` says which feature
/// to enable, and of which crate.
pub fn tls_not_built(backend: &'static str, scheme: &str, feature: &str) -> LockError {
    config_error(
        backend,
        format!("{scheme}:// needs TLS support: enable feature {feature}"),
    )
}

/// The refusal of an option that needs TLS (`what`, such as ``sslmode `require` ``) by a build
/// without TLS, so that a connection meant to be encrypted is never made in the clear; `feature`
/// says which feature to enable, and of which crate.
pub fn tls_option_not_built(backend: &'static str, what: &str, feature: &str) -> LockError {
    config_error(
        backend,
        format!("{what} needs TLS, which this build does not include: enable feature {feature}"),
    )
}

/// The longest duration a configuration option takes (a year): longer is surely a unit mistake,
/// and it keeps sums of configured durations far from overflow.
pub const MAX_OPTION_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration option such as `500ms`, `2s` or `1m` (humantime syntax); zero and durations
/// over [`MAX_OPTION_DURATION`] are refused.
///
/// # Errors
/// [`LockError::Config`] naming the option.
pub fn duration_option(backend: &'static str, key: &str, value: &str) -> Result<Duration> {
    let duration = humantime::parse_duration(value)
        .map_err(|e| config_error(backend, format!("option `{key}`: {e}")))?;
    if duration.is_zero() {
        return Err(config_error(
            backend,
            format!("option `{key}` must be greater than zero"),
        ));
    }
    if duration > MAX_OPTION_DURATION {
        return Err(config_error(
            backend,
            format!("option `{key}` is {value}; the limit is a year"),
        ));
    }
    Ok(duration)
}

/// Parses a boolean option: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, in any case.
///
/// # Errors
/// [`LockError::Config`] naming the option.
pub fn bool_option(backend: &'static str, key: &str, value: &str) -> Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(config_error(
            backend,
            format!("option `{key}` takes true or false, not `{value}`"),
        )),
    }
}

/// Decodes `%XX` escapes in a URL part (user name, password, path); `+` stays `+`.
pub fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// A secret (a password) that never shows in logs: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps `secret`.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for the driver that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<&str> for Secret {
    fn from(secret: &str) -> Self {
        Self::new(secret)
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

/// The PEM files of a TLS connection, from the options `ca_cert`, `cert` and `key`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// A PEM file of the CA to trust.
    pub ca_cert: Option<PathBuf>,
    /// A PEM client certificate.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's PEM key.
    pub client_key: Option<PathBuf>,
}

impl TlsFiles {
    /// The option keys these files are set by, as a backend lists its known options.
    pub const OPTIONS: &'static str = "ca_cert, cert, key";

    /// Takes `value` if `key` is `ca_cert`, `cert` or `key`; returns whether it was one of them.
    pub fn set_option(&mut self, key: &str, value: &str) -> bool {
        let file = match key {
            "ca_cert" => &mut self.ca_cert,
            "cert" => &mut self.client_cert,
            "key" => &mut self.client_key,
            _ => return false,
        };
        *file = Some(value.into());
        true
    }

    /// Checks the files against the connection: none of them without TLS (`tls_scheme` is the
    /// scheme that has it), and a client certificate only together with its key.
    ///
    /// # Errors
    /// [`LockError::Config`] for `backend` naming the options.
    pub fn check(&self, backend: &'static str, tls: bool, tls_scheme: &str) -> Result<()> {
        if !tls && (self.ca_cert.is_some() || self.client_cert.is_some()) {
            return Err(config_error(
                backend,
                format!("options `ca_cert`, `cert` and `key` need {tls_scheme}://"),
            ));
        }
        self.check_pair(backend, "cert", "key")
    }

    /// Checks that a client certificate comes with its key and the reverse; `cert_option` and
    /// `key_option` are the options that set them, as the backend's URL names them.
    ///
    /// # Errors
    /// [`LockError::Config`] for `backend` naming the options.
    pub fn check_pair(
        &self,
        backend: &'static str,
        cert_option: &str,
        key_option: &str,
    ) -> Result<()> {
        if self.client_cert.is_some() != self.client_key.is_some() {
            return Err(config_error(
                backend,
                format!(
                    "options `{cert_option}` and `{key_option}` go together: a client certificate needs its key"
                ),
            ));
        }
        Ok(())
    }

    /// Reads the files that are set, for the TLS library of a backend's client.
    ///
    /// # Errors
    /// [`LockError::Config`] for `backend` naming a file that cannot be read as text.
    pub fn read(&self, backend: &'static str) -> Result<TlsPem> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path)
                .map_err(|e| config_error(backend, format!("cannot read {}: {e}", path.display())))
        };
        let ca_cert = self.ca_cert.as_ref().map(read).transpose()?;
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        Ok(TlsPem { ca_cert, identity })
    }
}

/// The PEM texts of [`TlsFiles`], read.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct TlsPem {
    /// The CA to trust.
    pub ca_cert: Option<String>,
    /// A client certificate and its key.
    pub identity: Option<(String, String)>,
}

impl fmt::Debug for TlsPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is a secret.
        f.debug_struct("TlsPem")
            .field("ca_cert", &self.ca_cert.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// One `host[:port]` of a URL; an IPv6 address is kept without its brackets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    /// The host name or address, percent-decoded.
    pub host: String,
    /// The port, if the URL gave one.
    pub port: Option<u16>,
}

impl HostPort {
    /// `host:port`, with brackets around an IPv6 address, and `default_port` if none was given.
    pub fn with_default_port(&self, default_port: u16) -> String {
        join_host_port(&self.host, self.port.unwrap_or(default_port))
    }
}

/// A backend URL split into its parts, the same way for every backend:
/// `scheme://[user[:password]@]host[:port][,host[:port]…][/segment…][?key=value&…]`.
///
/// Several hosts are allowed (Sentinel, Cluster, Redlock, etcd and ZooKeeper URLs list several,
/// which a generic URL parser refuses); a backend that takes one calls
/// [`one_host`](Self::one_host). User, password, hosts and path segments are percent-decoded.
#[derive(Clone, Debug)]
pub struct UrlParts {
    /// The scheme, lower-cased.
    pub scheme: String,
    /// The user name, if one was given and not empty.
    pub user: Option<String>,
    /// The password, if one was given and not empty.
    pub password: Option<Secret>,
    /// The hosts, in order: at least one, unless parsed by
    /// [`parse_host_optional`](Self::parse_host_optional).
    pub hosts: Vec<HostPort>,
    /// The non-empty path segments.
    pub path: Vec<String>,
    /// The query's `key=value` pairs, decoded, in order.
    pub options: Vec<(String, String)>,
}

impl UrlParts {
    /// Splits `url`, whose scheme must be one of `schemes`.
    ///
    /// # Errors
    /// [`LockError::Config`] for `backend`: no `scheme://`, a scheme not in `schemes`, no host,
    /// an empty host in a list, an unclosed `[`, a port that is not a number.
    pub fn parse(backend: &'static str, url: &str, schemes: &[&str]) -> Result<Self> {
        let parts = Self::parse_host_optional(backend, url, schemes)?;
        if parts.hosts.is_empty() {
            return Err(config_error(backend, "the URL names no host"));
        }
        Ok(parts)
    }

    /// As [`parse`](Self::parse), but a URL without a host (`postgres:///db`) is accepted, with
    /// no [`hosts`](Self::hosts): for a backend whose URLs can name the server another way, as
    /// libpq's can with a `host` option or its default socket directory.
    ///
    /// # Errors
    /// As [`parse`](Self::parse), except for the missing host.
    pub fn parse_host_optional(backend: &'static str, url: &str, schemes: &[&str]) -> Result<Self> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            config_error(
                backend,
                format!("expected {}://…", schemes.first().unwrap_or(&backend)),
            )
        })?;
        let scheme = scheme.to_ascii_lowercase();
        if !schemes.contains(&scheme.as_str()) {
            return Err(config_error(
                backend,
                format!(
                    "unknown scheme `{scheme}://` (expected {})",
                    schemes
                        .iter()
                        .map(|s| format!("{s}://"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            Some(userinfo) => {
                let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
                (
                    (!user.is_empty()).then(|| percent_decode(user)),
                    (!password.is_empty()).then(|| Secret::new(percent_decode(password))),
                )
            }
            None => (None, None),
        };
        let hosts = match hosts {
            "" => Vec::new(),
            hosts => hosts
                .split(',')
                .map(|host| host_port(backend, host))
                .collect::<Result<Vec<_>>>()?,
        };
        Ok(Self {
            scheme,
            user,
            password,
            hosts,
            path: path
                .split('/')
                .filter(|s| !s.is_empty())
                .map(percent_decode)
                .collect(),
            options: url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        })
    }

    /// Every host as `host:port`, with `default_port` where none was given.
    pub fn host_ports(&self, default_port: u16) -> Vec<String> {
        self.hosts
            .iter()
            .map(|host| host.with_default_port(default_port))
            .collect()
    }

    /// Hands each query option to `set_option`, in the URL's order, stopping at the first
    /// refusal.
    ///
    /// # Errors
    /// The first error `set_option` returns.
    pub fn apply_options(
        &self,
        mut set_option: impl FnMut(&str, &str) -> Result<()>,
    ) -> Result<()> {
        self.options
            .iter()
            .try_for_each(|(key, value)| set_option(key, value))
    }

    /// The one host of a URL that takes one, with `default_port` if none was given.
    ///
    /// # Errors
    /// [`LockError::Config`] if the URL lists several hosts.
    pub fn one_host(&self, backend: &'static str, default_port: u16) -> Result<(String, u16)> {
        match self.hosts.as_slice() {
            [one] => Ok((one.host.clone(), one.port.unwrap_or(default_port))),
            _ => Err(config_error(
                backend,
                format!("{}:// takes one host", self.scheme),
            )),
        }
    }

    /// The path segments after the first `max`, if any: for a refusal naming the first.
    ///
    /// # Errors
    /// [`LockError::Config`] naming the first unexpected segment.
    pub fn at_most_segments(&self, backend: &'static str, max: usize) -> Result<()> {
        match self.path.get(max) {
            Some(extra) => Err(config_error(
                backend,
                format!("unexpected path segment `{extra}`"),
            )),
            None => Ok(()),
        }
    }
}

fn host_port(backend: &'static str, text: &str) -> Result<HostPort> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| config_error(backend, format!("unclosed `[` in host `{text}`")))?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(config_error(backend, format!("bad host `{text}`"))),
            },
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(config_error(
            backend,
            format!("empty host in `{text}`; the URL names no host there"),
        ));
    }
    let port = port
        .map(|port| {
            port.parse::<u16>()
                .map_err(|_| config_error(backend, format!("port `{port}` is not a number")))
        })
        .transpose()?;
    Ok(HostPort {
        host: percent_decode(host),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        assert_eq!(
            duration_option("x", "t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert!(duration_option("x", "t", "0s").is_err());
        assert!(duration_option("x", "t", "soon").is_err());
        assert!(duration_option("x", "t", "999999999999s").is_err());
        assert!(duration_option("x", "t", "18446744073709551615ms").is_err());
        assert!(bool_option("x", "b", "ON").unwrap());
        assert!(!bool_option("x", "b", "0").unwrap());
        assert!(bool_option("x", "b", "maybe").is_err());
        assert_eq!(percent_decode("p%40ss+word"), "p@ss+word");
    }

    #[test]
    fn tls_files_need_tls_and_a_key_with_the_certificate() {
        let mut files = TlsFiles::default();
        assert!(files.check("x", false, "xs").is_ok());
        assert!(files.set_option("ca_cert", "/ca.pem"));
        assert!(!files.set_option("prefix", "p"));
        assert_eq!(files.ca_cert, Some(PathBuf::from("/ca.pem")));
        let refused = files.check("x", false, "xs").unwrap_err().to_string();
        assert!(refused.contains("need xs://"), "{refused}");
        assert!(files.check("x", true, "xs").is_ok());
        files.set_option("cert", "/c.pem");
        assert!(files.check("x", true, "xs").is_err());
        files.set_option("key", "/k.pem");
        assert!(files.check("x", true, "xs").is_ok());
    }

    #[test]
    fn splits_urls_with_several_hosts() {
        let parts = UrlParts::parse(
            "x",
            "X://us%40er:p%40ss@h1:1,[::1]:2,h3/a/b%2Fc?k=v&t=1s",
            &["x"],
        )
        .unwrap();
        assert_eq!(parts.scheme, "x");
        assert_eq!(parts.user.as_deref(), Some("us@er"));
        assert_eq!(parts.password.as_ref().map(Secret::expose), Some("p@ss"));
        assert_eq!(format!("{:?}", parts.password), "Some(***)");
        assert_eq!(parts.hosts.len(), 3);
        assert_eq!(parts.hosts[1].with_default_port(9), "[::1]:2");
        assert_eq!(parts.hosts[2].with_default_port(9), "h3:9");
        assert_eq!(parts.path, ["a", "b/c"]);
        assert_eq!(parts.options[1], ("t".to_owned(), "1s".to_owned()));
        assert_eq!(parts.host_ports(9), ["h1:1", "[::1]:2", "h3:9"]);
        let mut applied = Vec::new();
        parts
            .apply_options(|key, value| {
                applied.push(format!("{key}={value}"));
                Ok(())
            })
            .unwrap();
        assert_eq!(applied, ["k=v", "t=1s"]);
        for bad in ["x://", "x://h:port", "x://[::1", "x://a,,b", "y://h", "h"] {
            assert!(UrlParts::parse("x", bad, &["x"]).is_err(), "{bad}");
        }
    }
}
