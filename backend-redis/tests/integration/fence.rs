//! The fence key against a real Redis: it can expire, and a name used once leaves nothing behind
//! without an expiry. A lock per order id (the coupon and purchase scenarios) must not grow the
//! server without end, and tokens must still rise when a fence is gone.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_redis::RedisLock;
use dlock_test_servers::RedisServer;
use futures::StreamExt;

const BOUND: Duration = Duration::from_secs(60);

pub(crate) fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Waits (within the bound) until `count` waiters are queued for `name`.
async fn until_waiters(locks: &RedisLock, name: &LockName, count: usize) {
    dlock_conformance::wait_for::within(BOUND, "the waiter to queue", async {
        while locks.inspect(name).await.unwrap().waiters != Some(count) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The fence of a name deleted between grants, on the first attempt's path (nobody waiting) and on
/// the full acquire's (a waiter queued, the lock handed over): the next token is still above every
/// earlier one, since tokens are floored at the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_deleted_mid_stream_still_gives_rising_tokens() {
    let server = server();
    let mut conn = raw(&server).await;
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let name = LockName::new("fence-deleted").unwrap();
    let fence = locks.keys(&name).fence;
    let mut last = 0;
    for round in 0..6 {
        let guard = locks.acquire(&name, &LockOptions::new()).await.unwrap();
        let token = guard.fencing_token().get();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        if round % 2 == 1 {
            // A waiter queues: the release hands the lock over through the full scripts.
            let waiter = dlock_conformance::wait_for::spawned_acquire(BOUND, &locks, &name);
            until_waiters(&locks, &name, 1).await;
            let _: () = redis::cmd("DEL")
                .arg(&fence)
                .query_async(&mut conn)
                .await
                .unwrap();
            guard.release().await.unwrap();
            let next = waiter.await.unwrap().unwrap();
            let token = next.fencing_token().get();
            assert!(token > last, "handed over: token {token} after {last}");
            last = token;
            next.release().await.unwrap();
        } else {
            guard.release().await.unwrap();
        }
        let _: () = redis::cmd("DEL")
            .arg(&fence)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Ten thousand names, each acquired and released once (one in a hundred with a waiter that
/// queued behind its holder), leave no key without an expiry: the fence of a name used once was
/// kept for ever (72 bytes by `MEMORY USAGE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_used_once_leave_nothing_without_an_expiry() {
    let server = server();
    let locks = Arc::new(RedisLock::connect_url(&server.url()).await.unwrap());
    let used = futures::stream::iter(0..10_000)
        .map(|i| {
            let locks = locks.clone();
            async move {
                let name = LockName::new(format!("order-{i}")).unwrap();
                let guard = locks.acquire(&name, &LockOptions::new()).await.unwrap();
                if i % 100 == 0 {
                    let waiter =
                        dlock_conformance::wait_for::spawned_acquire(BOUND, &*locks, &name);
                    until_waiters(&locks, &name, 1).await;
                    guard.release().await.unwrap();
                    waiter.await.unwrap().unwrap().release().await.unwrap();
                } else {
                    guard.release().await.unwrap();
                }
            }
        })
        .buffer_unordered(32)
        .count();
    tokio::time::timeout(BOUND * 5, used)
        .await
        .expect("10,000 names used once");
    dlock_api::settle().await;
    let forever = tokio::task::block_in_place(|| server.keys_without_expiry()).unwrap();
    assert!(
        forever.is_empty(),
        "{} keys without an expiry, e.g. {:?}",
        forever.len(),
        &forever[..forever.len().min(5)]
    );
}
