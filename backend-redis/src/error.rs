//! Redis errors as `LockError`s: unreachable or slow is `Unavailable` (retryable), an untrusted
//! certificate or refused credentials `Config` (fixed in the configuration), the rest `Backend`.

use dlock_api::LockError;
use redis::RedisError;

use crate::BACKEND;

pub(crate) fn map_err(error: RedisError) -> LockError {
    if refused_by_tls(&error) {
        // A certificate the client does not trust fails again on every retry: the fix is in
        // the configuration (ca_cert, the host name), so it is no outage to ride out.
        return LockError::Config {
            backend: BACKEND,
            reason: format!("TLS refused the server: {error}"),
        };
    }
    if refused_credentials(&error) {
        // A wrong or missing password fails again on every retry: fixed in the configuration.
        return LockError::Config {
            backend: BACKEND,
            reason: format!(
                "the server refused the credentials: {error}; check the user and password in the URL"
            ),
        };
    }
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_cluster_error()
        // A Cluster client that reaches no node at all (every node down) says so this way.
        || matches!(error.kind(), redis::ErrorKind::ClusterConnectionNotFound)
        || matches!(
            error.code(),
            Some("READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
        )
    {
        LockError::unavailable(BACKEND, error)
    } else {
        LockError::backend(BACKEND, error)
    }
}

pub(crate) fn timed_out(after: std::time::Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}

/// A wrong or missing password, or a user the server's ACL does not let run dlock's commands.
fn refused_credentials(error: &RedisError) -> bool {
    matches!(error.kind(), redis::ErrorKind::AuthenticationFailed)
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// A server certificate rustls would not trust. Told by rustls's message: the driver wraps the
/// rustls error in an `io::Error`, whose `source` skips it, so a downcast cannot find it.
fn refused_by_tls(error: &RedisError) -> bool {
    error.is_io_error() && error.to_string().contains("invalid peer certificate")
}
