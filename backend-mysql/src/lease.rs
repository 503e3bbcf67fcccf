//! `MySqlLease`: the release of one held lock, on the connection that took it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::{LeaseState, RawLease};
use dlock_api::{LockError, LockName, LostReason, Result};

use crate::BACKEND;
use crate::session::{Inner, Session};
use crate::sql::{Cmd, Reply};

pub(crate) struct MySqlLease {
    inner: Arc<Inner>,
    session: Arc<Session>,
    name: LockName,
    key: Arc<str>,
    state: Arc<LeaseState>,
    released: AtomicBool,
}

impl MySqlLease {
    pub(crate) fn new(
        inner: Arc<Inner>,
        session: Arc<Session>,
        name: LockName,
        key: Arc<str>,
        state: Arc<LeaseState>,
    ) -> Self {
        Self {
            inner,
            session,
            name,
            key,
            state,
            released: AtomicBool::new(false),
        }
    }

    fn lost(&self) -> LockError {
        LockError::Lost {
            name: self.name.to_string(),
            reason: self
                .state
                .lost_reason()
                .unwrap_or(LostReason::SessionClosed),
        }
    }

    /// `RELEASE_LOCK` on the lease's own connection, handling 1, 0 and NULL. The guard runs it to
    /// completion (in a `Detach`), so the registry update after the reply is never skipped.
    async fn release_once(&self) -> Result<()> {
        if self.session.is_dead() {
            self.state.mark_lost(LostReason::SessionClosed);
            return Err(self.lost());
        }
        let cmd = Cmd::Release {
            key: self.key.clone(),
        };
        let reply = self
            .inner
            .call(&self.session, cmd, self.inner.config.command_timeout)
            .await;
        match reply {
            Ok(Reply::Released(Some(1))) => {
                self.inner.forget_key(&self.session, &self.key);
                Ok(())
            }
            // 0: another connection holds it; NULL: nobody does. Either way not ours (any more).
            Ok(Reply::Released(_)) => {
                self.inner.forget_key(&self.session, &self.key);
                self.state.mark_lost(LostReason::TakenOver);
                Err(LockError::NotHeld {
                    name: self.name.to_string(),
                })
            }
            Ok(other) => Err(LockError::unexpected(
                BACKEND,
                format!("RELEASE_LOCK returned {other:?}"),
            )),
            Err(_) if self.session.is_dead() => {
                // The connection broke: the server frees its locks when it notices.
                self.state.mark_lost(LostReason::SessionClosed);
                Err(self.lost())
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl RawLease for MySqlLease {
    async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        self.release_once().await
    }

    async fn extend(&self, _ttl: Duration) -> Result<tokio::time::Instant> {
        Err(LockError::Unsupported {
            backend: BACKEND,
            operation: "extend (the lease is the connection)",
        })
    }
}

impl Drop for MySqlLease {
    /// A lease dropped without release (a forgotten guard, or a guard dropped outside a runtime):
    /// release on its connection in the background, or, with no runtime, close that connection's
    /// hold by marking the session for the keepalive to clean up.
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::AcqRel) || self.session.is_dead() {
            return;
        }
        let (inner, session, key) = (self.inner.clone(), self.session.clone(), self.key.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let cmd = Cmd::Release { key: key.clone() };
                    let limit = inner.config.command_timeout;
                    match inner.call(&session, cmd, limit).await {
                        Ok(_) => inner.forget_key(&session, &key),
                        Err(error) => {
                            tracing::warn!(%key, %error, "mysql: background release failed; the lock ends with its connection");
                        }
                    }
                });
            }
            Err(_) => {
                tracing::warn!(%key, "mysql: lease dropped outside a tokio runtime; the lock ends with its connection");
            }
        }
    }
}

impl fmt::Debug for MySqlLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLease")
            .field("key", &self.key)
            .field("connection", &self.session.server_id())
            .finish_non_exhaustive()
    }
}
