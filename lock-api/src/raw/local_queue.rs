//! [`LocalQueue`]: a client's own FIFO of waiters per name, so only one of them waits at the
//! server.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};

use tokio::time::{Instant, timeout_at};

use crate::name::LockName;

/// Waiters of one client for the same name, in arrival order: only the first waits at the server;
/// the others wait here and step up in turn.
///
/// A backend whose server-side wait costs a connection each (MySQL `GET_LOCK`, Postgres
/// `pg_advisory_lock`) would otherwise give every waiting task a connection of its own, and
/// under a flood (thousands of tasks over a few dozen names) run out of them and time out
/// acquires the server could have served. The server still decides every grant and every fencing
/// token: the turn only says which local task asks next; a lock never passes from one local task
/// to another without the server.
#[derive(Debug, Default)]
pub struct LocalQueue {
    names: Mutex<HashMap<LockName, Arc<tokio::sync::Mutex<()>>>>,
}

/// The first place in a [`LocalQueue`] for a name: hold it while waiting at the server; drop it to
/// let the next local waiter ask.
#[derive(Debug)]
pub struct Turn {
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl LocalQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits for this task's turn to wait at the server for `name`, in arrival order, until
    /// `deadline` (`None` when it passes first).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves the queue (tokio's mutex is fair and forgets a dropped
    /// waiter).
    pub async fn turn(&self, name: &LockName, deadline: Option<Instant>) -> Option<Turn> {
        let slot = {
            let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            // Forget names nobody waits for any more, so the map does not grow with every name.
            names.retain(|_, slot| Arc::strong_count(slot) > 1);
            names.entry(name.clone()).or_default().clone()
        };
        let turn = slot.lock_owned();
        let turn = match deadline {
            Some(deadline) => timeout_at(deadline, turn).await.ok()?,
            None => turn.await,
        };
        Some(Turn { _turn: turn })
    }
}
