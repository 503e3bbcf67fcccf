//! A client's held keys, whose watches a new connection starts again.
//!
//! The client keeps them (it makes the new connections), and the leases register themselves:
//! the client sees a held key only as something to watch again, so it needs nothing of the
//! lease's own module.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::connection::{Conn, Running};

/// A held key whose watch a new connection starts again.
pub(crate) trait Rewatch: Send + Sync {
    /// Starts the key's watch on `conn`'s runtime, unless it runs on one that has not stopped.
    fn rewatch_on(&self, conn: &Conn);
    /// The key and its create revision, while its guard holds it.
    fn watched_key(&self) -> Option<(String, i64)>;
    /// Someone found the key changed: its guard reads it and decides.
    fn recheck(&self);
}

/// A client's held keys, by address: a lease leaves before it is freed, so no other can share
/// its address meanwhile.
#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    keys: Mutex<HashMap<usize, Weak<dyn Rewatch>>>,
    /// The runtime the periodic check of every held key runs on, once started.
    checking: Running,
}

fn address<T: ?Sized>(held: &T) -> usize {
    std::ptr::from_ref(held).cast::<()>() as usize
}

impl HeldKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Weak<dyn Rewatch>>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert<T: Rewatch + 'static>(&self, held: &Arc<T>) {
        let weak: Weak<dyn Rewatch> = Arc::downgrade(held) as Weak<dyn Rewatch>;
        self.lock().insert(address(&**held), weak);
    }

    pub(crate) fn remove<T: Rewatch>(&self, held: &T) {
        let removed = self.lock().remove(&address(held));
        drop(removed);
    }

    /// Every held key now.
    pub(crate) fn all(&self) -> Vec<Arc<dyn Rewatch>> {
        self.lock().values().filter_map(Weak::upgrade).collect()
    }

    /// Starts `check` on `conn`'s runtime unless it runs on one that has not stopped: the
    /// periodic check of every held key, written by whoever holds them.
    pub(crate) fn check_on<F>(&self, conn: &Conn, check: impl FnOnce() -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.checking.ensure(conn, check);
    }

    /// Starts on `conn` the watch of every held key whose watch ran on a runtime that stopped
    /// (or had not started: the timer that starts it may have stopped with that runtime).
    pub(crate) fn watch_on(&self, conn: &Conn) {
        let held = self.all();
        for key in &held {
            key.rewatch_on(conn);
        }
        // Dropped outside the lock: the last reference's drop takes it.
        drop(held);
    }
}
