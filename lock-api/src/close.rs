//! Closing a client: every lock it holds released at once, every wait ended, and what it keeps on
//! the server beyond its locks ended, within one deadline.

use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::raw::time::after;
use crate::raw::{Detach, RawLock};
use crate::status::LostReason;

/// What [`close`](crate::DistributedLock::close) could not do before its deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloseReport {
    /// The names whose release the server did not confirm before the deadline (server down or
    /// frozen), sorted: each stays taken until its lease or session ends on the server.
    pub unreleased: Vec<LockName>,
}

impl CloseReport {
    /// Whether every lock the client held was released.
    pub fn is_clean(&self) -> bool {
        self.unreleased.is_empty()
    }
}

/// [`DistributedLock::close`](crate::DistributedLock::close) for a [`RawLock`].
///
/// The client is closed first, so no guard can be made after the ones released here; each
/// guard is told it is lost (its `with_lock` work stops) before its release is sent, since the
/// lock stops protecting anything from that moment. Releases run side by side, each
/// owner-checked; one the deadline cuts short goes on in the background and its name is
/// reported. Then the backend's [`RawLock::shutdown`] gets what is left of the deadline.
///
/// # Errors
/// None yet: the `Result` leaves room for a backend that cannot close.
///
/// # Cancel safety
/// Cancel safe: the client is closed and its guards are lost as soon as the call is first
/// polled; the releases already sent run to completion in the background.
pub async fn close<B: RawLock + ?Sized>(backend: &B, within: Duration) -> Result<CloseReport> {
    let deadline = after(Instant::now(), within);
    let held = backend.holdings().close();
    let releases = held.into_iter().map(|held| async move {
        held.state.mark_lost(LostReason::ClientClosed);
        held.state.close();
        let lease = held.lease;
        let released = Detach::new(async move { lease.release().await });
        match tokio::time::timeout_at(deadline, released).await {
            // Gone already (its lease ran out, or it was lost before): nothing left to free.
            Ok(Ok(()) | Err(LockError::NotHeld { .. } | LockError::Lost { .. })) => None,
            Ok(Err(error)) => {
                tracing::warn!(name = %held.name, %error, "close could not release a lock; it ends with its lease or session");
                Some(held.name)
            }
            Err(_deadline) => Some(held.name),
        }
    });
    let unreleased = join_all(releases).await.into_iter().flatten().collect();
    let _ = tokio::time::timeout_at(deadline, backend.shutdown(deadline)).await;
    Ok(CloseReport { unreleased })
}
