//! The cleanup work dlock runs in the background, and [`settle`], which waits for it.
//!
//! A dropped guard releases its lock in a spawned task, and a cancelled acquire undoes what
//! it started the same way: async drop does not exist. A tokio runtime drops its unfinished
//! tasks when it shuts down, so a program whose `main` returns right after dropping a guard
//! would leave that lock to its lease. Every such task is counted here, so that
//! `settle().await` before `main` returns lets them finish.

use std::future::Future;
use std::sync::OnceLock;

use tokio_util::task::TaskTracker;

/// Every background cleanup of the process. Closed from the start: a closed tracker still
/// tracks new tasks, and only a closed one lets `wait` return once it is empty.
fn tracker() -> &'static TaskTracker {
    static TRACKER: OnceLock<TaskTracker> = OnceLock::new();
    TRACKER.get_or_init(|| {
        let tracker = TaskTracker::new();
        tracker.close();
        tracker
    })
}

/// Runs `cleanup` to completion on the current tokio runtime, counted by [`settle`]: for work
/// that undoes or releases a lock after its caller went away (a dropped guard, a cancelled
/// acquire, an interrupted statement).
///
/// Returns `false`, dropping `cleanup` unrun, outside a tokio runtime; the caller decides what
/// to log, as the lock then ends with its lease or session.
pub fn spawn_cleanup<F>(cleanup: F) -> bool
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            tracker().spawn_on(cleanup, &runtime);
            true
        }
        Err(_) => false,
    }
}

/// Waits until every release and cleanup that dlock started in the background has finished:
/// the releases of guards dropped without [`release`](crate::LockGuard::release), and the
/// undoing of acquires that were cancelled or timed out.
///
/// Call it before a program's `main` returns (or before its runtime shuts down), as
/// [`sqlx::Pool::close`](https://docs.rs/sqlx/latest/sqlx/struct.Pool.html#method.close) is called:
/// a runtime drops its unfinished tasks, and a lock whose release was dropped stays held until
/// its lease or session ends. It covers every client in the process, on every runtime.
///
/// ```
/// # async fn demo(locks: std::sync::Arc<dyn dlock_api::DistributedLock>) -> dlock_api::Result<()> {
/// use dlock_api::DistributedLockExt;
/// let guard = locks.acquire_str("report", &dlock_api::LockOptions::new()).await?;
/// drop(guard); // released in the background
/// dlock_api::settle().await; // …and now released
/// # Ok(()) }
/// ```
///
/// Each cleanup is bounded by its backend's command timeout, so `settle` returns once the
/// servers answered or those timeouts passed; wrap it in `tokio::time::timeout` to bound it
/// further. Guards still held are not waited for, and neither are their renewals.
///
/// # Cancel safety
/// Cancel safe: it only observes; the cleanups go on without it.
pub async fn settle() {
    tracker().wait().await;
}
