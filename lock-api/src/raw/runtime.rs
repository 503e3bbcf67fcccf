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
use std::sync::{Arc, Mutex, RwLock, Weak};

use tokio::runtime::{Handle, Id};

/// The life of one tokio runtime: [`has_stopped`](Self::has_stopped) turns true when it shuts
/// down. Cheap to clone and to ask (one atomic load).
#[derive(Clone)]
pub struct RuntimeLife {
    life: Arc<Life>,
}

#[derive(Default)]
struct Life {
    stopped: AtomicBool,
    /// Run once when the runtime shuts down, on the thread that shuts it down.
    on_stop: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl Life {
    fn has_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

impl RuntimeLife {
    /// The life of the runtime this is called on; `None` outside a tokio runtime.
    ///
    /// The first call on a runtime spawns one task there that never wakes: the runtime drops it
    /// when it shuts down, which marks the life stopped. Later calls on the same runtime share it.
    pub fn current() -> Option<Self> {
        let runtime = Handle::try_current().ok()?;
        Some(Self::of(&runtime))
    }

    fn of(runtime: &Handle) -> Self {
        let id = runtime.id();
        let mut lives = lives().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(life) = lives.get(&id).and_then(Weak::upgrade)
            && !life.has_stopped()
        {
            return Self { life };
        }
        // Runtimes that stopped are forgotten here, so the map holds only running ones.
        lives.retain(|_, life| life.upgrade().is_some_and(|l| !l.has_stopped()));
        let life = Arc::new(Life::default());
        lives.insert(id, Arc::downgrade(&life));
        drop(lives);
        let marker = MarkOnDrop(life.clone());
        // A runtime that is shutting down drops the task at once, which marks it stopped.
        runtime.spawn(async move {
            let _marker = marker;
            std::future::pending::<()>().await;
        });
        Self { life }
    }

    /// Whether the runtime has shut down: the tasks it ran are gone.
    pub fn has_stopped(&self) -> bool {
        self.life.has_stopped()
    }

    /// Whether `other` is the life of the same runtime run.
    pub fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.life, &other.life)
    }

    /// Runs `stopped` when the runtime shuts down (at once if it has), on the thread that shuts
    /// it down: it should only flag or notify, as a waker does. For work that lived on the
    /// runtime and must be told it is gone, say subscriptions made on a connection it drove.
    pub fn on_stop(&self, stopped: impl FnOnce() + Send + 'static) {
        let mut on_stop = self.life.on_stop.lock().unwrap_or_else(|e| e.into_inner());
        if self.has_stopped() {
            drop(on_stop);
            stopped();
        } else {
            on_stop.push(Box::new(stopped));
        }
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
fn lives() -> &'static Mutex<HashMap<Id, Weak<Life>>> {
    static LIVES: std::sync::OnceLock<Mutex<HashMap<Id, Weak<Life>>>> = std::sync::OnceLock::new();
    LIVES.get_or_init(Mutex::default)
}

struct MarkOnDrop(Arc<Life>);

impl Drop for MarkOnDrop {
    fn drop(&mut self) {
        // Marked under the lock `on_stop` checks under, so no hook is left behind unrun.
        let hooks = {
            let mut on_stop = self.0.on_stop.lock().unwrap_or_else(|e| e.into_inner());
            self.0.stopped.store(true, Ordering::Release);
            std::mem::take(&mut *on_stop)
        };
        hooks.into_iter().for_each(|stopped| stopped());
    }
}

/// One value per running tokio runtime, made by the first call on each: the connections of a
/// client shared by runtimes that run at the same time (the `#[tokio::test]`s cargo runs in
/// parallel, one runtime each, sharing a `static` client). A connection is driven by tasks of
/// the runtime it was made on, so work of another runtime must not lean on it: when its
/// runtime ends, its commands in flight would fail, and locks held on its server session
/// would be lost, under callers whose own runtime runs on. Values of runtimes that stopped are
/// dropped when a new runtime comes.
pub struct PerRuntime<T> {
    values: RwLock<Vec<(Id, RuntimeLife, T)>>,
}

impl<T> Default for PerRuntime<T> {
    fn default() -> Self {
        Self {
            values: RwLock::new(Vec::new()),
        }
    }
}

impl<T: Clone> PerRuntime<T> {
    /// No values yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of the runtime this is called on, if it has one; `None` outside a runtime.
    pub fn current(&self) -> Option<T> {
        let id = Handle::try_current().ok()?.id();
        self.of(id)
    }

