//! `ZkLease`: one held node. Release deletes it, guarded by its version; a dropped guard's node
//! is deleted in the background.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_api::raw::RawLease;
use dlock_api::{LockError, LockName, Result};
use tokio::time::Instant;
use zookeeper_client::Error as ZkError;

use crate::BACKEND;
use crate::error::{Fail, timed};
use crate::session::ZkSession;

/// Deletes the node `path` if it still has `version` (ours: nobody else writes to it).
/// `Ok(true)`: deleted; `Ok(false)`: it was not there any more, or the session is over (its
/// ephemeral nodes go with it). A delete whose answer is lost is sent again; `NoNode` then
/// means the first one landed.
pub(crate) async fn delete_node(session: &ZkSession, path: &str, version: i32) -> Result<bool> {
    let Ok(client) = session.client() else {
        return Ok(false);
    };
    let mut resent = false;
    for attempt in 0..3 {
        match timed(session.command_timeout, client.delete(path, Some(version))).await {
            Ok(()) => return Ok(true),
            Err(Fail::Zk(ZkError::NoNode)) => return Ok(resent),
            Err(Fail::Zk(ZkError::BadVersion)) => return Ok(false),
            Err(fail) if fail.session_over() => return Ok(false),
            Err(fail) if fail.outcome_unknown() && attempt < 2 => resent = true,
            Err(fail) => return Err(fail.into()),
        }
    }
    Err(LockError::command_timeout(BACKEND, session.command_timeout))
}

/// A held node.
#[derive(Debug)]
pub(crate) struct ZkLease {
    session: Arc<ZkSession>,
    name: LockName,
    path: String,
    version: i32,
    released: AtomicBool,
}

impl ZkLease {
    pub(crate) fn new(
        session: Arc<ZkSession>,
        name: &LockName,
        path: String,
        version: i32,
    ) -> Self {
        Self {
            session,
            name: name.clone(),
            path,
            version,
            released: AtomicBool::new(false),
        }
    }
}

#[dlock_api::raw::async_trait]
impl RawLease for ZkLease {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        self.session.forget(&self.path);
        match delete_node(&self.session, &self.path, self.version).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::NotHeld {
                name: self.name.to_string(),
            }),
            Err(error) => Err(error),
        }
    }

    /// Refused before any network call: the session is the lease, renewed by its heartbeat.
    async fn extend(&self, _ttl: Duration) -> Result<Instant> {
        Err(LockError::Unsupported {
            backend: BACKEND,
            operation: "extend (the session is the lease)",
        })
    }
}

impl Drop for ZkLease {
    /// A guard forgotten rather than released: its node is deleted in the background, so the
    /// lock is free at once (other guards of the session are untouched).
    fn drop(&mut self) {
        self.session.forget(&self.path);
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (session, path, version) = (self.session.clone(), self.path.clone(), self.version);
        handle.spawn(async move {
            let _ = delete_node(&session, &path, version).await;
        });
    }
}
