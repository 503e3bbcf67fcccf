//! The contended hand-off loop, written once: `dlock bench` runs dlock's clients through it, and
//! the floors of MySQL's `GET_LOCK`, Postgres's `pg_advisory_lock` and Redis's notified
//! `SET NX` run raw connections through the same loop, so both sides of the ratio are measured
//! the same way: as many contenders, each holding as long, each release with waiters.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::{LockError, Result};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One contender for a lock: takes it, waiting as long as it takes, and lets it go.
pub(crate) trait Contender: Send + 'static {
    /// Takes the lock (waits while someone else holds it).
    fn lock(&mut self) -> impl Future<Output = Result<()>> + Send;
    /// Lets the lock go.
    fn unlock(&mut self) -> impl Future<Output = Result<()>> + Send;
}

/// Who holds the lock, and when the last holder let go.
#[derive(Default)]
struct Baton {
    released_at: Option<Instant>,
    generation: u64,
    samples: Vec<Duration>,
}

/// Runs the contenders for `duration`, each holding the lock `hold` and, after letting it go,
/// waiting until someone else holds it before competing again (so every release has waiters).
/// Returns each hand-off (the previous holder starting its release to the next holder's lock
/// returning) and how long it all took.
///
/// # Errors
/// The first error a contender returns.
///
/// # Cancel safety
/// Not cancel safe: dropping it leaves the contenders running until their deadline.
pub(crate) async fn contend<C: Contender>(
    contenders: Vec<C>,
    duration: Duration,
    hold: Duration,
) -> Result<(Vec<Duration>, Duration)> {
    let baton = Arc::new(Mutex::new(Baton::default()));
    let changed = Arc::new(Notify::new());
    let started = Instant::now();
    let deadline = dlock_api::raw::time::after(started, duration);
    let mut workers = Vec::new();
    for mut contender in contenders {
        let (baton, changed) = (baton.clone(), changed.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                contender.lock().await?;
                let acquired = Instant::now();
                {
                    let mut b = baton.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(released) = b.released_at.take() {
                        b.samples.push(acquired.saturating_duration_since(released));
                    }
                    b.generation = b.generation.wrapping_add(1);
                }
                changed.notify_waiters();
                tokio::time::sleep(hold).await;
                let mine = {
                    let mut b = baton.lock().unwrap_or_else(|e| e.into_inner());
                    b.released_at = Some(Instant::now());
                    b.generation
                };
                contender.unlock().await?;
                while Instant::now() < deadline {
                    let notified = changed.notified();
                    if baton.lock().unwrap_or_else(|e| e.into_inner()).generation != mine {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
                }
            }
            Ok::<(), LockError>(())
        }));
    }
    let mut failed = None;
    for worker in workers {
        let outcome = worker
            .await
            .map_err(|e| LockError::backend("dlock", e))
            .and_then(|done| done);
        if let Err(error) = outcome {
            failed.get_or_insert(error);
        }
    }
    if let Some(error) = failed {
        return Err(error);
    }
    let elapsed = started.elapsed();
    let samples = std::mem::take(&mut baton.lock().unwrap_or_else(|e| e.into_inner()).samples);
    Ok((samples, elapsed))
}
