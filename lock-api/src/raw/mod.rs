//! The implementor-facing API: what a backend builds a [`LockGuard`](crate::LockGuard) from.
//!
//! A backend's acquire, on success, creates
//! - a [`RawLease`]: its own release and extend (compare-and-delete, compare-and-pexpire, …);
//! - a [`LeaseState`]: the shared record of validity and loss, which the backend may also hand to
//!   its connection task so that a closed session fires [`mark_lost`](LeaseState::mark_lost);
//!
//! and passes both to [`LockGuard::new`](crate::LockGuard::new), which starts the shared
//! [watchdog](crate::Renewal) when the options ask for renewal or a maximum hold time. Between
//! sending the request that could grant the lock and returning the guard, the backend keeps a
//! [`PendingAcquire`] armed, so a dropped acquire future cleans up after itself.
//!
//! Two more pieces keep cancellation from cutting work in half: [`Detach`] runs a step to
//! completion even if its caller is dropped (every release runs in one, so a task aborted inside
//! `release().await` still releases and still updates the client's records), and
//! [`WaitRecovery`] lets a blocking wait survive its connection being killed.

pub mod config;
mod detach;
mod pending;
mod recovery;
mod state;
mod watchdog;

pub use detach::Detach;
pub use pending::PendingAcquire;
pub use recovery::WaitRecovery;
pub use state::LeaseState;
pub(crate) use watchdog::start_watchdog;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;

/// A backend's hold on one lock: the operations a [`LockGuard`](crate::LockGuard) delegates to.
///
/// Both methods may be called from the watchdog task while the guard is elsewhere, hence `&self`.
#[async_trait]
pub trait RawLease: Debug + Send + Sync + 'static {
    /// Releases the lock if this lease still owns it.
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if someone else holds it now or
    /// nobody does; it must never touch another holder's lock.
    ///
    /// The guard runs it inside a [`Detach`], so it always runs to completion even when the
    /// caller of `release()` is dropped: keep the client's own bookkeeping of the release in it.
    async fn release(&self) -> Result<()>;

    /// Resets the lease to `ttl` from now if this lease still owns the lock.
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if the lock is gone or owned by
    /// someone else, [`LockError::Unsupported`](crate::LockError::Unsupported) on backends without
    /// leases to extend.
    async fn extend(&self, ttl: Duration) -> Result<()>;
}

/// Releases `lease` in the background: what dropping an unreleased guard does.
///
/// It never blocks (async drop does not exist, and `block_on` in `Drop` can deadlock a
/// runtime): with a tokio runtime it spawns the release; without one it drops the lease, so a
/// session backend closes its connection and a TTL backend's lock ends at its TTL. Both paths log.
pub fn spawn_release(name: &str, lease: Arc<dyn RawLease>) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let name = name.to_owned();
            handle.spawn(async move {
                if let Err(error) = lease.release().await {
                    tracing::warn!(lock = %name, %error, "background release of a dropped guard failed; the lease will end on its own");
                }
            });
        }
        Err(_) => {
            tracing::warn!(lock = %name, "guard dropped outside a tokio runtime; the lock ends when its lease or session does");
        }
    }
}

/// The watchdog settings a guard derives from its options.
pub(crate) fn watchdog_settings(
    name: &crate::LockName,
    options: &crate::LockOptions,
    lease_is_ttl: bool,
) -> watchdog::Watch {
    watchdog::Watch {
        name: name.to_string(),
        ttl: options.ttl(),
        renew_every: if lease_is_ttl {
            options.renewal_interval()
        } else {
            None
        },
        max_hold_until: options.max_hold().map(|d| tokio::time::Instant::now() + d),
    }
}
