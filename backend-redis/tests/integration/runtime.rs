//! A guard whose renewal ran on a tokio runtime that shut down, held on from another runtime:
//! nothing renews its key any more, so it must say so, lost, by the end of its lease, and the
//! lock must then be free for another client (the conformance suite's runtime case checks the
//! rest: the client connects again, a guard released soon after the end still releases).

use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_conformance::on_a_runtime_of_its_own;
use dlock_redis::RedisLock;

const TTL: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(30);

fn url() -> String {
    std::env::var("DLOCK_TEST_REDIS_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_redis().url())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_renewal_died_with_its_runtime_is_told_lost_when_its_lease_ends() {
    let name = LockName::new(format!("dlock-runtime/{}/renewal", std::process::id())).unwrap();
    let (client, guard) = on_a_runtime_of_its_own({
        let (url, name) = (url(), name.clone());
        move || async move {
            let client = RedisLock::connect_url(&url).await.unwrap();
            let guard = client
                .acquire(&name, &LockOptions::new().with_ttl(TTL))
                .await
                .unwrap();
            // Past the first renewal (a third of the TTL): the watchdog runs on this runtime.
            tokio::time::sleep(TTL / 2).await;
            assert!(guard.is_held());
            (client, guard)
        }
    })
    .await;
    tokio::time::timeout(BOUND, guard.lost())
        .await
        .expect("a guard nothing renews any more is told lost by the end of its lease");
    assert!(!guard.is_held());
    let other = RedisLock::connect_url(&url()).await.unwrap();
    let next = other
        .acquire(&name, &LockOptions::new().with_wait_timeout(BOUND))
        .await
        .expect("the lock is free once its lease ended");
    next.release().await.unwrap();
    // The client itself goes on, on this runtime.
    client
        .acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(guard.release().await.is_err());
}
