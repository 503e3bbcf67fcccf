//! dlock's metrics in Prometheus: installs `metrics-exporter-prometheus` as the `metrics`
//! recorder, runs a contended workload on the memory backend (20 tasks taking one lock 5 times
//! each, impatient try-acquires, a holder evicted from under its guard), and prints the scrape
//! a Prometheus server would read.
//!
//! `cargo run -p dlock-rs --features metrics --example prometheus`
//!
//! In a service, serve `handle.render()` on your `/metrics` route (or use the exporter's own
//! HTTP listener, its `http-listener` feature) instead of printing it. The metrics and their
//! labels are documented in `dlock::observability`.

use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLockExt, LockName, LockOptions, MemoryLock};
use metrics_exporter_prometheus::PrometheusBuilder;

const TASKS: usize = 20;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Buckets make the durations Prometheus histograms (without them the exporter renders
    // summaries, which cannot be aggregated across instances).
    let handle = PrometheusBuilder::new()
        .set_buckets(&[
            0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
        ])?
        .install_recorder()?;
    dlock::observability::describe_metrics();

    let locks = MemoryLock::new();
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(10));

    // Contention: every task wants the same coupon, so most acquires wait for a hand-off.
    let stock = Arc::new(tokio::sync::Mutex::new(TASKS * ROUNDS));
    let mut tasks: Vec<tokio::task::JoinHandle<dlock::Result<()>>> = Vec::new();
    for _ in 0..TASKS {
        let (locks, options, stock) = (locks.client(), options.clone(), stock.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locks.acquire_str("coupon:42", &options).await?;
                // Read, change, commit: the lock, not this mutex, is what keeps it exact.
                let left = *stock.lock().await;
                tokio::time::sleep(Duration::from_micros(200)).await;
                *stock.lock().await = left - 1;
                guard.release().await?;
            }
            Ok(())
        }));
    }
    // Impatient callers: a try-acquire that finds the coupon busy counts as an attempt without a
    // grant, which is how the scrape shows contention.
    let mut busy = 0;
    for _ in 0..10 {
        match locks.try_acquire_str("coupon:42", &options).await? {
            Some(guard) => guard.release().await?,
            None => busy += 1,
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for task in tasks {
        task.await??;
    }

    // A holder whose lease the server ends (a crashed node, an expired session): one loss.
    let evicted = locks.acquire_str("report:nightly", &options).await?;
    locks.evict(&LockName::new("report:nightly")?);
    let reason = evicted.lost().await;
    let _ = evicted.release().await;

    println!(
        "# {} coupons left, {busy} busy try-acquires, evicted holder lost: {reason}\n",
        *stock.lock().await
    );
    print!("{}", handle.render());
    Ok(())
}
