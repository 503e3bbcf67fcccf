//! The one clock of a fault test: the host's `CLOCK_MONOTONIC`, in nanoseconds.
//!
//! Workers are separate processes, so their histories can only be compared on a clock they all
//! read. `CLOCK_MONOTONIC` is that clock: one counter per host, never set, never stepped, shared
//! by every process (outside time namespaces, which the fault suite does not use). Comparing
//! times from two workers is then exact up to the cost of the system call, which is what makes
//! "these two guards were valid at the same moment" a fact rather than a guess.
//!
//! A guard states its deadline as an [`Instant`] of its own process;
//! [`deadline_ns`] and [`tokio_deadline_ns`] carry it over to this clock by the time left until
//! it, so the value means the same in every process.

use std::time::{Duration, Instant};

/// Now, in nanoseconds of the host's `CLOCK_MONOTONIC`.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    let secs = u64::try_from(ts.tv_sec).expect("CLOCK_MONOTONIC is not negative");
    let nanos = u64::try_from(ts.tv_nsec).expect("tv_nsec is within 0..1e9");
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// A duration in whole nanoseconds, saturating at `u64::MAX` (585 years).
pub fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `deadline` (an instant of this process) on the host clock: now plus the time left until it,
/// or minus the time since it; saturating at 0 and `u64::MAX`.
pub fn deadline_ns(deadline: Instant) -> u64 {
    shift(now_ns(), deadline, Instant::now())
}

/// [`deadline_ns`] for a Tokio instant, such as a guard's `valid_until`. The time left is
/// measured on Tokio's clock, so under paused test time the result is "host now plus the
/// virtual time left", which only a real-time run can compare with other processes.
pub fn tokio_deadline_ns(deadline: tokio::time::Instant) -> u64 {
    shift(now_ns(), deadline, tokio::time::Instant::now())
}

// Each subtraction takes the earlier instant from the later one (the branch checks which).
#[allow(clippy::arithmetic_side_effects)]
fn shift<I>(now: u64, deadline: I, now_instant: I) -> u64
where
    I: Ord + Copy + std::ops::Sub<Output = Duration>,
{
    if deadline >= now_instant {
        now.saturating_add(duration_ns(deadline - now_instant))
    } else {
        now.saturating_sub(duration_ns(now_instant - deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_never_goes_back() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }

    /// Generous slack: the test checks the arithmetic, not the machine's speed.
    const SLACK: u64 = 200_000_000;

    #[test]
    fn a_future_deadline_lands_that_far_ahead() {
        let start = Instant::now();
        let before = now_ns();
        let at = deadline_ns(start + Duration::from_secs(1));
        let after = now_ns();
        assert!(at + SLACK >= before + 1_000_000_000, "{at} vs {before}");
        assert!(at <= after + 1_000_000_000, "{at} vs {after}");
    }

    #[test]
    fn a_past_deadline_lands_behind_now() {
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let at = deadline_ns(start);
        let now = now_ns();
        assert!(at + 20_000_000 <= now, "{at} vs {now}");
        assert!(at + SLACK >= now.saturating_sub(20_000_000));
    }

    #[test]
    fn tokio_deadlines_convert_the_same_way() {
        let before = now_ns();
        let at = tokio_deadline_ns(tokio::time::Instant::now() + Duration::from_secs(2));
        assert!(at + SLACK >= before + 2_000_000_000);
        assert!(at <= now_ns() + 2_000_000_000);
    }

    #[test]
    fn extremes_saturate() {
        let now = Instant::now();
        assert_eq!(shift(5, now, now + Duration::from_secs(1)), 0);
        assert_eq!(
            shift(u64::MAX - 1, now + Duration::from_secs(1), now),
            u64::MAX
        );
    }
}
