//! Refusing a pooler that shares server sessions between clients (PgBouncer in `transaction` or
//! `statement` mode, and the like), at connect.
//!
//! A session advisory lock belongs to the server session that took it. A pooler in transaction
//! mode hands each transaction whichever server connection is free, so the lock stays with a
//! server connection that other clients then use: their `pg_try_advisory_lock` of the same key
//! *stacks* on it and succeeds (two holders), and our `pg_advisory_unlock` may run on a session
//! that does not hold it. Nothing in the protocol says a pooler is there, so `connect` looks at
//! what a pooler changes: which server session answers.
//!
//! Two of our connections each read `pg_backend_pid()`; the second inside an open transaction,
//! which pins a server session for it, then the first reads again. On a direct connection (or a
//! pool in session mode) each connection has its own backend for life, so the two differ and the
//! first does not change. A transaction pooler with an idle server connection hands the freshly
//! released one to the next transaction (PgBouncer reuses the most recently used), so the
//! second connection gets the first's backend, or the first gets a new one. A busy pooler may
//! happen to hand out different, stable backends and pass this check: it is a safety net, not a
//! licence; the docs say to use session mode.
//!
//! The probe sends plain strings, which sqlx runs with the simple query protocol: a transaction
//! pooler of PgBouncer 1.18's kind does not carry named prepared statements across
//! transactions, so the probe itself must not need them.

use std::time::Duration;

use dlock_api::Result;
use sqlx::{Executor, PgConnection, Row};
use tokio::time::timeout;

use crate::config::config_error;
use crate::error::{map_err, timed_out};

/// What the probe saw, for the error message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Backends {
    first: i32,
    second_in_transaction: i32,
    first_again: i32,
}

impl Backends {
    /// Whether each connection kept a server session of its own.
    pub(crate) fn are_own_sessions(&self) -> bool {
        self.second_in_transaction != self.first && self.first_again == self.first
    }
}

async fn backend_pid(conn: &mut PgConnection) -> Result<i32> {
    let row = conn
        .fetch_one("SELECT pg_backend_pid()")
        .await
        .map_err(map_err)?;
    row.try_get(0).map_err(map_err)
}

async fn probe(first: &mut PgConnection, second: &mut PgConnection) -> Result<Backends> {
    let pid = backend_pid(first).await?;
    second.execute("BEGIN").await.map_err(map_err)?;
    let pinned = backend_pid(second).await;
    let again = backend_pid(first).await;
    // Ends the pin whatever the reads did; the connection is dropped after the probe anyway.
    let _ = second.execute("ROLLBACK").await;
    Ok(Backends {
        first: pid,
        second_in_transaction: pinned?,
        first_again: again?,
    })
}

/// Checks that `first` and `second` (two fresh connections of one client) each keep a server
/// session of their own; a [`Config`](dlock_api::LockError::Config) error names the pooler
/// otherwise.
pub(crate) async fn ensure_own_sessions(
    first: &mut PgConnection,
    second: &mut PgConnection,
    within: Duration,
) -> Result<()> {
    let seen = timeout(within, probe(first, second))
        .await
        .map_err(|_| timed_out(within))??;
    if seen.are_own_sessions() {
        return Ok(());
    }
    Err(config_error(format!(
        "the server sessions behind this client's connections change between transactions \
         ({seen:?}): a pooler in transaction or statement mode (such as PgBouncer with \
         pool_mode=transaction) sits in front of Postgres, and session advisory locks are not \
         safe there (a lock stays on a server connection that other clients then use). Connect \
         to Postgres directly or through a pool in session mode; for a lock inside one \
         transaction, xact_lock and RowLock work in any mode"
    )))
}

#[cfg(test)]
mod tests {
    use super::Backends;

    #[test]
    fn own_sessions_are_stable_and_distinct() {
        let direct = Backends {
            first: 10,
            second_in_transaction: 11,
            first_again: 10,
        };
        assert!(direct.are_own_sessions());
        let shared = Backends {
            first: 10,
            second_in_transaction: 10,
            first_again: 12,
        };
        assert!(!shared.are_own_sessions());
        let moved = Backends {
            first: 10,
            second_in_transaction: 11,
            first_again: 12,
        };
        assert!(!moved.are_own_sessions());
    }
}
