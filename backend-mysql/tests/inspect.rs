//! Holder inspection against a real MariaDB: free, held (the guard's token from the fence row,
//! the holder's connection id, no lease: the connection is the lease), waiting clients counted
//! from performance_schema, handed off, released; without fencing, no token.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, Inspection, LockName, LockOptions};
use dlock_mysql::MySqlLock;

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
    let harness = common::MySqlHarness::shared();
    let locks = MySqlLock::connect_url(harness.url()).await.unwrap();
    assert!(DistributedLock::capabilities(&locks).inspect);
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
    assert_eq!(seen.remaining, None, "a session lease has no TTL");
    assert_eq!(seen.waiters, Some(0));
    let id = locks
        .holder_connection_id(&name)
        .expect("this client holds it");
    assert_eq!(seen.holder, Some(format!("connection {id}")));

    // Two waiting clients, each with a GET_LOCK waiting at the server.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let client: Arc<dyn DistributedLock> =
            Arc::new(MySqlLock::connect_url(harness.url()).await.unwrap());
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.push(tokio::spawn(
            async move { client.acquire(&wanted, &opts).await },
        ));
        waiters_reach(&locks, &name, waiting.len()).await;
    }

    // Released: one waiter holds it with a higher token, the other still waits.
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let mut seen = locks.inspect(&name).await.unwrap();
    for _ in 0..500 {
        if seen.held && seen.token.is_some_and(|t| t > first) {
            break;
        }
        // The grant and its fence row land in one statement; wait for it to commit.
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen = locks.inspect(&name).await.unwrap();
    }
    assert!(seen.held && seen.token.unwrap() > first, "{seen:?}");
    assert_ne!(seen.holder, Some(format!("connection {id}")));
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
async fn without_fencing_there_is_no_token() {
    let harness = common::MySqlHarness::shared();
    let url = format!("{}?fencing=false", harness.url());
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    let name = LockName::new(format!("dlock-test/inspect-plain/{}", std::process::id())).unwrap();
    let guard = locks
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held);
    assert_eq!(seen.token, None);
    guard.release().await.unwrap();
    assert!(!locks.inspect(&name).await.unwrap().held);
}
