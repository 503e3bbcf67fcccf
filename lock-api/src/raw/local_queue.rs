//! [`LocalQueue`]: a client's own FIFO of waiters per name, so only one of them waits at the
//! server (or, for a reader-writer lock, only the readers that would be let in together).

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
///
/// Readers of a reader-writer lock ([`shared_turn`](LocalQueue::shared_turn)) share a turn with
/// the readers next to them in the line: the server lets waiting readers in together, so each
/// must be in the server's queue to be let in with the others, and a reader that asked only
/// after its neighbour's grant could land behind a writer that came later. A writer's turn
/// ([`turn`](LocalQueue::turn)) waits for every reader's turn ahead of it, and a reader that
/// comes after a waiting writer waits behind it here as at the server.
#[derive(Debug, Default)]
pub struct LocalQueue {
    names: Mutex<HashMap<LockName, Arc<tokio::sync::RwLock<()>>>>,
}

/// A place at the head of a [`LocalQueue`] for a name: hold it while waiting at the server; drop
/// it to let the next local waiter ask.
#[derive(Debug)]
pub struct Turn {
    /// Alone at the head: a lock's or a writer's waiter.
    _alone: Option<tokio::sync::OwnedRwLockWriteGuard<()>>,
    /// Beside the other readers at the head.
    _shared: Option<tokio::sync::OwnedRwLockReadGuard<()>>,
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
    /// Cancel safe: a dropped call leaves the queue (tokio's read-write lock is fair and forgets
    /// a dropped waiter).
    pub async fn turn(&self, name: &LockName, deadline: Option<Instant>) -> Option<Turn> {
        let turn = self.slot(name).write_owned();
        let turn = within(deadline, turn).await?;
        Some(Turn {
            _alone: Some(turn),
            _shared: None,
        })
    }

    /// Waits for a reader's turn to wait at the server for `name`: together with the readers
    /// ahead of it up to the first writer's (or lock's) turn, in arrival order, until `deadline`
    /// (`None` when it passes first).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`turn`](Self::turn).
    pub async fn shared_turn(&self, name: &LockName, deadline: Option<Instant>) -> Option<Turn> {
        let turn = self.slot(name).read_owned();
        let turn = within(deadline, turn).await?;
        Some(Turn {
            _alone: None,
            _shared: Some(turn),
        })
    }

    /// The line of `name`.
    fn slot(&self, name: &LockName) -> Arc<tokio::sync::RwLock<()>> {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        // Forget names nobody waits for any more, so the map does not grow with every name.
        names.retain(|_, slot| Arc::strong_count(slot) > 1);
        names.entry(name.clone()).or_default().clone()
    }
}

/// `wait`'s outcome, unless `deadline` passes first.
async fn within<T>(deadline: Option<Instant>, wait: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => timeout_at(deadline, wait).await.ok(),
        None => Some(wait.await),
    }
}
