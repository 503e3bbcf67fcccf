use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::session::{Session, SessionStatus};
use crate::observability::{self, GuardLabels};
use crate::status::{LockStatus, LostReason};

/// The shared record of one held lock's validity and loss.
///
/// The guard, its watchdog and the backend's own tasks (a connection that notices it closed, a
/// session watcher) share it through an `Arc`. Loss is sticky: the first
/// [`mark_lost`](Self::mark_lost) wins and later ones are ignored.
#[derive(Debug)]
pub struct LeaseState {
    lost: LazyToken,
    reason: OnceLock<LostReason>,
    valid_until: Mutex<Option<Instant>>,
    valid_until_changed: Notify,
    closed: LazyToken,
    deadline_watched: AtomicBool,
    renewal_failing: AtomicBool,
    /// The session carrying the lock, if the backend has one: its suspension and end apply here.
    session: Option<Arc<Session>>,
    /// Whose lease this is, once it belongs to a guard: a loss is reported with these.
    labels: OnceLock<GuardLabels>,
}

impl LeaseState {
    /// A held lock, valid until `valid_until` (`None`: no deadline, the lease is a session).
    pub fn new(valid_until: Option<Instant>) -> Self {
        Self {
            lost: LazyToken::default(),
            reason: OnceLock::new(),
            valid_until: Mutex::new(valid_until),
            valid_until_changed: Notify::new(),
            closed: LazyToken::default(),
            deadline_watched: AtomicBool::new(false),
            renewal_failing: AtomicBool::new(false),
            session: None,
            labels: OnceLock::new(),
        }
    }

    /// A held lock carried by `session`: the session's suspension makes it
    /// [`Suspended`](crate::LockStatus::Suspended), its end makes it lost.
    pub fn on_session(valid_until: Option<Instant>, session: Arc<Session>) -> Self {
        Self {
            session: Some(session),
            ..Self::new(valid_until)
        }
    }

    /// The session carrying the lock, if any.
    pub fn session(&self) -> Option<&Arc<Session>> {
        self.session.as_ref()
    }

    /// Where the lock stands: held (until when), suspended (until when), or lost (why).
    /// Passing the deadline, or the session's end, marks it lost.
    pub fn status(&self) -> LockStatus {
        // What ends the lock, in order of precedence (the first reason marked stays): an earlier
        // mark, the session's end, the deadline.
        let session = self.session.as_ref().map(|s| s.status());
        if let Some(SessionStatus::Ended(reason)) = session {
            self.mark_lost(reason);
        }
        if self
            .valid_until()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            self.mark_lost(if self.renewal_failing.load(Ordering::SeqCst) {
                LostReason::RenewalFailed
            } else {
                LostReason::Expired
            });
        }
        match (self.reason.get(), session) {
            (Some(reason), _) => LockStatus::Lost(*reason),
            (None, Some(SessionStatus::Suspended { until })) => LockStatus::Suspended { until },
            (None, _) => LockStatus::Held {
                valid_until: self.valid_until(),
            },
        }
    }

    /// Ties the lease to the guard made from it, so its loss is reported with the guard's fields;
    /// its session, if any, reports its suspensions from now on too.
    pub(crate) fn label(&self, labels: GuardLabels) {
        if let Some(session) = &self.session {
            session.label(labels.backend);
        }
        let _ = self.labels.set(labels);
    }

    pub(crate) fn labels(&self) -> Option<&GuardLabels> {
        self.labels.get()
    }

    /// True the first time it is called: whoever gets true starts the one task that turns a
    /// passed deadline into a fired lost token.
    pub(crate) fn claim_deadline_watch(&self) -> bool {
        !self.deadline_watched.swap(true, Ordering::SeqCst)
    }

    /// Records that the lock is lost and fires the lost signal. Returns false if it was already
    /// lost (the first reason is kept).
    pub fn mark_lost(&self, reason: LostReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        if first {
            self.lost.cancel();
            if let Some(labels) = self.labels.get() {
                observability::lost(labels, reason);
            }
        }
        first
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.reason.get().copied()
    }

    /// The instant the lease ends unless renewed; `None` for session leases.
    pub fn valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the deadline (after a successful renewal or extend).
    pub fn set_valid_until(&self, valid_until: Option<Instant>) {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = valid_until;
        self.valid_until_changed.notify_waiters();
    }

    /// Records whether the last renewal attempt failed, so that a deadline passing while renewals
    /// fail is reported as [`LostReason::RenewalFailed`] rather than a plain expiry.
    pub fn set_renewal_failing(&self, failing: bool) {
        self.renewal_failing.store(failing, Ordering::SeqCst);
    }

    /// Whether the lock is held as far as this client knows: not lost, not suspended, and, for
    /// TTL leases, before the deadline. Passing the deadline marks the lock lost.
    pub fn is_held(&self) -> bool {
        matches!(self.status(), LockStatus::Held { .. })
    }

    /// A token cancelled when the lock is marked lost.
    pub fn lost_token(&self) -> &CancellationToken {
        self.lost.token()
    }

    /// Resolves when the lock is lost: marked lost, or its deadline passed (which marks it).
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LostReason {
        loop {
            let changed = self.valid_until_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let LockStatus::Lost(reason) = self.status() {
                return reason;
            }
            // Whatever can end the lock: a mark, the deadline, the session's end or suspension
            // deadline, or a change to any of them.
            let deadline = self.valid_until();
            let session_ended = async {
                match &self.session {
                    Some(session) => {
                        session.ended().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.lost.token().cancelled() => {}
                _ = changed => {}
                _ = session_ended => {}
                _ = async {
                    match deadline {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Marks the lock as no longer this guard's business (released, forgotten or dropped): the
    /// watchdog and lost watchers stop.
    pub fn close(&self) {
        self.closed.cancel();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Resolves when [`close`](Self::close) is called.
    pub async fn closed(&self) {
        self.closed.token().cancelled().await
    }
}

/// A cancellation token made on first use. Most leases are released before anything waits on
/// their loss or end, and a token is an allocation and a lock to make and drop on every acquire.
#[derive(Debug, Default)]
struct LazyToken {
    token: OnceLock<CancellationToken>,
    cancelled: AtomicBool,
}

impl LazyToken {
    fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        // Pairs with the fence in `token`: a token made concurrently is either seen here or
        // sees the flag there, never neither.
        fence(Ordering::SeqCst);
        if let Some(token) = self.token.get() {
            token.cancel();
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn token(&self) -> &CancellationToken {
        let token = self.token.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.is_cancelled() {
            token.cancel();
        }
        token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lazy_token_is_cancelled_whichever_comes_first() {
        let early = LazyToken::default();
        early.cancel();
        assert!(early.is_cancelled());
        assert!(early.token().is_cancelled());

        let late = LazyToken::default();
        let token = late.token().clone();
        assert!(!token.is_cancelled());
        late.cancel();
        assert!(token.is_cancelled());
    }

    #[test]
    fn loss_reaches_a_token_taken_before_or_after_it() {
        use futures::FutureExt;

        let before = LeaseState::new(None);
        let token = before.lost_token().clone();
        assert!(before.mark_lost(LostReason::Expired));
        assert!(token.is_cancelled());

        let after = LeaseState::new(None);
        assert!(after.mark_lost(LostReason::TakenOver));
        assert!(after.lost_token().is_cancelled());
        assert_eq!(after.lost().now_or_never(), Some(LostReason::TakenOver));
        after.close();
        assert!(after.is_closed());
        assert!(after.closed().now_or_never().is_some());
    }
}
