//! TLS to the server: libpq's `sslmode` and certificate options, mapped onto sqlx's.
//!
//! TLS needs the `tls-rustls` feature (rustls with the ring provider and the webpki roots, as sqlx
//! builds it). Without it, the modes that would only work over TLS and the certificate options are
//! refused when the URL is parsed, so a build without TLS never talks in the clear to a server the
//! URL meant to reach over TLS.

use dlock_api::Result;
use dlock_api::raw::config::{TlsFiles, tls_option_not_built};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

fn config_error(reason: impl Into<String>) -> dlock_api::LockError {
    dlock_api::raw::config::config_error(crate::BACKEND, reason)
}

/// How a connection uses TLS: libpq's `sslmode`, with libpq's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP only (dlock's default).
    #[default]
    Disable,
    /// Plain TCP; TLS only if the server insists.
    Allow,
    /// TLS if the server offers it, else plain TCP (libpq's default).
    Prefer,
    /// TLS, without checking the server's certificate.
    Require,
    /// TLS, with a certificate signed by a trusted CA (`sslrootcert`, else the webpki roots).
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host the URL names.
    VerifyFull,
}

impl SslMode {
    /// Parses libpq's spelling (`disable`, `allow`, `prefer`, `require`, `verify-ca`,
    /// `verify-full`).
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for another value, or for a mode that
    /// needs TLS in a build without it.
    pub fn parse(value: &str) -> Result<Self> {
        let mode = match value {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(config_error(format!(
                    "sslmode `{other}` is not one of disable, allow, prefer, require, verify-ca, verify-full"
                )));
            }
        };
        if mode.needs_tls() && !TLS_BUILT_IN {
            return Err(no_tls(&format!("sslmode `{value}`")));
        }
        Ok(mode)
    }

    /// Whether the mode never connects without TLS.
    fn needs_tls(self) -> bool {
        matches!(self, Self::Require | Self::VerifyCa | Self::VerifyFull)
    }
}

/// Whether this build can speak TLS.
const TLS_BUILT_IN: bool = cfg!(feature = "tls-rustls");

fn no_tls(what: &str) -> dlock_api::LockError {
    tls_option_not_built(
        crate::BACKEND,
        what,
        "`tls-rustls` of dlock-postgres (or of dlock)",
    )
}

/// Checks a certificate option (`sslrootcert`, `sslcert`, `sslkey`) of a URL: it needs TLS.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) in a build without TLS.
pub(crate) fn certificate_option(key: &str, value: &str) -> Result<std::path::PathBuf> {
    if !TLS_BUILT_IN {
        return Err(no_tls(&format!("option `{key}`")));
    }
    Ok(value.into())
}

/// Sets `mode` and the certificate files (`sslrootcert` as `ca_cert`, `sslcert` and `sslkey`) on
/// `options`, reading the files now: a missing or unreadable file is a configuration error before
/// any network call, not a failed handshake.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for an unreadable file, or a client
/// certificate without its key (or the reverse).
pub(crate) fn apply(
    mut options: PgConnectOptions,
    mode: SslMode,
    files: &TlsFiles,
) -> Result<PgConnectOptions> {
    options = options.ssl_mode(match mode {
        // Without TLS in the build, `allow` and `prefer` are plain TCP, as with a libpq built
        // without SSL.
        SslMode::Allow if TLS_BUILT_IN => PgSslMode::Allow,
        SslMode::Prefer if TLS_BUILT_IN => PgSslMode::Prefer,
        SslMode::Disable | SslMode::Allow | SslMode::Prefer => PgSslMode::Disable,
        SslMode::Require => PgSslMode::Require,
        SslMode::VerifyCa => PgSslMode::VerifyCa,
        SslMode::VerifyFull => PgSslMode::VerifyFull,
    });
    files.check_pair(crate::BACKEND, "sslcert", "sslkey")?;
    let pem = files.read(crate::BACKEND)?;
    if let Some(ca_cert) = pem.ca_cert {
        options = options.ssl_root_cert_from_pem(ca_cert.into_bytes());
    }
    if let Some((cert, key)) = pem.identity {
        options = options
            .ssl_client_cert_from_pem(cert)
            .ssl_client_key_from_pem(key);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(key: &str, path: &str) -> TlsFiles {
        let mut files = TlsFiles::default();
        assert!(files.set_option(key, path));
        files
    }

    #[test]
    fn parses_libpq_modes() {
        assert_eq!(SslMode::parse("disable").unwrap(), SslMode::Disable);
        assert_eq!(SslMode::parse("prefer").unwrap(), SslMode::Prefer);
        assert!(SslMode::parse("verify_full").is_err());
        assert_eq!(
            SslMode::parse("verify-full").is_ok(),
            TLS_BUILT_IN,
            "verify-full parses exactly when TLS is built in"
        );
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let error = apply(
            PgConnectOptions::new(),
            SslMode::Disable,
            &files("cert", "/nonexistent/client.pem"),
        )
        .unwrap_err();
        assert!(error.to_string().contains("go together"), "{error}");
    }

    #[test]
    fn an_unreadable_root_certificate_is_a_config_error() {
        let error = apply(
            PgConnectOptions::new(),
            SslMode::Disable,
            &files("ca_cert", "/nonexistent/ca.pem"),
        )
        .unwrap_err();
        assert!(
            matches!(error, dlock_api::LockError::Config { .. }),
            "{error}"
        );
    }
}
