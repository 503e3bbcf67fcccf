//! [`PoolLease`]: one lock held on one pool connection, released on that connection.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, timeout};

use super::connection::Connection;
use super::core::{Hold, PoolCore};
use super::driver::SessionDriver;
use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::raw::detach::Detach;
use crate::raw::lease::RawLease;
use crate::raw::state::LeaseState;
use crate::status::LostReason;
use crate::token::FencingToken;

pub(super) struct PoolLease<D: SessionDriver> {
    core: Arc<PoolCore<D>>,
    conn: Arc<Connection<D>>,
    key: D::Key,
    hold: Hold,
    name: LockName,
    state: Arc<LeaseState>,
    /// Set once the lock is released (or known gone); until then, dropping queues an unlock.
    done: AtomicBool,
    /// Set once a proclaim was sent: the release then clears the leader's record too.
    proclaimed: AtomicBool,
    /// The record the grant's own statement wrote (term, value), which the campaign's first
    /// proclaim finds there instead of writing it again.
    written_at_grant: crate::raw::RecordAtGrant,
}

impl<D: SessionDriver> PoolLease<D> {
    pub(super) fn new(
        core: Arc<PoolCore<D>>,
        conn: Arc<Connection<D>>,
        key: D::Key,
        hold: Hold,
        name: LockName,
        state: Arc<LeaseState>,
    ) -> Self {
        Self {
            core,
            conn,
            key,
            hold,
            name,
            state,
            done: AtomicBool::new(false),
            proclaimed: AtomicBool::new(false),
            written_at_grant: crate::raw::RecordAtGrant::default(),
        }
    }

    /// This lease, whose grant wrote the leader's record `value` with the term `term`: its
    /// release clears the record, and a first proclaim of the same term and value is done.
    pub(super) fn with_record(self, term: u64, value: Arc<[u8]>) -> Self {
        self.proclaimed.store(true, Ordering::Release);
        self.written_at_grant.wrote(term, value);
        self
    }

    /// What the release undoes: the grant, and the leader's record once one may be written.
    fn hold_now(&self) -> Hold {
        Hold {
            leader: self.proclaimed.load(Ordering::Acquire),
            ..self.hold
        }
    }

    fn lost(&self) -> LockError {
        self.state.mark_lost(LostReason::SessionClosed);
        LockError::Lost {
            name: self.name.to_string(),
            reason: self
                .state
                .lost_reason()
                .unwrap_or(LostReason::SessionClosed),
        }
    }
}

#[async_trait]
impl<D: SessionDriver> RawLease for PoolLease<D> {
    /// The unlock on the lease's own connection. The guard runs it to completion (in a
    /// `Detach`), so the registry update after the reply is never skipped.
    async fn release(&self) -> Result<()> {
        if self.done.swap(true, Ordering::AcqRel) {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        if self.conn.is_dead() {
            return Err(self.lost());
        }
        let _load = self.core.unlocking(&self.conn);
        let mut guard = self.conn.conn.lock().await;
        let Some(c) = guard.as_mut() else {
            return Err(self.lost());
        };
        let limit = self.core.config.command_timeout;
        let outcome = timeout(limit, self.core.unlock_on(c, &self.key, self.hold_now())).await;
        match self.core.settle(&self.conn, &mut guard, limit, outcome) {
            Ok(held) => {
                drop(guard);
                self.core.forget(&self.conn, &self.key);
                if held {
                    Ok(())
                } else {
                    self.state.mark_lost(LostReason::TakenOver);
                    Err(LockError::NotHeld {
                        name: self.name.to_string(),
                    })
                }
            }
            // The connection broke: the server frees its locks when it notices.
            Err(failure) if failure.broken => Err(self.lost()),
            Err(failure) => {
                // Unknown outcome: closing the connection frees the lock for sure (and ends the
                // connection's other locks, whose guards learn it).
                self.core.close(&self.conn, &mut guard, "a release failed");
                Err(failure.error)
            }
        }
    }

    /// The driver's owner-checked write of the leader's record, on the lease's own connection
    /// (the one that holds the key, which is what the server checks). It runs to completion in
    /// a `Detach`, so a dropped proclaim never leaves the connection mid-statement; a broken
    /// connection loses the lease as it does for a release.
    async fn proclaim(&self, term: FencingToken, value: &[u8]) -> Result<()> {
        if self.done.load(Ordering::Acquire) {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        if self.conn.is_dead() {
            return Err(self.lost());
        }
        if self.written_at_grant.answers(term, value) {
            return Ok(());
        }
        // Before the statement: were its reply lost, the record may be there all the same.
        self.proclaimed.store(true, Ordering::Release);
        let (core, conn) = (self.core.clone(), self.conn.clone());
        let (name, key, value) = (self.name.clone(), self.key.clone(), value.to_vec());
        let written = Detach::new(async move {
            // Counted as load, so that attempts go elsewhere instead of queueing behind it.
            let _load = core.unlocking(&conn);
            let mut guard = conn.conn.lock().await;
            let Some(c) = guard.as_mut() else {
                return Err(None);
            };
            let limit = core.config.command_timeout;
            let write = core.driver.proclaim(c, &name, &key, term.get(), &value);
            let outcome = timeout(limit, write).await;
            core.settle(&conn, &mut guard, limit, outcome).map_err(Some)
        })
        .await;
        match written {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::NotHeld {
                name: self.name.to_string(),
            }),
            // The connection is gone, and the lock with it.
            Err(None) => Err(self.lost()),
            Err(Some(failure)) if failure.broken => Err(self.lost()),
            // The statement failed on a live connection: the lock is still held, and the
            // leadership with it; the caller may proclaim again.
            Err(Some(failure)) => Err(failure.error),
        }
    }

    async fn extend(&self, _ttl: Duration) -> Result<Instant> {
        Err(LockError::Unsupported {
            backend: self.core.driver.backend(),
            operation: "extend (the lease is the connection)",
        })
    }
}

impl<D: SessionDriver> Drop for PoolLease<D> {
    /// A lease dropped without release (`forget()`, a guard dropped outside a runtime): the
    /// connection's task unlocks it (owner-checked: it is this connection's own lock).
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) && !self.conn.is_dead() {
            self.core
                .queue_unlock(&self.conn, self.key.clone(), self.hold_now());
        }
    }
}

impl<D: SessionDriver> fmt::Debug for PoolLease<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolLease")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("connection", &self.conn.server_id)
            .finish_non_exhaustive()
    }
}
