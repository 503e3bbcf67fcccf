//! [`Attempt`]: the cancel protocol of one server-side wait.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::timeout;

use super::core::PoolCore;
use super::driver::SessionDriver;

/// How many times a canceller interrupts a wait before it gives up on it.
const INTERRUPT_ROUNDS: u32 = 10;

/// The cancel protocol of one server-side wait.
///
/// When the acquire that started the wait is dropped (or gives up at its deadline), [`cancel`]
/// runs: if the statement is running, a canceller interrupts it from another connection,
/// repeating until the statement is over (an interrupt that arrives before the statement starts
/// does nothing). The wait's task does not send anything else on the connection until the
/// canceller is done, so a late interrupt can never hit a later statement (such as the unlock
/// that undoes a grant that raced the cancel).
///
/// [`cancel`]: Attempt::cancel
#[derive(Default)]
pub(super) struct Attempt {
    phase: Mutex<Phase>,
    statement_done: Notify,
    interrupts_done: Notify,
}

#[derive(Default)]
struct Phase {
    running: bool,
    done: bool,
    cancelled: bool,
    interrupting: bool,
    interrupts_finished: bool,
}

impl Attempt {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the statement as started; false if cancelled before.
    pub(super) fn start(&self) -> bool {
        let mut phase = self.phase();
        phase.running = !phase.cancelled;
        phase.running
    }

    /// Marks the statement as over; returns (cancelled, a canceller is still interrupting).
    pub(super) fn finish(&self) -> (bool, bool) {
        let mut phase = self.phase();
        phase.running = false;
        phase.done = true;
        let result = (
            phase.cancelled,
            phase.interrupting && !phase.interrupts_finished,
        );
        drop(phase);
        self.statement_done.notify_waiters();
        result
    }

    /// Nobody wants the wait's outcome any more: interrupt the statement on the connection the
    /// server knows as `target`, if it runs.
    pub(super) fn cancel<D: SessionDriver>(self: &Arc<Self>, core: &Arc<PoolCore<D>>, target: u64) {
        let mut phase = self.phase();
        phase.cancelled = true;
        if !phase.running {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        phase.interrupting = true;
        drop(phase);
        let (attempt, core) = (self.clone(), core.clone());
        crate::raw::spawn_cleanup(async move {
            for round in 1..=INTERRUPT_ROUNDS {
                let done = attempt.statement_done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if attempt.phase().done {
                    break;
                }
                if let Err(error) = core.interrupt(target).await {
                    tracing::debug!(%error, "dlock: interrupting a cancelled lock wait failed");
                }
                let _ = timeout(Duration::from_millis(20).saturating_mul(round), done).await;
            }
            attempt.phase().interrupts_finished = true;
            attempt.interrupts_done.notify_waiters();
        });
    }

    /// Waits (up to `bound`) until the canceller stopped interrupting; false if it did not.
    pub(super) async fn wait_interrupts_finished(&self, bound: Duration) -> bool {
        let finished = self.interrupts_done.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        if self.phase().interrupts_finished {
            return true;
        }
        timeout(bound, finished).await.is_ok()
    }
}
