//! Deadlines from user-supplied durations, without overflow.
//!
//! `Instant + Duration` panics when the sum does not fit the clock, and a user may pass any
//! duration (`Duration::MAX` is how a Rust user says "no limit", as in tokio). Every deadline a
//! backend computes from an option or a config value goes through these two functions; no backend
//! adds a user-supplied duration to an instant by itself.

use std::time::Duration;

use tokio::time::Instant;

/// Beyond this, a wait or hold counts as "no limit": no process lives that long, and every
/// instant this far ahead still fits the clock.
pub const UNREACHABLE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The deadline `limit` after `start`, or `None` when there is no limit: `limit` is `None`, or
/// so long that it cannot be reached ([`UNREACHABLE`] or more, such as `Duration::MAX`).
pub fn deadline(start: Instant, limit: Option<Duration>) -> Option<Instant> {
    limit
        .filter(|limit| *limit < UNREACHABLE)
        .and_then(|limit| start.checked_add(limit))
}

/// The instant `delay` after `start`, for a wake-up or a timer: a delay of [`UNREACHABLE`] or
/// more is cut to it, so the result always fits the clock.
pub fn after(start: Instant, delay: Duration) -> Instant {
    let delay = delay.min(UNREACHABLE);
    start
        .checked_add(delay)
        .or_else(|| start.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extreme_durations_mean_no_limit() {
        let now = Instant::now();
        assert_eq!(deadline(now, Some(Duration::MAX)), None);
        assert_eq!(deadline(now, Some(Duration::from_millis(u64::MAX))), None);
        assert_eq!(deadline(now, None), None);
        assert_eq!(
            deadline(now, Some(Duration::from_secs(1))),
            Some(now + Duration::from_secs(1))
        );
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(3600));
        assert_eq!(after(now, Duration::ZERO), now);
    }
}
