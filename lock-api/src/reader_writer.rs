//! What reader-writer locks share across backends: the refusal of a backend without them.
//!
//! A reader-writer lock is not a second kind of lock: its writer is the name's lock, and a
//! reader asks the same grant path for a shared hold
//! ([`LockOptions::is_shared`](crate::LockOptions::is_shared)), so deadlines, cancellation,
//! renewal and loss are the lock's own.

use crate::error::LockError;

/// [`LockError::Unsupported`] for a reader's call on a backend without reader-writer locks.
pub(crate) fn unsupported(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        operation: "reader-writer locks",
    }
}
