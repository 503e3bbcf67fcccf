use std::fmt;

/// A drop guard for the window in which an acquire request may have granted the lock but no
/// [`LockGuard`](crate::LockGuard) exists yet.
///
/// Arm it *before* sending the request that could grant ownership; disarm it when the guard is
/// returned. If the acquire future is dropped in between (a `select!`, a timeout), the cleanup runs:
/// typically it spawns an owner-checked release, or deletes a waiter key, so no lock or waiter
/// outlives a cancelled call.
#[must_use = "a PendingAcquire cleans up when dropped; bind it to a variable"]
pub struct PendingAcquire {
    cleanup: Option<Box<dyn FnOnce() + Send>>,
}

impl PendingAcquire {
    /// Arms `cleanup` to run if this value is dropped before [`disarm`](Self::disarm).
    pub fn arm(cleanup: impl FnOnce() + Send + 'static) -> Self {
        Self {
            cleanup: Some(Box::new(cleanup)),
        }
    }

    /// The acquire completed (or failed cleanly): do not run the cleanup.
    pub fn disarm(mut self) {
        self.cleanup = None;
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        if let Some(cleanup) = self.cleanup.take() {
            cleanup();
        }
    }
}

impl fmt::Debug for PendingAcquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingAcquire")
            .field("armed", &self.cleanup.is_some())
            .finish()
    }
}
