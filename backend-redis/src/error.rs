//! Redis errors as `LockError`s: unreachable or slow is `Unavailable` (retryable), the rest `Backend`.

use dlock_api::LockError;
use redis::RedisError;

use crate::BACKEND;

pub(crate) fn map_err(error: RedisError) -> LockError {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_cluster_error()
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
