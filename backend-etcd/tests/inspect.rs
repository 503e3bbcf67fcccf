//! Holder inspection against a real etcd: free, held (the guard's token is the key's create
//! revision, the lease's time to live, the lease id), waiters counted by their keys, handed off,
//! released.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, Inspection, LockName, LockOptions};
use dlock_conformance::Harness;

const TTL: Duration = Duration::from_secs(10);

async fn waiters_reach(locks: &dyn DistributedLock, name: &LockName, want: usize) {
    let mut seen = None;
    for _ in 0..1_000 {
        seen = locks.inspect(name).await.unwrap().waiters;
        if seen == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("waiters never reached {want}: last seen {seen:?}");
}

#[tokio::test]
async fn inspect_through_a_hand_off() {
    let harness = common::EtcdHarness::single();
    let locks = harness.client().await.unwrap();
    assert!(locks.capabilities().inspect);
    let name = LockName::new(format!("dlock-test/inspect/{}", std::process::id())).unwrap();
    let opts = LockOptions::new()
        .with_ttl(TTL)
        .with_wait_timeout(Duration::from_secs(30));

    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );

    let guard = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(seen.token, Some(guard.fencing_token()));
    let left = seen.remaining.expect("the lease's time to live");
    assert!(left > Duration::ZERO && left <= TTL, "{left:?}");
    assert_eq!(seen.waiters, Some(0));
    let lease = seen.holder.expect("the holder's lease");
    assert!(lease.starts_with("lease "), "{lease}");

    // Two waiters on clients of their own: one key each behind the holder's.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let client: Arc<dyn DistributedLock> = harness.client().await.unwrap();
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.push(tokio::spawn(
            async move { client.acquire(&wanted, &opts).await },
        ));
        waiters_reach(&*locks, &name, waiting.len()).await;
    }

    // Released: the first waiter's key is the oldest, with a higher revision; one still waits.
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert!(seen.token.unwrap() > first, "{seen:?}");
    assert_ne!(seen.holder.as_deref(), Some(lease.as_str()));
    assert_eq!(seen.waiters, Some(1));

    let mut tokens = Vec::new();
    for task in waiting {
        let guard = task.await.unwrap().unwrap();
        tokens.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    assert_eq!(
        Some(tokens[0]),
        seen.token,
        "inspection named the next holder"
    );
    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );
}
