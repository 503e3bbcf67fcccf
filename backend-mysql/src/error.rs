//! Driver errors as `LockError`s: unreachable, slow or cut off is `Unavailable` (retryable), the
//! rest `Backend`. Also tells which errors leave a connection unusable.

use std::time::Duration;

use dlock_api::LockError;
use sqlx::mysql::MySqlDatabaseError;

use crate::BACKEND;

/// Server error numbers that mean the connection is (being) closed, or the server is going away.
const CONNECTION_GONE: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1077, // ER_NORMAL_SHUTDOWN
    1152, // ER_ABORTING_CONNECTION
    1158, 1159, 1160, 1161, // network read/write errors and timeouts
    1927, // ER_CONNECTION_KILLED (MariaDB)
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
    4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8: wait_timeout reached)
];

/// Server error numbers worth retrying on a live connection.
const TRANSIENT: &[u16] = &[
    1205, // ER_LOCK_WAIT_TIMEOUT
    1213, // ER_LOCK_DEADLOCK
    1317, // ER_QUERY_INTERRUPTED (KILL QUERY)
    1969, // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
    3024, // ER_QUERY_TIMEOUT (MySQL max_execution_time)
];

/// The server error number of `error`, if it is a server error.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Whether `error` leaves the connection unusable (its locks are then gone, or going).
pub(crate) fn is_connection_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolClosed
        | sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(_) => {
            error_number(error).is_some_and(|n| CONNECTION_GONE.contains(&n))
        }
        _ => false,
    }
}

/// The one place driver errors become `LockError`s.
pub(crate) fn map_err(error: sqlx::Error) -> LockError {
    let transient = error_number(&error).is_some_and(|n| TRANSIENT.contains(&n));
    if is_connection_error(&error) || transient {
        LockError::unavailable(BACKEND, error)
    } else {
        LockError::backend(BACKEND, error)
    }
}

pub(crate) fn timed_out(after: Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}
