//! Semaphores against a real Redis: what a permit is on the server (a member of the name's
//! sorted set scored on the server's clock, and the name's lock key marking the limit), that a
//! name used once leaves nothing, and that a lock and a semaphore never share a name.

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_redis::RedisLock;

use crate::fence::{raw, server};

/// The server's clock in ms.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

/// Two of three permits: two members of the permits set, each scored with the end of its
/// lease by the server's clock; the lock key says `#permits:3`; both keys expire with the
/// latest lease. Released, the name leaves no key at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_scored_on_the_servers_clock_and_leave_nothing() {
    let server = server();
    let mut conn = raw(&server).await;
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let name = LockName::new("permits-layout").unwrap();
    let keys = locks.keys(&name);
    let ttl = Duration::from_secs(30);
    let opts = LockOptions::new().with_ttl(ttl);
    let before = server_ms(&mut conn).await;
    let first = locks.acquire_permit(&name, 3, &opts).await.unwrap();
    let second = locks.acquire_permit(&name, 3, &opts).await.unwrap();
    let after = server_ms(&mut conn).await;
    let scores: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(keys.permits())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(scores.len(), 2, "{scores:?}");
    for (_, ends) in &scores {
        assert!(
            (before + 30_000..=after + 30_000).contains(ends),
            "a permit ending at {ends}, granted between {before} and {after} for 30 s"
        );
    }
    let mark: String = redis::cmd("GET")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(mark, "#permits:3");
    for key in [&keys.lock, &keys.permits()] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((1..=30_000).contains(&pttl), "{key}: PTTL {pttl}");
    }
    first.release().await.unwrap();
    second.release().await.unwrap();
    for key in [&keys.lock, &keys.permits()] {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{key} left after the last permit went back");
    }
}

/// A name held as a lock refuses a semaphore, and a name held as a semaphore refuses a lock,
/// at once (not after the wait timeout), naming both numbers; the holder keeps what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_and_a_semaphore_never_share_a_name() {
    let server = server();
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let waiting = LockOptions::new().with_wait_timeout(Duration::from_secs(3600));
    let mismatch = |result: Result<_, LockError>, asked: &str, in_use: &str| match result {
        Err(LockError::InvalidArgument { reason, .. }) => {
            assert!(
                reason.contains(asked) && reason.contains(in_use),
                "{reason}"
            );
        }
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    };

    let as_lock = LockName::new("held-as-lock").unwrap();
    let lock = locks.acquire(&as_lock, &LockOptions::new()).await.unwrap();
    mismatch(
        locks.acquire_permit(&as_lock, 3, &waiting).await,
        "3 permits",
        "a lock",
    );
    assert_eq!(locks.count_permits(&as_lock).await.unwrap(), 1);
    lock.release().await.unwrap();

    let as_semaphore = LockName::new("held-as-semaphore").unwrap();
    let permit = locks
        .acquire_permit(&as_semaphore, 3, &LockOptions::new())
        .await
        .unwrap();
    mismatch(
        locks.acquire(&as_semaphore, &waiting).await,
        "a lock",
        "3 permits",
    );
    mismatch(
        locks.acquire_permit(&as_semaphore, 4, &waiting).await,
        "4 permits",
        "3 permits",
    );
    assert_eq!(locks.count_permits(&as_semaphore).await.unwrap(), 1);
    permit.release().await.unwrap();
    assert_eq!(locks.count_permits(&as_semaphore).await.unwrap(), 0);
}
