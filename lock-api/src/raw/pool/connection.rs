//! [`Connection`]: one server connection of a pool and the fate of the guards on it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::core::Hold;
use super::driver::SessionDriver;
use crate::raw::session::Session;

/// One server connection. Locks taken on it live as long as it does.
pub(super) struct Connection<D: SessionDriver> {
    /// The pool's id, for its registry.
    pub(super) id: u64,
    /// The server's id (`CONNECTION_ID()`, `pg_backend_pid()`), for interrupts and operators.
    pub(super) server_id: u64,
    /// `None` once closed: its locks are gone.
    pub(super) conn: tokio::sync::Mutex<Option<D::Conn>>,
    dead: AtomicBool,
    /// The fate every guard on this connection shares: ended (lost) when it closes.
    pub(super) guards: Arc<Session>,
    /// Unlocks queued from places that cannot await (a dropped guard); the connection's task
    /// runs them in order.
    unlocks: mpsc::UnboundedSender<(D::Key, Hold)>,
}

impl<D: SessionDriver> Connection<D> {
    pub(super) fn new(
        id: u64,
        server_id: u64,
        conn: D::Conn,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<(D::Key, Hold)>) {
        let (unlocks, queued) = mpsc::unbounded_channel();
        let connection = Arc::new(Self {
            id,
            server_id,
            conn: tokio::sync::Mutex::new(Some(conn)),
            dead: AtomicBool::new(false),
            guards: Arc::default(),
            unlocks,
        });
        (connection, queued)
    }

    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Marks the connection closed; true the first time.
    pub(super) fn mark_dead(&self) -> bool {
        !self.dead.swap(true, Ordering::AcqRel)
    }

    /// Hands `key` to the connection's task for an unlock of what `hold` says (no runtime
    /// needed here).
    pub(super) fn send_unlock(&self, key: D::Key, hold: Hold) {
        let _ = self.unlocks.send((key, hold));
    }
}

impl<D: SessionDriver> fmt::Debug for Connection<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("server_id", &self.server_id)
            .field("dead", &self.is_dead())
            .finish()
    }
}
