//! The grant queue against a real Redis, where a lock is free but waiters are queued (its holder's
//! lease ran out rather than being released): a new acquire does not jump a live waiter, and
//! waiters whose presence lapsed are dropped so that they cannot keep the lock from anyone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_redis::RedisLock;

fn url() -> String {
    std::env::var("DLOCK_TEST_REDIS_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_redis().url())
}

/// Queues `owner` as a waiter of `keys`' lock by hand, present until `deadline_ms` (Unix ms), as
/// a waiting client's script would.
async fn queue_waiter(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &dlock_redis::LockKeys,
    owner: &str,
    deadline_ms: u128,
) {
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(&keys.waiters)
        .arg(owner)
        .arg(format!("{deadline_ms}:30000"))
        .ignore()
        .cmd("RPUSH")
        .arg(&keys.queue)
        .arg(owner)
        .ignore()
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn free_lock_goes_to_a_live_waiter_first_and_lapsed_waiters_are_dropped() {
    let lock = RedisLock::connect_url(&url()).await.unwrap();
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let name = LockName::new(format!("dlock-test/queue/{}", std::process::id())).unwrap();
    let keys = lock.keys(&name);
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));

    // A live waiter is first in line and nobody holds the lock.
    queue_waiter(&mut conn, &keys, "live-waiter", now_ms + 60_000).await;
    assert!(
        lock.try_acquire(&name, &options).await.unwrap().is_none(),
        "a try_acquire jumped a live waiter"
    );

    // Its presence lapses: the next acquire drops it and takes the lock.
    let _: i64 = redis::cmd("HSET")
        .arg(&keys.waiters)
        .arg("live-waiter")
        .arg("1:30000")
        .query_async(&mut conn)
        .await
        .unwrap();
    let guard = lock
        .try_acquire(&name, &options)
        .await
        .unwrap()
        .expect("a lapsed waiter kept the free lock from a new acquire");
    let queued: i64 = redis::cmd("LLEN")
        .arg(&keys.queue)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, 0, "the lapsed waiter is still queued");
    guard.release().await.unwrap();
}
