//! The holder's side of a takeover signal on a TTL backend: a lock held for a while is checked
//! again and again until its guard ends, so a key that vanished reaches its holder when someone
//! takes the lock over, not at the next renewal.
//!
//! The backend supplies the check (mark the key as watched, subscribe where the taker will
//! announce, answer whether the key is still this holder's) and a [`Notify`] its connection
//! wakes on a lost connection; [`watch_held`] owns the loop: when to check again, when to stop,
//! and losing the guard. Redis and Redlock run it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::raw::time::after;
use crate::raw::{GuardTimer, LeaseState, Scheduled};
use crate::{LostReason, Result};

/// What one check of a held lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeldCheck {
    /// The key is still the holder's (and marked as watched): check again later.
    Held,
    /// The key is not the holder's any more: the guard is lost ([`LostReason::TakenOver`]).
    Gone,
    /// Nobody is left to tell (the client was dropped): stop watching.
    Stop,
}

/// How often [`watch_held`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldWatchTiming {
    /// After a check that found the key held: the backend's mark must outlive this.
    pub again_every: Duration,
    /// After a check that could not tell (no answer, a reconnect under way).
    pub retry_after: Duration,
}

/// Starts `watch` (spawned) `delay` from now on the client's guard `timer`, unless the guard of
/// `state` was released by then; dropping the handle (keep it with the lease) cancels it. A
/// lock released sooner, as most are, then costs a timer entry and no task.
pub fn start_watch_after<F>(
    timer: &GuardTimer,
    delay: Duration,
    state: &Arc<LeaseState>,
    watch: F,
) -> Option<Scheduled>
where
    F: Future<Output = ()> + Send + 'static,
{
    let state = state.clone();
    timer.schedule(after(Instant::now(), delay), move || {
        if !state.is_closed() {
            tokio::spawn(watch);
        }
    })
}

/// Runs `check` until the guard of `state` is released or lost, or `check` says
/// [`HeldCheck::Stop`]: at once, then after each interval of `timing`, and whenever `wake` is
/// notified (a lost connection, whose messages were missed). A check that finds the key gone
/// loses the guard, unless it was released meanwhile.
///
/// # Cancel safety
/// Cancel safe: it only checks; dropping it stops the watch.
pub async fn watch_held<C, F>(
    state: &LeaseState,
    wake: &Notify,
    timing: HeldWatchTiming,
    mut check: C,
) where
    C: FnMut() -> F,
    F: Future<Output = Result<HeldCheck>>,
{
    loop {
        // Armed before the check, so a lost connection during it checks again.
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let again_at = match check().await {
            Ok(HeldCheck::Held) => after(Instant::now(), timing.again_every),
            Ok(HeldCheck::Gone) => {
                if !state.is_closed() {
                    state.mark_lost(LostReason::TakenOver);
                }
                return;
            }
            Ok(HeldCheck::Stop) => return,
            Err(error) => {
                tracing::debug!(%error, "the watch of a held lock could not check it; trying again");
                after(Instant::now(), timing.retry_after)
            }
        };
        tokio::select! {
            _ = state.closed() => return,
            _ = state.lost_token().cancelled() => return,
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(again_at) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const TIMING: HeldWatchTiming = HeldWatchTiming {
        again_every: Duration::from_secs(120),
        retry_after: Duration::from_millis(200),
    };

    #[tokio::test(start_paused = true)]
    async fn a_gone_key_loses_the_guard_and_a_wake_checks_again() {
        let state = Arc::new(LeaseState::new(None));
        let wake = Arc::new(Notify::new());
        let checks = Arc::new(AtomicUsize::new(0));
        let task = {
            let (state, wake, checks) = (state.clone(), wake.clone(), checks.clone());
            tokio::spawn(async move {
                watch_held(&state, &wake, TIMING, || {
                    let n = checks.fetch_add(1, Ordering::SeqCst);
                    async move {
                        Ok(if n == 0 {
                            HeldCheck::Held
                        } else {
                            HeldCheck::Gone
                        })
                    }
                })
                .await
            })
        };
        while checks.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(state.lost_reason(), None);
        wake.notify_waiters();
        task.await.unwrap();
        assert_eq!(checks.load(Ordering::SeqCst), 2);
        assert_eq!(state.lost_reason(), Some(LostReason::TakenOver));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_guard_ends_the_watch_without_a_loss() {
        let state = Arc::new(LeaseState::new(None));
        let wake = Notify::new();
        let watch = watch_held(&state, &wake, TIMING, || async { Ok(HeldCheck::Held) });
        tokio::pin!(watch);
        assert!(futures::poll!(watch.as_mut()).is_pending());
        state.close();
        watch.await;
        assert_eq!(state.lost_reason(), None);
    }
}
