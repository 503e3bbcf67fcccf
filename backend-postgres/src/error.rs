//! sqlx errors as `LockError`s: unreachable or slow is `Unavailable` (retryable), the rest `Backend`.

use dlock_api::LockError;

use crate::BACKEND;

/// SQLSTATE `55P03` lock_not_available: `NOWAIT` found the lock taken, or `lock_timeout` fired.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE `57014` query_canceled: a cancel request (ours) or `statement_timeout`.
pub(crate) const QUERY_CANCELED: &str = "57014";

/// The SQLSTATE of a database error, if `error` is one.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
}

/// Whether `error` means the connection itself is gone or unusable (its session, and so its
/// locks, are lost).
pub(crate) fn is_connection_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => sqlstate(error).is_some_and(|code| {
            // 08: connection exception; 57P01..03: admin shutdown, crash shutdown, cannot connect
            // now (pg_terminate_backend, server stopping or starting); 53300: too many connections.
            code.starts_with("08") || matches!(code.as_str(), "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

/// SQLSTATEs of a statement the server rolled back for a passing reason, worth sending again on
/// the same live connection: deadlock_detected (the statement was a deadlock's victim),
/// serialization_failure, and lock_not_available (`lock_timeout` fired on a row lock: a
/// connection that waited for a lock keeps that wait's `lock_timeout`).
const TRANSIENT: [&str; 3] = ["40P01", "40001", LOCK_NOT_AVAILABLE];

/// The one mapping from sqlx to dlock errors: a broken connection or a transient rollback is
/// [`LockError::Unavailable`] (retryable), anything else [`LockError::Backend`].
pub(crate) fn map_err(error: sqlx::Error) -> LockError {
    let transient = sqlstate(&error).is_some_and(|code| TRANSIENT.contains(&code.as_str()));
    if is_connection_error(&error) || transient {
        LockError::unavailable(BACKEND, error)
    } else {
        LockError::backend(BACKEND, error)
    }
}

/// A statement that did not answer within the configured command timeout.
pub(crate) fn timed_out(after: std::time::Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}
