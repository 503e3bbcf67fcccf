//! Holder inspection on Postgres beyond the shared suite's `inspect::follows_a_hand_off`:
//! integer keys (`inspect_key`), and the holder named by its backend pid as `pg_locks` has it.

use crate::common;

use dlock_api::LockOptions;
use dlock_postgres::{AdvisoryKey, PostgresLock};

async fn holder_pid(url: &str, key: &AdvisoryKey) -> i32 {
    common::holder_pid(url, key).await.expect("a holder row")
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
