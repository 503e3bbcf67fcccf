//! Holder inspection against a real Redis (one node, and a Cluster): free, held (the guard's
//! token, the lease left, the owner), waiters counted, handed off, released.

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

async fn inspect_through_a_hand_off(harness: &common::RedisHarness, label: &str) {
    let locks = harness.client().await.unwrap();
    assert!(locks.capabilities().inspect);
    let name = LockName::new(format!("dlock-test/inspect/{label}/{}", std::process::id())).unwrap();
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
    let left = seen.remaining.expect("a TTL lease has time left");
    assert!(left > Duration::ZERO && left <= TTL, "{left:?}");
    assert_eq!(seen.waiters, Some(0));
    let owner = seen.holder.expect("the owner value");
    assert_eq!(owner.len(), 32, "{owner}");

    // Two waiters on clients of their own.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let client: Arc<dyn DistributedLock> = harness.client().await.unwrap();
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.push(tokio::spawn(
            async move { client.acquire(&wanted, &opts).await },
        ));
        waiters_reach(&*locks, &name, waiting.len()).await;
    }

    // Released: granted to the first waiter, with a higher token; one still waits.
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert!(seen.token.unwrap() > first, "{seen:?}");
    assert_ne!(seen.holder.as_deref(), Some(owner.as_str()));
    assert_eq!(seen.waiters, Some(1));

    for task in waiting {
        task.await.unwrap().unwrap().release().await.unwrap();
    }
    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );
}

#[tokio::test]
async fn inspect_on_one_node() {
    inspect_through_a_hand_off(&common::RedisHarness::single(), "single").await;
}

#[tokio::test]
async fn inspect_on_a_cluster() {
    inspect_through_a_hand_off(&common::RedisHarness::cluster(), "cluster").await;
}
