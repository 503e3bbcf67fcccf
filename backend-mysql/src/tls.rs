//! TLS to the server: MySQL's `ssl-mode` and certificate options, mapped onto sqlx's.
//!
//! TLS needs the `tls-rustls` feature (rustls with the ring provider and the webpki roots, as sqlx
//! builds it). Without it, the modes that would only work over TLS and the certificate options are
//! refused when the URL is parsed, so a build without TLS never talks in the clear to a server the
//! URL meant to reach over TLS.

use dlock_api::raw::config::{TlsFiles, config_error, tls_option_not_built};
use dlock_api::{LockError, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use crate::BACKEND;

/// How a connection uses TLS: MySQL's `--ssl-mode`, with MySQL's meanings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// Plain TCP only (dlock's default).
    #[default]
    Disabled,
    /// TLS if the server offers it, else plain TCP (the MySQL client's default).
    Preferred,
    /// TLS, without checking the server's certificate.
    Required,
    /// TLS, with a certificate signed by a trusted CA (`ssl_ca`, else the webpki roots).
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host the URL names.
    VerifyIdentity,
}

impl SslMode {
    /// Parses MySQL's spelling, in any case (`DISABLED`, `PREFERRED`, `REQUIRED`, `VERIFY_CA`,
    /// `VERIFY_IDENTITY`).
    ///
    /// # Errors
    /// [`LockError::Config`] for another value, or for a mode that needs TLS in a build without it.
    pub fn parse(value: &str) -> Result<Self> {
        let mode = match value.to_ascii_uppercase().as_str() {
            "DISABLED" => Self::Disabled,
            "PREFERRED" => Self::Preferred,
            "REQUIRED" => Self::Required,
            "VERIFY_CA" => Self::VerifyCa,
            "VERIFY_IDENTITY" => Self::VerifyIdentity,
            _ => {
                return Err(config_error(
                    BACKEND,
                    format!(
                        "ssl_mode `{value}` is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
                    ),
                ));
            }
        };
        if !matches!(mode, Self::Disabled | Self::Preferred) && !TLS_BUILT_IN {
            return Err(no_tls(&format!("ssl_mode `{value}`")));
        }
        Ok(mode)
    }
}

/// Whether this build can speak TLS.
const TLS_BUILT_IN: bool = cfg!(feature = "tls-rustls");

fn no_tls(what: &str) -> LockError {
    tls_option_not_built(BACKEND, what, "`tls-rustls` of dlock-mysql (or of dlock)")
}

/// Takes a certificate option (`ssl_ca`, `ssl_cert`, `ssl_key`, or MySQL's `ssl-ca`, `ssl-cert`,
/// `ssl-key`) into `files`; returns whether `key` was one.
///
/// # Errors
/// [`LockError::Config`] in a build without TLS.
pub(crate) fn set_certificate_option(files: &mut TlsFiles, key: &str, value: &str) -> Result<bool> {
    let as_shared = match key {
        "ssl_ca" | "ssl-ca" => "ca_cert",
        "ssl_cert" | "ssl-cert" => "cert",
        "ssl_key" | "ssl-key" => "key",
        _ => return Ok(false),
    };
    if !TLS_BUILT_IN {
        return Err(no_tls(&format!("option `{key}`")));
    }
    Ok(files.set_option(as_shared, value))
}

/// Sets `mode` and the certificate files on `options`, reading the files now: a missing or
/// unreadable file is a configuration error before any network call, not a failed handshake.
///
/// # Errors
/// [`LockError::Config`] for an unreadable file, or a client certificate without its key (or the
/// reverse).
pub(crate) fn apply(
    mut options: MySqlConnectOptions,
    mode: SslMode,
    files: &TlsFiles,
) -> Result<MySqlConnectOptions> {
    options = options.ssl_mode(match mode {
        // Without TLS in the build, `PREFERRED` is plain TCP, as with a client built without TLS.
        SslMode::Preferred if TLS_BUILT_IN => MySqlSslMode::Preferred,
        SslMode::Disabled | SslMode::Preferred => MySqlSslMode::Disabled,
        SslMode::Required => MySqlSslMode::Required,
        SslMode::VerifyCa => MySqlSslMode::VerifyCa,
        SslMode::VerifyIdentity => MySqlSslMode::VerifyIdentity,
    });
    files.check_pair(BACKEND, "ssl_cert", "ssl_key")?;
    let pem = files.read(BACKEND)?;
    if let Some(ca_cert) = pem.ca_cert {
        options = options.ssl_ca_from_pem(ca_cert.into_bytes());
    }
    if let Some((cert, key)) = pem.identity {
        options = options
            .ssl_client_cert_from_pem(cert)
            .ssl_client_key_from_pem(key);
    }
    Ok(options)
}

/// Whether a failed connect is TLS refusing the server (an untrusted certificate, a name it does
/// not cover) or the server refusing TLS: retrying will not help, the URL or the server's setup
/// must change. rustls reports a refused certificate as invalid data on the socket.
pub(crate) fn is_tls_refusal(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mysql_modes_in_any_case() {
        assert_eq!(SslMode::parse("DISABLED").unwrap(), SslMode::Disabled);
        assert_eq!(SslMode::parse("preferred").unwrap(), SslMode::Preferred);
        assert!(SslMode::parse("verify-identity").is_err());
        assert_eq!(
            SslMode::parse("verify_identity").is_ok(),
            TLS_BUILT_IN,
            "VERIFY_IDENTITY parses exactly when TLS is built in"
        );
    }

    #[test]
    fn certificate_options_take_both_spellings() {
        let mut files = TlsFiles::default();
        assert!(!set_certificate_option(&mut files, "prefix", "x").unwrap());
        let taken = set_certificate_option(&mut files, "ssl-ca", "/ca.pem");
        assert_eq!(taken.is_ok(), TLS_BUILT_IN);
        if TLS_BUILT_IN {
            assert_eq!(
                files.ca_cert.as_deref(),
                Some(std::path::Path::new("/ca.pem"))
            );
            set_certificate_option(&mut files, "ssl_cert", "/nonexistent/c.pem").unwrap();
            let error = apply(MySqlConnectOptions::new(), SslMode::Required, &files).unwrap_err();
            assert!(error.to_string().contains("go together"), "{error}");
        }
    }
}
