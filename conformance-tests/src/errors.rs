//! Checks on the errors a backend returns, for the backend's own tests.

use dlock_api::{LockError, Result};

/// The reason of the [`LockError::Config`] in `result`; panics naming what came instead. For
/// tests that a bad configuration (an unreadable certificate file, an untrusted server) is
/// reported as one, with a reason that says what is wrong.
///
/// # Panics
/// When `result` is a success or another error.
pub fn config_reason<T>(result: Result<T>) -> String {
    match result {
        Err(LockError::Config { reason, .. }) => reason,
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(_) => panic!("expected a configuration error, got a success"),
    }
}