    fn of(&self, id: Id) -> Option<T> {
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        running_value(&values, id).cloned()
    }

    /// The value of the runtime this is called on, made with `make` if it has none; `None`
    /// outside a runtime.
    pub fn get_or_make(&self, make: impl FnOnce(&RuntimeLife) -> T) -> Option<T> {
        let runtime = Handle::try_current().ok()?;
        if let Some(value) = self.of(runtime.id()) {
            return Some(value);
        }
        let life = RuntimeLife::of(&runtime);
        let mut values = self.values.write().unwrap_or_else(|e| e.into_inner());
        if let Some(value) = running_value(&values, runtime.id()) {
            return Some(value.clone());
        }
        values.retain(|(_, life, _)| !life.has_stopped());
        let value = make(&life);
        values.push((runtime.id(), life, value.clone()));
        Some(value)
    }

    /// Sets the value of the runtime this is called on (replacing its last one) and returns
    /// that runtime's life; nothing outside a runtime.
    pub fn set_current(&self, value: T) -> Option<RuntimeLife> {
        let runtime = Handle::try_current().ok()?;
        let life = RuntimeLife::of(&runtime);
        let mut values = self.values.write().unwrap_or_else(|e| e.into_inner());
        values.retain(|(of, life, _)| *of != runtime.id() && !life.has_stopped());
        values.push((runtime.id(), life.clone(), value));
        Some(life)
    }

    /// Forgets the value of the runtime this is called on, so that the next
    /// [`get_or_make`](Self::get_or_make) makes a new one (a connection its driver will not
    /// repair); nothing outside a runtime.
    pub fn forget_current(&self) {
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        let mut values = self.values.write().unwrap_or_else(|e| e.into_inner());
        values.retain(|(of, life, _)| *of != runtime.id() && !life.has_stopped());
    }

    /// The values of the runtimes that still run.
    pub fn running(&self) -> Vec<T> {
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        values
            .iter()
            .filter(|(_, life, _)| !life.has_stopped())
            .map(|(_, _, value)| value.clone())
            .collect()
    }
}

/// The value of runtime `id`, if it has one and still runs.
fn running_value<T>(values: &[(Id, RuntimeLife, T)], id: Id) -> Option<&T> {
    values
        .iter()
        .find(|(of, life, _)| *of == id && !life.has_stopped())
        .map(|(_, _, value)| value)
}

impl<T> fmt::Debug for PerRuntime<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("PerRuntime")
            .field("runtimes", &values.len())
            .finish_non_exhaustive()
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

    #[test]
    fn stop_hooks_run_once_when_the_runtime_ends_or_at_once_after() {
        use std::sync::atomic::AtomicUsize;
        let ran = Arc::new(AtomicUsize::new(0));
        let first = runtime();
        let life = first
            .block_on(async { RuntimeLife::current() })
            .expect("in a runtime");
        let counted = ran.clone();
        life.on_stop(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        drop(first);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let counted = ran.clone();
        life.on_stop(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn each_running_runtime_has_a_value_of_its_own() {
        let values = PerRuntime::new();
        let (first, second) = (runtime(), runtime());
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = |_: &RuntimeLife| made.fetch_add(1, Ordering::SeqCst);
        assert_eq!(first.block_on(async { values.get_or_make(make) }), Some(0));
        assert_eq!(second.block_on(async { values.get_or_make(make) }), Some(1));
        assert_eq!(first.block_on(async { values.get_or_make(make) }), Some(0));
        assert_eq!(second.block_on(async { values.current() }), Some(1));
        assert_eq!(values.running().len(), 2);
        drop(first);
        assert_eq!(values.running(), vec![1]);
        assert_eq!(values.current(), None, "outside a runtime");
        let third = runtime();
        assert_eq!(third.block_on(async { values.current() }), None);
        third.block_on(async { values.set_current(7) });
        assert_eq!(third.block_on(async { values.get_or_make(make) }), Some(7));
    }
}
