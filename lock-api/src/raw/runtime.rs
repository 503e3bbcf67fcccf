//! [`RuntimeLife`]: whether the tokio runtime a connection's tasks run on is still running.
//!
//! A driver connection lives partly in tasks of the runtime it was opened on: redis-rs and
//! tonic run a task that reads and writes the socket, a ZooKeeper client its session, and a
//! socket is registered with that runtime's I/O driver. When the runtime shuts down (the end
//! of a `#[tokio::test]`, a runtime built for one job), those tasks are dropped with it, while
//! the client that owns the connection may live on (in a `static`, shared by every test). Its
//! next call, on another runtime, would then fail, or wait for an answer nobody reads.
//!
//! A backend takes the [`RuntimeLife`] of the runtime it connects on and, before using the
//! connection, asks whether that runtime [has stopped](RuntimeLife::has_stopped): if so it
//! connects again on the runtime that calls. Locks that lived on the old connection's server
//! session are gone with it, and their guards are told so (lost); locks kept by the server for
//! an owner value or a lease go on under the new connection.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::{Handle, Id};

/// The life of one tokio runtime: [`has_stopped`](Self::has_stopped) turns true when it shuts
/// down. Cheap to clone and to ask (one atomic load).
#[derive(Clone)]
pub struct RuntimeLife {
    stopped: Arc<AtomicBool>,
}

impl RuntimeLife {
    /// The life of the runtime this is called on; `None` outside a tokio runtime.
    ///
    /// The first call on a runtime spawns one task there that never wakes: the runtime drops it
    /// when it shuts down, which marks the life stopped. Later calls on the same runtime share it.
    pub fn current() -> Option<Self> {
        let runtime = Handle::try_current().ok()?;
        let id = runtime.id();
        let mut lives = lives().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stopped) = lives.get(&id).and_then(Weak::upgrade)
            && !stopped.load(Ordering::Acquire)
        {
            return Some(Self { stopped });
        }
        // Runtimes that stopped are forgotten here, so the map holds only running ones.
        lives.retain(|_, life| life.upgrade().is_some_and(|s| !s.load(Ordering::Acquire)));
        let stopped = Arc::new(AtomicBool::new(false));
        lives.insert(id, Arc::downgrade(&stopped));
        drop(lives);
        let marker = MarkOnDrop(stopped.clone());
        // A runtime that is shutting down drops the task at once, which marks it stopped.
        runtime.spawn(async move {
            let _marker = marker;
            std::future::pending::<()>().await;
        });
        Some(Self { stopped })
    }

    /// Whether the runtime has shut down: the tasks it ran are gone.
    pub fn has_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Whether `other` is the life of the same runtime run.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.stopped, &other.stopped)
    }
}

impl fmt::Debug for RuntimeLife {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeLife")
            .field("stopped", &self.has_stopped())
            .finish()
    }
}

/// The running runtimes, by id: the one task per runtime that marks its end.
fn lives() -> &'static Mutex<HashMap<Id, Weak<AtomicBool>>> {
    static LIVES: std::sync::OnceLock<Mutex<HashMap<Id, Weak<AtomicBool>>>> =
        std::sync::OnceLock::new();
    LIVES.get_or_init(Mutex::default)
}

struct MarkOnDrop(Arc<AtomicBool>);

impl Drop for MarkOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn outside_a_runtime_there_is_none() {
        assert!(RuntimeLife::current().is_none());
    }

    #[test]
    fn a_life_stops_when_its_runtime_shuts_down_and_not_before() {
        let first = runtime();
        let life = first
            .block_on(async { RuntimeLife::current() })
            .expect("in a runtime");
        let again = first
            .block_on(async { RuntimeLife::current() })
            .expect("in a runtime");
        assert!(life.same_as(&again), "one life per runtime");
        assert!(!life.has_stopped());
        drop(first);
        assert!(life.has_stopped() && again.has_stopped());

        let second = runtime();
        let next = second
            .block_on(async { RuntimeLife::current() })
            .expect("in a runtime");
        assert!(!next.has_stopped() && !next.same_as(&life));
        second.shutdown_background();
        assert!(next.has_stopped());
    }

    #[test]
    fn a_multi_thread_runtime_is_told_apart_from_its_successor() {
        let first = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let life = first
            .block_on(async { RuntimeLife::current() })
            .expect("in a runtime");
        drop(first);
        assert!(life.has_stopped());
    }
}
