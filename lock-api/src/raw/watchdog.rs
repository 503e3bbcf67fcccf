//! The shared renewal watchdog and maximum-hold enforcement.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};

use super::lease::{RawLease, spawn_release};
use super::state::LeaseState;
use super::time::{after, deadline};
use super::timer::Scheduled;
use crate::error::LockError;
use crate::observability;
use crate::status::LostReason;

/// The watchdog's settings for one guard.
pub(crate) struct Watch {
    pub(crate) name: crate::LockName,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) max_hold_until: Option<Instant>,
}

/// Starts the watchdog if `watch` asks for renewal or a maximum hold time: at once, or, where
/// the lease has a [`GuardTimer`](super::GuardTimer), when the first renewal or the maximum
/// hold time comes due (the returned handle cancels that when the guard lets go first).
///
/// It renews every `renew_every` (a third of the TTL by default). A renewal that fails with a
/// retryable error is retried quickly until the lease's validity runs out, then the lock is marked
/// lost (`RenewalFailed`); any other failure marks it lost at once (`TakenOver` when the server says
/// someone else holds it). At the maximum hold time it marks the lock lost and releases it.
pub(crate) fn start_watchdog(
    watch: Watch,
    lease: Arc<dyn RawLease>,
    state: Arc<LeaseState>,
) -> Option<Scheduled> {
    let first_renewal = watch.renew_every.map(|every| after(Instant::now(), every));
    let first_wake = match (first_renewal, watch.max_hold_until) {
        (None, None) => return None,
        (Some(renewal), Some(max_hold)) => renewal.min(max_hold),
        (renewal, max_hold) => renewal.or(max_hold)?,
    };
    if let Some(timer) = lease.guard_timer() {
        let (lease, state) = (lease.clone(), state.clone());
        return timer.schedule(first_wake, move || {
            if !state.is_closed() {
                tokio::spawn(watch_until_closed(watch, first_renewal, lease, state));
            }
        });
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(name = %watch.name, "no tokio runtime: the lock will not be renewed");
        return None;
    };
    handle.spawn(watch_until_closed(watch, first_renewal, lease, state));
    None
}

async fn watch_until_closed(
    watch: Watch,
    first_renewal: Option<Instant>,
    lease: Arc<dyn RawLease>,
    state: Arc<LeaseState>,
) {
    tokio::select! {
        _ = state.closed() => {}
        _ = state.lost_token().cancelled() => {}
        _ = run(&watch, first_renewal, &lease, &state) => {}
    }
}

async fn run(
    watch: &Watch,
    first_renewal: Option<Instant>,
    lease: &Arc<dyn RawLease>,
    state: &LeaseState,
) {
    let far = after(Instant::now(), Duration::from_secs(365 * 24 * 3600));
    let max_hold_until = watch.max_hold_until.unwrap_or(far);
    let mut next_renewal = first_renewal;
    loop {
        let wake = next_renewal.unwrap_or(far).min(max_hold_until);
        sleep_until(wake).await;
        if Instant::now() >= max_hold_until {
            // The loss event says why; the release needs no event of its own.
            if state.mark_lost(LostReason::MaxHoldExceeded) {
                spawn_release(watch.name.as_str(), lease.clone());
            }
            return;
        }
        let (Some(every), Some(_)) = (watch.renew_every, next_renewal) else {
            continue;
        };
        let started = Instant::now();
        // A renewal that cannot finish before the lease ends is pointless: bound it by the deadline.
        let deadline = state.valid_until().unwrap_or(after(started, watch.ttl));
        // Until it succeeds, a renewal in flight counts as failing: a deadline passing meanwhile is
        // a renewal failure, not a plain expiry.
        state.set_renewal_failing(true);
        match timeout_at(deadline, lease.extend(watch.ttl)).await {
            Ok(Ok(valid_until)) => {
                observability::renewal(state, None);
                state.set_renewal_failing(false);
                state.set_valid_until(Some(valid_until));
                next_renewal = Some(after(started, every));
            }
            Ok(Err(error)) if error.is_retryable() && Instant::now() < deadline => {
                observability::renewal(state, Some((&error, true)));
                let remaining = deadline.saturating_duration_since(Instant::now());
                next_renewal = Some(after(
                    Instant::now(),
                    remaining
                        .checked_div(4)
                        .unwrap_or_default()
                        .clamp(Duration::from_millis(5), every),
                ));
            }
            Ok(Err(error)) => {
                let reason = match &error {
                    LockError::NotHeld { .. } => LostReason::TakenOver,
                    LockError::Lost { reason, .. } => *reason,
                    _ => LostReason::RenewalFailed,
                };
                observability::renewal(state, Some((&error, false)));
                state.mark_lost(reason);
                return;
            }
            Err(_elapsed) => {
                let error = LockError::unavailable_because(
                    state.labels().map_or("", |labels| labels.backend),
                    "the renewal did not finish before the lease ended",
                );
                observability::renewal(state, Some((&error, false)));
                state.mark_lost(LostReason::RenewalFailed);
                return;
            }
        }
    }
}

/// The watchdog settings a guard derives from its options.
pub(crate) fn watchdog_settings(
    name: &crate::LockName,
    options: &crate::LockOptions,
    renewed_by_guard: bool,
) -> Watch {
    Watch {
        name: name.clone(),
        ttl: options.ttl(),
        renew_every: if renewed_by_guard {
            options.renewal_interval()
        } else {
            None
        },
        max_hold_until: deadline(tokio::time::Instant::now(), options.max_hold()),
    }
}
