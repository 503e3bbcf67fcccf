//! The held lock: [`LockGuard`] and its [`Lost`] signal.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::observability::{End, GuardLabels, GuardProbe};
use crate::options::LockOptions;
use crate::raw::detach::Detach;
use crate::raw::holdings::HoldTicket;
use crate::raw::lease::{RawLease, RenewedBy, spawn_release};
use crate::raw::state::LeaseState;
use crate::raw::timer::Scheduled;
use crate::raw::watchdog::{start_watchdog, watchdog_settings};
use crate::status::{LockStatus, LostReason};
use crate::token::FencingToken;

/// A held lock. Created by [`acquire`](crate::DistributedLock::acquire) and
/// [`try_acquire`](crate::DistributedLock::try_acquire); released by [`release`](Self::release),
/// or in the background when dropped.
///
/// It carries the lock's [`FencingToken`], the lease deadline and a [`lost`](Self::lost) signal.
/// With renewal on (the default), a watchdog task keeps the lease alive until the guard is
/// released, dropped or forgotten.
///
/// ### Note: dropping releases in the background, not at once
/// Async drop does not exist, so `Drop` spawns the release and logs a warning. Code that must know
/// the lock is free before it goes on (the commit-then-unlock rule) calls
/// `release().await` after its commit.
#[must_use = "if unused the lock is released immediately"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    name: LockName,
    token: FencingToken,
    lease: Option<Arc<dyn RawLease>>,
    state: Arc<LeaseState>,
    backend: &'static str,
    /// The backend's, to check an `extend`'s TTL as an acquire's was.
    capabilities: Capabilities,
    probe: GuardProbe,
    /// Its place among what its client holds, which `close` releases: left when the guard is
    /// released, dropped or forgotten.
    ticket: Option<HoldTicket>,
    /// The watchdog's start, while it waits on the client's renewal timer: dropped with the
    /// guard, so a released guard leaves nothing scheduled.
    _watchdog: Option<Scheduled>,
}

