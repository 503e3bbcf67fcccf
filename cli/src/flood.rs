//! `dlock bench --flood TASKS`: thousands of tasks on a few clients over a few dozen names, each
//! acquiring once with a short wait timeout. It shows whether waiters queue well: every acquire
//! the server could serve within the wait timeout should succeed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};

/// What a flood measured.
pub(super) struct Flood {
    pub(super) acquired: usize,
    pub(super) timed_out: usize,
    pub(super) failed: usize,
    /// Acquire latencies of the successful acquires, in µs, sorted.
    pub(super) micros: Vec<f64>,
    pub(super) elapsed: Duration,
}

impl Flood {
    pub(super) fn percentile(&self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return 0.0;
        }
        let last = self.micros.len().saturating_sub(1);
        let rank = ((p / 100.0) * last as f64).round() as usize;
        self.micros[rank.min(last)]
    }
}

/// Starts `tasks` tasks at once, spread over `clients` and `names` names; each acquires with
/// `wait`, holds `hold` and releases.
pub(super) async fn flood(
    clients: Vec<Arc<dyn DistributedLock>>,
    run: &str,
    names: usize,
    tasks: usize,
    wait: Duration,
    hold: Duration,
) -> Result<Flood, LockError> {
    let names: Vec<LockName> = (0..names.max(1))
        .map(|i| LockName::new(format!("{run}/flood/{i}")))
        .collect::<Result<_, _>>()?;
    let opts = LockOptions::new().with_wait_timeout(wait);
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let client = clients[t.checked_rem(clients.len()).unwrap_or(0)].clone();
        let name = names[t.checked_rem(names.len()).unwrap_or(0)].clone();
        let opts = opts.clone();
        set.spawn(async move {
            let begun = Instant::now();
            let guard = client.acquire(&name, &opts).await?;
            let took = begun.elapsed();
            tokio::time::sleep(hold).await;
            guard.release().await?;
            Ok::<Duration, LockError>(took)
        });
    }
    let mut flood = Flood {
        acquired: 0,
        timed_out: 0,
        failed: 0,
        micros: Vec::with_capacity(tasks),
        elapsed: Duration::ZERO,
    };
    while let Some(outcome) = set.join_next().await {
        match outcome {
            Ok(Ok(took)) => {
                flood.acquired = flood.acquired.saturating_add(1);
                flood.micros.push(took.as_secs_f64() * 1e6);
            }
            Ok(Err(LockError::Timeout { .. })) => {
                flood.timed_out = flood.timed_out.saturating_add(1);
            }
            Ok(Err(error)) => {
                if flood.failed == 0 {
                    eprintln!("dlock bench --flood: first failure: {error}");
                }
                flood.failed = flood.failed.saturating_add(1);
            }
            Err(_) => flood.failed = flood.failed.saturating_add(1),
        }
    }
    flood.elapsed = started.elapsed();
    flood.micros.sort_by(f64::total_cmp);
    Ok(flood)
}
