//! Holder inspection against a real ZooKeeper: free, held (the guard's token is the node's
//! `czxid`, the holder its session), waiters counted by their nodes, handed off to the one the
//! inspection named, released.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, Inspection, LockName, LockOptions};
use dlock_zookeeper::ZkLock;

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

fn holder(client: &ZkLock) -> String {
    format!("session {:#x}", client.session_id().expect("a session"))
}

#[tokio::test]
async fn inspect_through_a_hand_off() {
    let harness = common::ZkHarness::standalone();
    let locks = harness.zk_client().await.unwrap();
    assert!(locks.capabilities().inspect);
    let name = LockName::new(format!("dlock-test/inspect/{}", std::process::id())).unwrap();
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(30));

    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );

    let guard = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(seen.token, Some(guard.fencing_token()));
    assert_eq!(seen.remaining, None, "the lease is the session");
    assert_eq!(seen.waiters, Some(0));
    assert_eq!(seen.holder, Some(holder(&locks)));

    // Two waiters on clients (sessions) of their own: one node each behind the holder's.
    let mut waiting = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let client = harness.zk_client().await.unwrap();
        sessions.push(holder(&client));
        let client: Arc<dyn DistributedLock> = client;
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.push(tokio::spawn(
            async move { client.acquire(&wanted, &opts).await },
        ));
        waiters_reach(&*locks, &name, waiting.len()).await;
    }
    let seen = locks.inspect(&name).await.unwrap();
    assert_eq!(seen.holder, Some(holder(&locks)), "still the first holder");

    // Released: the first waiter's node is the lowest, with a higher czxid; one still waits.
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert!(seen.token.unwrap() > first, "{seen:?}");
    assert_eq!(seen.holder.as_ref(), Some(&sessions[0]), "the first waiter");
    assert_eq!(seen.remaining, None);
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
