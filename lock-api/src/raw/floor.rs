//! [`sample`]: the measuring loop every backend's raw-floor helper runs, written once.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;

/// Round trips run before measuring, so connections, caches and prepared statements are warm.
pub const WARM_UP: usize = 50;

/// Runs `pair` (one raw lock-and-unlock of the backend's protocol) [`WARM_UP`] times, then back
/// to back for `duration`, and returns each measured pair's latency: what `dlock bench` compares
/// a backend's own acquire and release with.
///
/// # Errors
/// The first error `pair` returns.
///
/// # Cancel safety
/// Cancel safe as far as `pair` is: dropping it drops the pair in flight.
pub async fn sample(
    duration: Duration,
    mut pair: impl AsyncFnMut() -> Result<()>,
) -> Result<Vec<Duration>> {
    for _ in 0..WARM_UP {
        pair().await?;
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        pair().await?;
        samples.push(t.elapsed());
    }
    Ok(samples)
}

/// Runs `handoff` (one hand-off of the lock between two connections, returning its latency),
/// alternating direction (`true`: the first connection hands to the second), warming up for
/// 300 ms (at most `duration`), then for `duration`, and returns the measured latencies: the
/// hand-off floor loop of the backends whose servers queue waiters themselves.
///
/// # Errors
/// The first error `handoff` returns.
///
/// # Cancel safety
/// Cancel safe as far as `handoff` is: dropping it drops the hand-off in flight.
pub async fn sample_handoffs(
    duration: Duration,
    mut handoff: impl AsyncFnMut(bool) -> Result<Duration>,
) -> Result<Vec<Duration>> {
    let mut samples = Vec::new();
    let warm_until =
        crate::raw::time::after(Instant::now(), Duration::from_millis(300).min(duration));
    let until = crate::raw::time::after(warm_until, duration);
    let mut forward = true;
    while Instant::now() < until {
        let took = handoff(forward).await?;
        forward = !forward;
        if Instant::now() > warm_until {
            samples.push(took);
        }
    }
    Ok(samples)
}
