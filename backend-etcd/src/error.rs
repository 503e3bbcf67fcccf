//! etcd errors as `LockError`s: an unreachable member, a member without a leader or a slow
//! answer is `Unavailable` (retryable); the rest is `Backend`.

use dlock_api::LockError;
use etcd_client::Error;
use tonic::Code;

use crate::BACKEND;

pub(crate) fn map_err(error: Error) -> LockError {
    if is_unavailable(&error) {
        LockError::unavailable(BACKEND, error)
    } else {
        LockError::backend(BACKEND, error)
    }
}

/// Whether trying again (on another member, or after a pause) may succeed.
pub(crate) fn is_unavailable(error: &Error) -> bool {
    match error {
        Error::TransportError(_) | Error::IoError(_) => true,
        Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::ResourceExhausted
                    | Code::Cancelled
                    | Code::Unknown
            ) || is_auth_expired(error)
                || status.message().contains("no leader")
                || status.message().contains("leader changed")
                || status.message().contains("timed out")
        }
        Error::WatchError(_) | Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// The server no longer knows the lease (revoked, or expired).
pub(crate) fn is_lease_not_found(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status) if status.message().contains("lease not found"))
}

/// An authentication token that expired or was refused: a new stream (or request) gets a new one.
pub(crate) fn is_auth_expired(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status)
        if status.code() == Code::Unauthenticated
            || status.message().contains("invalid auth token")
            || status.message().contains("permission denied"))
}

pub(crate) fn timed_out(after: std::time::Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}
