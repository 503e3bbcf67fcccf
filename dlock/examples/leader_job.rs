//! A job that must run on one instance only (a nightly report, a cache rebuild): every instance
//! tries the job's lock each round, the one that gets it runs the job under `with_lock` (the
//! job is stopped if the lock is lost, and the lock released only once it is done), and the
//! others skip the round.
//!
//! `DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-rs --features redis --example leader_job`
//! runs three instances in this process against that backend (start it in several processes to
//! see the same across machines); without `DLOCK_URL` it uses the in-process memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock::{DistributedLock, DistributedLockExt, LockOptions};

const ROUNDS: usize = 5;
const INSTANCES: usize = 3;

/// One instance's share of a round: run the job if this instance gets its lock, else skip it.
async fn round(
    locks: Arc<dyn DistributedLock>,
    instance: usize,
    round: usize,
    ran: Arc<AtomicUsize>,
) -> dlock::Result<()> {
    // Not waiting: if another instance has the job this round, this one has nothing to do.
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait_timeout(Duration::ZERO);
    let job = format!("jobs/nightly-report/{round}");
    let outcome = locks
        .with_lock(job.as_str(), &options, |lock| async move {
            println!(
                "round {round}: instance {instance} runs the job (fencing token {})",
                lock.fencing_token()
            );
            // The job itself: long enough that the other instances try while it runs.
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await;
    match outcome {
        Ok(()) => {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        Err(dlock::LockError::Timeout { .. }) => {
            println!("round {round}: instance {instance} skips (another instance has it)");
            Ok(())
        }
        Err(other) => Err(other),
    }
}

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://leader-job".to_owned());
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        // Each instance has its own client, as separate processes would.
        instances.push(dlock::connect(&url).await?);
    }
    for round_no in 0..ROUNDS {
        let ran = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for (instance, locks) in instances.iter().enumerate() {
            tasks.spawn(round(locks.clone(), instance, round_no, ran.clone()));
        }
        while let Some(outcome) = tasks.join_next().await {
            outcome.expect("an instance panicked")?;
        }
        let ran = ran.load(Ordering::SeqCst);
        println!("round {round_no}: the job ran {ran} time(s)");
        assert_eq!(ran, 1, "exactly one instance runs each round");
    }
    Ok(())
}
