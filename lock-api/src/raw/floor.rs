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
