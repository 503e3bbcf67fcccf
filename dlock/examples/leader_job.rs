//! A job that must run on one instance only (a scheduler, a nightly report), handed over when
//! its instance stops: every instance campaigns for the job's election, the leader runs the job
//! under `with_leadership` with its **term** (a fencing token) on every write, and the next
//! candidate takes over when the leader resigns, or its lease or session ends. An observer
//! prints every change of leader.
//!
//! `DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-rs --features redis --example leader_job`
//! runs three instances in this process against that backend (start it in several processes to
//! see the same across machines); without `DLOCK_URL` it uses the in-process memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock::{DistributedLock, DistributedLockExt, LeaderEvent, LockOptions};
use futures::StreamExt;

const INSTANCES: usize = 3;

/// One instance: stand for election, run the job while leading, step down after a while (as an
/// instance being redeployed would).
async fn instance(
    locks: Arc<dyn DistributedLock>,
    id: usize,
    leading: Arc<AtomicUsize>,
) -> dlock::Result<u64> {
    let options = LockOptions::new().with_ttl(Duration::from_secs(10));
    let value = format!("instance-{id}");
    locks
        .with_leadership(
            "jobs/scheduler",
            value.as_bytes(),
            &options,
            |ctx| async move {
                let at_once = leading.fetch_add(1, Ordering::SeqCst) + 1;
                assert_eq!(at_once, 1, "two instances lead at once");
                let term = ctx.fencing_token();
                for tick in 0..3 {
                    // Every write the job makes carries the term: storage that keeps the highest
                    // term it has seen refuses a deposed leader (`dlock::FencingGate`).
                    println!("instance {id} (term {term}): tick {tick}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                leading.fetch_sub(1, Ordering::SeqCst);
                term.get()
            },
        )
        .await
}

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://leader-job".to_owned());
    let observer = dlock::connect(&url).await?;
    let mut changes = observer.observe(&"jobs/scheduler".try_into()?).await?;
    let watching = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            match change {
                Ok(LeaderEvent::Leads(leader)) => println!("observer: {leader} leads"),
                Ok(LeaderEvent::Vacant) => println!("observer: nobody leads"),
                Ok(other) => println!("observer: {other:?}"),
                Err(error) => println!("observer: {error}"),
            }
        }
    });
    let leading = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..INSTANCES {
        // Each instance has its own client, as separate processes would.
        let locks = dlock::connect(&url).await?;
        tasks.spawn(instance(locks, id, leading.clone()));
    }
    let mut terms = Vec::new();
    while let Some(outcome) = tasks.join_next().await {
        terms.push(outcome.expect("an instance panicked")?);
    }
    terms.sort_unstable();
    terms.dedup();
    assert_eq!(
        terms.len(),
        INSTANCES,
        "every instance led once, each in a term of its own"
    );
    println!("terms, in order: {terms:?}");
    watching.abort();
    Ok(())
}
