//! [`Session`]: one client session carrying many guards.

use std::sync::{Mutex, OnceLock};

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::observability;
use crate::status::LostReason;

/// One client session that carries many guards: a SQL connection, an etcd lease kept alive by
/// one stream, a ZooKeeper session. It has one deadline and one fate for all of them:
/// - [`suspend`](Self::suspend) when the connection is lost but the session may come back
///   (every guard on it reports [`LockStatus::Suspended`](crate::LockStatus::Suspended));
/// - [`resume`](Self::resume) when it does, within the deadline (the guards are held again);
/// - [`end`](Self::end) when it is gone for good (every guard is lost with the reason), which
///   also happens by itself when a suspension outlives its deadline
///   ([`LostReason::SessionExpired`]).
///
/// A backend creates one per session and passes it to [`LeaseState::on_session`](super::LeaseState::on_session)
/// for every guard it grants there, instead of walking its own registry to mark guards lost.
#[derive(Debug, Default)]
pub struct Session {
    ended: CancellationToken,
    reason: OnceLock<LostReason>,
    suspended_until: Mutex<Option<Instant>>,
    /// Why the session ends when a suspension reaches its deadline.
    expiry_reason: Mutex<Option<LostReason>>,
    changed: Notify,
    /// The backend of the guards it carries, once it carries one: only such a session reports
    /// its suspension (a backend's spare or mirror sessions would double the count).
    backend: OnceLock<&'static str>,
}

/// Where a [`Session`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    /// Connected.
    Active,
    /// Connection lost; it may come back until `until`.
    Suspended {
        /// The last instant the session can come back.
        until: Instant,
    },
    /// Gone, for this reason.
    Ended(LostReason),
}

impl Session {
    /// A new, active session.
    pub fn new() -> Self {
        Self::default()
    }

    fn suspension(&self) -> Option<Instant> {
        *self
            .suspended_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The connection is lost; the session (and the server's hold on its locks) may come back
    /// until `until`. A later suspension keeps the earlier deadline: the session timeout runs from
    /// the last heartbeat, not from the latest failure.
    pub fn suspend(&self, until: Instant) {
        let started = {
            let mut suspended = self
                .suspended_until
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if suspended.is_some() {
                false
            } else {
                *suspended = Some(until);
                true
            }
        };
        if let Some(backend) = self.backend.get().filter(|_| started) {
            observability::suspended(backend, until);
        }
        self.changed.notify_waiters();
    }

    /// As [`suspend`](Self::suspend), but a suspension that reaches its deadline ends the
    /// session with `reason` instead of [`LostReason::SessionExpired`]: for a lease that is not a
    /// session but suspends its guard while renewals fail (Redlock, where running out is
    /// [`LostReason::RenewalFailed`]).
    pub fn suspend_with(&self, until: Instant, reason: LostReason) {
        *self.expiry_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.suspend(until);
    }

    /// The connection is back within the deadline: guards on the session are held again.
    pub fn resume(&self) {
        let was_suspended = self
            .suspended_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        // An ended session does not come back, whatever its backend says afterwards.
        let back = was_suspended && self.reason.get().is_none();
        if let Some(backend) = self.backend.get().filter(|_| back) {
            observability::resumed(backend);
        }
        self.changed.notify_waiters();
    }

    /// The session is gone: every guard on it is lost with `reason`. Returns false if it had
    /// ended already (the first reason stays).
    pub fn end(&self, reason: LostReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        if first {
            self.ended.cancel();
            self.changed.notify_waiters();
        }
        first
    }

    pub(crate) fn label(&self, backend: &'static str) {
        let _ = self.backend.set(backend);
    }

    /// Where the session stands now. A suspension past its deadline ends the session here
    /// ([`LostReason::SessionExpired`]).
    pub fn status(&self) -> SessionStatus {
        if let Some(reason) = self.reason.get() {
            return SessionStatus::Ended(*reason);
        }
        match self.suspension() {
            Some(until) if Instant::now() >= until => {
                let reason = self
                    .expiry_reason
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .unwrap_or(LostReason::SessionExpired);
                self.end(reason);
                SessionStatus::Ended(*self.reason.get().unwrap_or(&reason))
            }
            Some(until) => SessionStatus::Suspended { until },
            None => SessionStatus::Active,
        }
    }

    /// Resolves when the session ends, with the reason (a suspension that reaches its deadline
    /// ends it).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn ended(&self) -> LostReason {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.status() {
                SessionStatus::Ended(reason) => return reason,
                SessionStatus::Suspended { until } => tokio::select! {
                    _ = changed => {}
                    _ = sleep_until(until) => {}
                },
                SessionStatus::Active => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_suspension_ends_with_its_reason() {
        let plain = Session::new();
        let renewal = Session::new();
        let until = Instant::now() + Duration::from_secs(1);
        plain.suspend(until);
        renewal.suspend_with(until, LostReason::RenewalFailed);
        assert_eq!(renewal.status(), SessionStatus::Suspended { until });
        assert_eq!(renewal.ended().await, LostReason::RenewalFailed);
        assert_eq!(plain.ended().await, LostReason::SessionExpired);
    }
}
