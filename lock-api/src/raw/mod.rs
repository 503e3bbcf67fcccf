//! The implementor API: how a backend plugs into dlock. Read `ARCHITECTURE.md` at the repository
//! root for the picture; this is the guide.
//!
//! ## What a backend supplies
//! - [`RawLock`]: `try_grant` (one attempt that does not wait) and `wait_grant` (wait on the
//!   server until granted or a deadline), plus its [`Capabilities`](crate::Capabilities). Both
//!   answer with a [`Grant`]: the fencing token, a [`RawLease`], the [`LeaseState`] holding the
//!   validity the server gave, and who renews it ([`RenewedBy`]).
//! - [`RawLease`]: release (owner-checked) and extend, which returns the validity it obtained.
//! - `dlock_api::impl_distributed_lock!(MyLock);` then implements
//!   [`DistributedLock`](crate::DistributedLock) through the engine ([`try_acquire`],
//!   [`acquire`]): options are checked against the capabilities once, before any network call;
//!   the one wait deadline comes from [`time::deadline`] (a wait too long to reach has none); a
//!   wait that ends without a grant becomes [`LockError::Timeout`](crate::LockError::Timeout);
//!   the guard is assembled here and the shared watchdog started when the guard renews its own
//!   lease. Backend entry points with their own key types (Postgres integer keys) use
//!   [`try_acquire_by`] and [`acquire_by`].
//!
//! ## The three lease models
//! - **TTL per lock** (Redis, memory): the state carries a deadline measured from before the
//!   request; [`RenewedBy::Guard`] makes the watchdog call [`RawLease::extend`] every renewal
//!   interval and move the deadline to the validity it returns.
//! - **Session** (MySQL, Postgres): the state has no deadline; the connection is the lease
//!   ([`RenewedBy::Session`]), kept alive by the backend's keepalive, which marks every guard on
//!   a dead connection lost ([`LeaseState::mark_lost`]).
//! - **Consensus lease** (etcd, planned): one lease for many keys, kept alive by the client's
//!   stream ([`RenewedBy::Session`]), its deadline shared by every guard on it.
//!
//! ## Cancellation, once for every backend
//! - [`PendingAcquire`]: armed before a request that could grant the lock, it undoes the request
//!   if the acquire is dropped before the [`Grant`] exists. A dropped `Grant` releases its lease.
//! - [`Detach`]: runs a step to completion even if its caller is dropped (every release runs in
//!   one, so a task aborted inside `release().await` still releases and still updates the
//!   client's records).
//! - [`WaitRecovery`]: lets a blocking wait survive its connection being killed.
//! - [`config`]: option values and URL parts parsed, and refused, the same way in every backend.

pub mod config;
mod detach;
mod engine;
mod pending;
mod recovery;
mod state;
pub mod time;
mod watchdog;

pub use detach::Detach;
pub use engine::{Grant, RawLock, RenewedBy, acquire, acquire_by, try_acquire, try_acquire_by};
pub use pending::PendingAcquire;
pub use recovery::WaitRecovery;
pub use state::LeaseState;
pub(crate) use watchdog::start_watchdog;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

pub use async_trait::async_trait;
use tokio::time::Instant;

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

    /// Resets the lease to `ttl` if this lease still owns the lock, and returns the validity it
    /// obtained: the instant the lease ends by this client's clock, measured from *before* the
    /// request was sent (`raw::time::after(sent, ttl)`), or less where the backend must allow for
    /// drift (Redlock) or was granted a different TTL (etcd).
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if the lock is gone or owned by
    /// someone else, [`LockError::Unsupported`](crate::LockError::Unsupported) on backends without
    /// leases to extend.
    async fn extend(&self, ttl: Duration) -> Result<Instant>;
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
    renewed_by_guard: bool,
) -> watchdog::Watch {
    watchdog::Watch {
        name: name.to_string(),
        ttl: options.ttl(),
        renew_every: if renewed_by_guard {
            options.renewal_interval()
        } else {
            None
        },
        max_hold_until: time::deadline(tokio::time::Instant::now(), options.max_hold()),
    }
}
