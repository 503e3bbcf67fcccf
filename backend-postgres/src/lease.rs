//! `PgLease`: the release of one held advisory lock, on the session that took it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::RawLease;
use dlock_api::{LockError, LockName, LostReason, Result};

use crate::BACKEND;
use crate::client::{Client, Session, unlock_on};
use crate::key::RawKey;

pub(crate) struct PgLease {
    client: Arc<Client>,
    session: Arc<Session>,
    key: RawKey,
    name: LockName,
    /// Set once the lock is released (or known gone); until then, dropping queues an unlock.
    done: AtomicBool,
}

impl PgLease {
    pub(crate) fn new(
        client: Arc<Client>,
        session: Arc<Session>,
        key: RawKey,
        name: LockName,
    ) -> Self {
        Self {
            client,
            session,
            key,
            name,
            done: AtomicBool::new(false),
        }
    }

    fn lost(&self) -> LockError {
        LockError::Lost {
            name: self.name.to_string(),
            reason: LostReason::SessionClosed,
        }
    }
}

#[async_trait]
impl RawLease for PgLease {
    async fn release(&self) -> Result<()> {
        if self.session.is_dead() {
            self.done.store(true, Ordering::Release);
            return Err(self.lost());
        }
        let mut guard = self.session.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            self.done.store(true, Ordering::Release);
            return Err(self.lost());
        };
        let within = self.client.config.command_timeout;
        match unlock_on(conn, self.key, within).await {
            Ok(held) => {
                drop(guard);
                self.client.remove_slot(self.session.id, self.key, false);
                self.done.store(true, Ordering::Release);
                if held {
                    Ok(())
                } else {
                    Err(LockError::NotHeld {
                        name: self.name.to_string(),
                    })
                }
            }
            Err(error) => {
                // Unknown outcome: close the session, which frees the lock for sure (and ends
                // the session's other locks, whose guards fire `lost`).
                self.client
                    .kill(&self.session, &mut guard, "a release failed");
                self.done.store(true, Ordering::Release);
                Err(error)
            }
        }
    }

    async fn extend(&self, _ttl: Duration) -> Result<tokio::time::Instant> {
        Err(LockError::Unsupported {
            backend: BACKEND,
            operation: "extend (a session lock has no lease to extend)",
        })
    }
}

impl Drop for PgLease {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) && !self.session.is_dead() {
            // `forget()`, a guard dropped without a runtime, or a release future dropped midway:
            // the session's task unlocks (owner-checked: it is this session's own lock).
            self.session.queue_unlock(self.key);
        }
    }
}

impl fmt::Debug for PgLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLease")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("session_pid", &self.session.pid)
            .finish_non_exhaustive()
    }
}
