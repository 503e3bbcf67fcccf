//! Holder inspection against a real Postgres: free, held (the holder's backend pid from
//! `pg_locks`; no lease, the connection is the lease; no token, the fence sequence is shared by
//! every name), waiting clients counted, handed off, released; integer keys too.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, Inspection, LockName, LockOptions};
use dlock_postgres::{AdvisoryKey, PostgresLock};
use sqlx::Row;

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

/// The pid `pg_locks` shows holding `key`, read independently.
async fn holder_pid(url: &str, key: &AdvisoryKey) -> i32 {
    let (classid, objid, objsubid) = key.pg_locks_ids();
    let mut conn = common::sql(url).await;
    sqlx::query(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = $3",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(objsubid)
    .fetch_one(&mut conn)
    .await
    .expect("a holder row")
    .get(0)
}

#[tokio::test]
async fn inspect_through_a_hand_off() {
    let url = common::shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    assert!(DistributedLock::capabilities(&locks).inspect);
    let name = LockName::new(common::unique("inspect")).unwrap();
    let key = AdvisoryKey::Name(name.clone());
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(30));

    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );

    let guard = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(seen.token, None, "the server keeps no token per name");
    assert_eq!(seen.remaining, None, "a session lease has no TTL");
    assert_eq!(seen.waiters, Some(0));
    let pid = holder_pid(&url, &key).await;
    assert_eq!(seen.holder, Some(format!("pid {pid}")));

    // Two waiting clients, each with a pg_advisory_lock waiting at the server.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let client: Arc<dyn DistributedLock> =
            Arc::new(PostgresLock::connect_url(&url).await.unwrap());
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.push(tokio::spawn(
            async move { client.acquire(&wanted, &opts).await },
        ));
        waiters_reach(&locks, &name, waiting.len()).await;
    }

    // Released: one waiter holds it, the other still waits.
    guard.release().await.unwrap();
    let mut seen = locks.inspect(&name).await.unwrap();
    for _ in 0..500 {
        if seen.held && seen.waiters == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen = locks.inspect(&name).await.unwrap();
    }
    assert!(seen.held && seen.waiters == Some(1), "{seen:?}");
    assert_ne!(seen.holder, Some(format!("pid {pid}")));

    for task in waiting {
        task.await.unwrap().unwrap().release().await.unwrap();
    }
    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );
}

#[tokio::test]
async fn inspect_an_integer_key() {
    let url = common::shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let key = AdvisoryKey::Pair(7_007, rand::random::<i32>());
    assert!(!locks.inspect_key(&key).await.unwrap().held);
    let guard = locks
        .try_acquire_key(&key, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let seen = locks.inspect_key(&key).await.unwrap();
    assert!(seen.held);
    assert_eq!(
        seen.holder,
        Some(format!("pid {}", holder_pid(&url, &key).await))
    );
    guard.release().await.unwrap();
    assert!(!locks.inspect_key(&key).await.unwrap().held);
}
