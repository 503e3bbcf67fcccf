use std::time::Duration;

use tokio::time::Instant;

use super::time::after;
use crate::error::LockError;
use crate::options::RetryPolicy;

/// How a blocking wait rides out a lost connection.
///
/// A waiter whose connection is killed (a DBA's `KILL`, a proxy reset, a server restart) should
/// go on waiting within its wait timeout, as a Redis waiter does, rather than fail: it opens a
/// new connection and waits again. Only a server that stays unreachable for `window` ends the
/// wait early. Failures that a retry would repeat ([`LockError::is_retryable`] false) end it at
/// once.
#[derive(Debug)]
pub struct WaitRecovery {
    window: Duration,
    failing_since: Option<Instant>,
    attempts: u32,
}

impl WaitRecovery {
    /// Gives up after failures lasting `window` (a backend's connect timeout is a good choice).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            failing_since: None,
            attempts: 0,
        }
    }

    /// The wait reached the server again: the next failure starts a new window.
    pub fn reached_server(&mut self) {
        self.failing_since = None;
        self.attempts = 0;
    }

    /// A step of the wait failed with `error`: sleeps the back-off (never past `deadline`) and
    /// returns `Ok` to try again, or returns the error to give up with.
    ///
    /// A wait whose deadline comes while its server is failing ends with that failure, not
    /// with a `Timeout`: `Timeout` says somebody else held the lock all along, and an outage
    /// must read as one (`Unavailable`) within the wait.
    ///
    /// # Errors
    /// `error` itself, when it is not worth another try, or when the deadline came before the
    /// next try.
    ///
    /// # Cancel safety
    /// Cancel safe: it only sleeps.
    pub async fn pause_or_give_up(
        &mut self,
        error: LockError,
        retry: &RetryPolicy,
        deadline: Option<Instant>,
    ) -> Result<(), LockError> {
        let Some(delay) = self.on_failure(&error, retry) else {
            return Err(error);
        };
        let wake = after(Instant::now(), delay);
        match deadline {
            Some(deadline) if deadline <= wake => {
                tokio::time::sleep_until(deadline).await;
                Err(error)
            }
            _ => {
                tokio::time::sleep_until(wake).await;
                Ok(())
            }
        }
    }

    /// A step of the wait failed with `error`: `Some(delay)` to sleep before trying again, or
    /// `None` to give up and return the error.
    pub fn on_failure(&mut self, error: &LockError, retry: &RetryPolicy) -> Option<Duration> {
        if !error.is_retryable() || matches!(error, LockError::Timeout { .. }) {
            return None;
        }
        let now = Instant::now();
        let since = *self.failing_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.window {
            return None;
        }
        let delay = retry.delay(self.attempts);
        self.attempts = self.attempts.saturating_add(1);
        tracing::debug!(%error, ?delay, "dlock: a lock wait lost its connection; waiting again");
        Some(delay)
    }
}
