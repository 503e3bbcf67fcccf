//! Holder inspection on MariaDB beyond the shared suite's `inspect::follows_a_hand_off`:
//! without fencing there is no token to report.

use crate::common;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_mysql::MySqlLock;

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