impl LockGuard {
    /// Assembles a guard from what the server granted (see [`raw::Grant`](crate::raw::Grant)):
    /// starts the watchdog if `options` ask for renewal (and the guard renews its own lease) or a
    /// maximum hold time.
    pub(crate) fn assemble(
        (capabilities, backend): (Capabilities, &'static str),
        name: LockName,
        token: FencingToken,
        (lease, state): (Arc<dyn RawLease>, Arc<LeaseState>),
        renewed_by: RenewedBy,
        options: &LockOptions,
        ticket: HoldTicket,
    ) -> Self {
        // Before the watchdog starts, so that its first failure is reported as this guard's.
        state.label(GuardLabels {
            backend,
            name: name.clone(),
            token,
        });
        let watchdog = start_watchdog(
            watchdog_settings(&name, options, renewed_by == RenewedBy::Guard),
            lease.clone(),
            state.clone(),
        );
        Self {
            name,
            token,
            lease: Some(lease),
            state,
            backend,
            capabilities,
            probe: GuardProbe::start(backend),
            ticket: Some(ticket),
            _watchdog: watchdog,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token of this acquire: pass it with every write to the resource you protect.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// When the lease ends unless renewed (the watchdog moves it forward); `None` for session
    /// leases (MySQL, Postgres), which last as long as their connection.
    ///
    /// The deadline is measured from before the acquire request was sent, so it errs early.
    pub fn valid_until(&self) -> Option<Instant> {
        self.state.valid_until()
    }

    /// Whether the lock is still held as far as this client knows (not lost, deadline not passed).
    pub fn is_held(&self) -> bool {
        self.state.is_held()
    }

    /// Where the lock stands: [`Held`](LockStatus::Held) until an instant (or for the session),
    /// [`Suspended`](LockStatus::Suspended) until an instant (its session lost its connection
    /// and may come back: stop writing until it is held again), or [`Lost`](LockStatus::Lost)
    /// with the reason.
    pub fn status(&self) -> LockStatus {
        self.state.status()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        if self.state.is_held() {
            None
        } else {
            self.state.lost_reason()
        }
    }

    /// A future that resolves when the lock is lost, with the reason. Select on it to abort work:
    ///
    /// ```
    /// # async fn demo(guard: dlock_api::LockGuard) {
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("lock lost: {reason}"),
    ///     _ = do_the_work() => {}
    /// }
    /// # }
    /// # async fn do_the_work() {}
    /// ```
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes the guard.
    pub fn lost(&self) -> Lost<'_> {
        Lost {
            inner: Box::pin(self.state.lost()),
        }
    }

    /// A token cancelled when the lock is lost, for handing to spawned work. The first call starts
    /// one small task that watches the lease deadline until the guard is released or dropped.
    pub fn lost_token(&self) -> CancellationToken {
        let token = self.state.lost_token().clone();
        if !self.state.claim_deadline_watch() {
            return token;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let state = self.state.clone();
            handle.spawn(async move {
                tokio::select! {
                    _ = state.closed() => {}
                    _ = state.lost() => {}
                }
            });
        }
        token
    }

    /// Resets the lease to `ttl` from now.
    ///
    /// # Errors
    /// - [`LockError::Lost`] without a network call if the lock is already known to be lost;
    /// - [`LockError::NotHeld`] if the server says someone else holds it (the guard is then lost);
    /// - [`LockError::Unsupported`] on session backends, which have no lease to extend;
    /// - [`LockError::InvalidArgument`] for a `ttl` an acquire would refuse (zero, absurd, or
    ///   beyond the backend's [`min_ttl`](Capabilities::min_ttl) and
    ///   [`max_ttl`](Capabilities::max_ttl)), before any network call.
    ///
    /// # Cancel safety
    /// Cancel safe in that dropping it leaves the lock held; the lease may or may not have been
    /// extended.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let extended = LockOptions::new()
            .with_ttl(ttl)
            .with_renewal(crate::Renewal::Off);
        self.capabilities.check(self.backend, &extended)?;
        self.check_held()?;
        let lease = self.lease.as_ref().expect("lease present until release");
        match lease.extend(ttl).await {
            Ok(valid_until) => {
                if self.state.valid_until().is_some() {
                    self.state.set_valid_until(Some(valid_until));
                }
                Ok(())
            }
            Err(error @ LockError::NotHeld { .. }) => {
                self.state.mark_lost(LostReason::TakenOver);
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Releases the lock and waits for the server to confirm.
    ///
    /// # Errors
    /// - [`LockError::Lost`] if the lock had been lost before (the release is still attempted,
    ///   owner-checked, so it never touches a new holder's lock);
    /// - [`LockError::NotHeld`] if the server says this guard no longer holds it;
    /// - [`LockError::Unavailable`] if the server could not be reached: the lock then ends with
    ///   its lease or session;
    /// - [`LockError::Lost`] with [`LostReason::ClientClosed`] if its client was
    ///   [closed](crate::DistributedLock::close), which released it.
    ///
    /// # Cancel safety
    /// Cancel safe: the release runs to completion in the background if this future is dropped
    /// (a `select!`, a timeout, an aborted task), so the lock is released and the client's own
    /// records of it are updated either way; only the result is lost
    /// (`cancel::aborted_release_leaves_client_usable`).
    pub async fn release(mut self) -> Result<()> {
        let lease = self.lease.take().expect("lease present until release");
        self.state.close();
        if !self.leave_holdings() {
            self.probe.set_end(End::Lost);
            return Err(LockError::Lost {
                name: self.name.to_string(),
                reason: LostReason::ClientClosed,
            });
        }
        let lost_before = (!self.state.is_held())
            .then(|| self.state.lost_reason())
            .flatten();
        self.probe.set_end(if lost_before.is_some() {
            End::Lost
        } else {
            End::Released
        });
        let released = Detach::new(async move { lease.release().await }).await;
        match (lost_before, released) {
            (Some(reason), _) => Err(LockError::Lost {
                name: self.name.to_string(),
                reason,
            }),
            (None, result) => result,
        }
    }

    /// Stops renewal and lets go of the guard *without* releasing: the lock stays held until its
    /// TTL ends (a session backend's connection is closed, which frees it at once). Useful for
    /// handing a lock over to expiry on purpose, and for testing crash liveness.
    pub fn forget(mut self) {
        self.probe.set_end(End::Forgotten);
        self.state.close();
        self.leave_holdings();
        self.lease.take();
    }

    /// Leaves the client's holdings: `false` when the client's `close` took this guard's
    /// release.
    fn leave_holdings(&mut self) -> bool {
        self.ticket.take().is_none_or(HoldTicket::leave)
    }

    /// Publishes `value` as the leader's for this guard's term (see
    /// [`Leadership::proclaim`](crate::Leadership::proclaim)): refused once lost, and a server
    /// that says the term is over makes the guard lost.
    pub(crate) async fn publish(&self, value: &[u8]) -> Result<()> {
        if let LockStatus::Suspended { .. } = self.state.status() {
            // Not lost: the session may come back, and the leadership with it.
            return Err(LockError::unavailable_because(
                self.backend,
                "the leader's session is suspended (its connection was lost); proclaim again once it is held",
            ));
        }
        self.check_held()?;
        let lease = self.lease.as_ref().expect("lease present until release");
        match lease.proclaim(self.token, value).await {
            Err(error @ LockError::NotHeld { .. }) => {
                self.state.mark_lost(LostReason::TakenOver);
                Err(error)
            }
            other => other,
        }
    }

    fn check_held(&self) -> Result<()> {
        if self.state.is_held() {
            return Ok(());
        }
        let reason = self.state.lost_reason().unwrap_or(LostReason::Expired);
        Err(LockError::Lost {
            name: self.name.to_string(),
            reason,
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            if !self.leave_holdings() {
                // The client's close released it.
                self.state.close();
                self.probe.set_end(End::Lost);
                return;
            }
            // Looked at before closing: a lease that ran out, or a session that ended, unnoticed
            // while held is reported as lost here rather than never.
            let lost = !self.state.is_held();
            self.probe
                .set_end(if lost { End::Lost } else { End::Dropped });
            self.state.close();
            tracing::warn!(
                backend = self.backend,
                name = %self.name,
                token = self.token.get(),
                "lock guard dropped without release(); releasing in the background"
            );
            spawn_release(self.name.as_str(), lease);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.name)
            .field("fencing_token", &self.token)
            .field("valid_until", &self.state.valid_until())
            .field("lost", &self.state.lost_reason())
            .finish_non_exhaustive()
    }
}

/// The future returned by [`LockGuard::lost`]: resolves with the reason when the lock is lost.
#[must_use = "futures do nothing unless awaited"]
pub struct Lost<'a> {
    inner: Pin<Box<dyn Future<Output = LostReason> + Send + 'a>>,
}

impl Future for Lost<'_> {
    type Output = LostReason;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LostReason> {
        self.inner.as_mut().poll(cx)
    }
}

impl fmt::Debug for Lost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Lost")
    }
}
