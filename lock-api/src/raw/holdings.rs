//! What a client holds, so that [`close`](crate::DistributedLock::close) can free all of it at
//! once: every guard's lease, and whether the client is closed.
//!
//! A service that stops should free its locks at once rather than leave them until their leases
//! run out (palantir/atlasdb #3162), and should know which it could not free. The engine
//! registers each guard here as it is made and the guard leaves when it is released, dropped or
//! forgotten; `close` marks the client closed, takes every registration still here and releases
//! each. Taking a registration is the one decision of who releases a lease: the guard that finds
//! its own gone knows `close` did (or does) it, so no lease is released twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use super::lease::RawLease;
use super::state::LeaseState;
use crate::error::LockError;
use crate::name::LockName;

/// Every guard a client holds, and whether it is closed. A backend keeps one per client (shared
/// by the client's clones) and returns it from [`RawLock::holdings`](super::RawLock::holdings);
/// the engine does the rest.
#[derive(Clone, Debug, Default)]
pub struct Holdings {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    registry: Mutex<Registry>,
    /// Cancelled by `close`: waits in flight end with [`LockError::Closed`].
    closing: CancellationToken,
}

#[derive(Debug, Default)]
struct Registry {
    closed: bool,
    next_id: u64,
    held: HashMap<u64, Held>,
}

/// One registered guard: what `close` needs to release it and tell its holder.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) name: LockName,
    pub(crate) lease: Arc<dyn RawLease>,
    pub(crate) state: Arc<LeaseState>,
}

/// A guard's place in its client's [`Holdings`]; leaving it says whether the guard still owns
/// its release.
#[derive(Debug)]
pub(crate) struct HoldTicket {
    shared: Arc<Shared>,
    id: u64,
}

impl HoldTicket {
    /// Leaves the client's holdings: `true` if the guard still owns its release, `false` if
    /// `close` took it.
    pub(crate) fn leave(self) -> bool {
        lock(&self.shared.registry).held.remove(&self.id).is_some()
    }
}

impl Holdings {
    /// Whether [`close`](crate::DistributedLock::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closing.is_cancelled()
    }

    /// Resolves when the client is closed.
    pub async fn closed(&self) {
        self.shared.closing.cancelled().await
    }

    /// `Err(Closed)` once the client is closed: what every operation checks first.
    pub(crate) fn check_open(&self, backend: &'static str) -> crate::Result<()> {
        if self.is_closed() {
            return Err(LockError::Closed { backend });
        }
        Ok(())
    }

    /// Registers a new guard; `None` once the client is closed, when its grant must be released
    /// instead of becoming a guard.
    pub(crate) fn register(&self, held: Held) -> Option<HoldTicket> {
        let mut registry = lock(&self.shared.registry);
        if registry.closed {
            return None;
        }
        let id = registry.next_id;
        registry.next_id = registry.next_id.wrapping_add(1);
        registry.held.insert(id, held);
        Some(HoldTicket {
            shared: self.shared.clone(),
            id,
        })
    }

    /// Closes the client: no guard is registered after this, waits in flight are told, and
    /// every guard still registered is handed to the caller to release, in the names' order.
    pub(crate) fn close(&self) -> Vec<Held> {
        let mut held: Vec<Held> = {
            let mut registry = lock(&self.shared.registry);
            registry.closed = true;
            registry.held.drain().map(|(_, held)| held).collect()
        };
        self.shared.closing.cancel();
        held.sort_by(|a, b| a.name.cmp(&b.name));
        held
    }
}

/// The registry's lock; a panic while it was held left nothing half-written (each change is
/// one map operation), so a poisoned lock is used as it is.
fn lock(registry: &Mutex<Registry>) -> MutexGuard<'_, Registry> {
    registry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct NoLease;

    #[async_trait::async_trait]
    impl RawLease for NoLease {
        async fn release(&self) -> crate::Result<()> {
            Ok(())
        }
        async fn extend(&self, _: std::time::Duration) -> crate::Result<tokio::time::Instant> {
            Ok(tokio::time::Instant::now())
        }
    }

    fn held(name: &str) -> Held {
        Held {
            name: LockName::new(name).unwrap(),
            lease: Arc::new(NoLease),
            state: Arc::new(LeaseState::new(None)),
        }
    }

    #[test]
    fn a_registration_is_released_once_by_its_guard_or_by_close() {
        let holdings = Holdings::default();
        let kept = holdings.register(held("b")).unwrap();
        let left = holdings.register(held("a")).unwrap();
        assert!(left.leave(), "a guard that leaves first owns its release");
        let taken = holdings.close();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].name.as_str(), "b");
        assert!(!kept.leave(), "close took the release from the guard");
        assert!(holdings.register(held("c")).is_none());
        assert!(holdings.is_closed());
        assert!(matches!(
            holdings.check_open("test"),
            Err(LockError::Closed { backend: "test" })
        ));
    }
}
