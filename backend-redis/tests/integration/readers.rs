//! Reader-writer locks against a real Redis: what a reader's share is on the server (a member of
//! the name's lease set scored on the server's clock, and the name's lock key saying
//! `#readers`), that a name read once leaves nothing, that a reader name refuses a semaphore,
//! and that a reader whose lease ended is trimmed while another reader renews, so a waiting
//! writer is kept out by live readers only.

use std::time::Duration;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions};
use dlock_conformance::wait_for::within;
use dlock_redis::{LockKeys, RedisLock};
use dlock_test_servers::RedisServer;

use crate::fence::{raw, server};
use crate::permits::{assert_gone, assert_leases_of_30s, server_ms};

const BOUND: Duration = Duration::from_secs(60);

/// A server of the test's own, a plain connection to it, a client, the test's name and its keys.
async fn fresh(
    name: &str,
) -> (
    RedisServer,
    redis::aio::MultiplexedConnection,
    RedisLock,
    LockName,
    LockKeys,
) {
    let server = server();
    let conn = raw(&server).await;
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let name = LockName::new(name).unwrap();
    let keys = locks.keys(&name);
    (server, conn, locks, name, keys)
}

/// The lease set's members and their scores, earliest first.
async fn shares(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Vec<(String, u64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .unwrap()
}

/// Two readers: two members of the name's lease set, each scored with the end of its lease by
/// the server's clock; the lock key says `#readers` and, with the set, expires with the latest
/// lease. A semaphore is refused on the name. Released, the name leaves no key but its fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_are_scored_on_the_servers_clock_and_leave_nothing() {
    let (_server, mut conn, locks, name, keys) = fresh("readers-layout").await;
    let opts = LockOptions::new().with_ttl(Duration::from_secs(30));
    let before = server_ms(&mut conn).await;
    let first = locks.read(&name, &opts).await.unwrap();
    let second = locks.read(&name, &opts).await.unwrap();
    let after = server_ms(&mut conn).await;
    assert!(second.fencing_token() > first.fencing_token());
    assert_leases_of_30s(&mut conn, &keys, "#readers", 2, (before, after)).await;
    let refused = locks.try_acquire_permit(&name, 2, &opts).await;
    assert!(
        matches!(refused, Err(LockError::InvalidArgument { .. })),
        "a semaphore on a reader name answered {refused:?}"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let permits = keys.permits();
    assert_gone(
        &mut conn,
        &[&keys.lock, &permits, &keys.queue, &keys.waiters],
    )
    .await;
}

/// madelson's shared-TTL bug: one key's TTL for every reader kept a crashed reader's share for
/// as long as another reader renewed. Here a forgotten reader's member ends with its own lease
/// and the waiting writer's recheck trims it while the renewing reader still holds; the writer
/// then comes in at that reader's release, with a token above both readers'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_reader_is_trimmed_while_another_renews_and_the_writer_gets_in() {
    let (_server, mut conn, locks, name, keys) = fresh("readers-trimmed").await;
    let forgotten = locks
        .try_read(&name, &LockOptions::new().with_ttl(Duration::from_secs(1)))
        .await
        .unwrap()
        .expect("a free name takes a reader");
    let forgotten_token = forgotten.fencing_token();
    forgotten.forget();
    let renewing = locks
        .try_read(&name, &LockOptions::new().with_ttl(Duration::from_secs(3)))
        .await
        .unwrap()
        .expect("a second reader shares");
    let first_end = shares(&mut conn, &keys.permits()).await;
    let writer = {
        let (locks, name) = (locks.clone(), name.clone());
        let opts = LockOptions::new().with_wait_timeout(BOUND);
        tokio::spawn(async move { locks.write(&name, &opts).await })
    };
    within(
        BOUND,
        "the forgotten share to be trimmed as the other renews",
        async {
            loop {
                let now = shares(&mut conn, &keys.permits()).await;
                let renewed = now.len() == 1
                    && first_end
                        .iter()
                        .any(|(owner, ends)| *owner == now[0].0 && now[0].1 > *ends);
                if renewed {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    assert!(
        !writer.is_finished(),
        "the writer got in beside a live reader"
    );
    let mark: String = redis::cmd("GET")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(mark, "#readers", "the live reader's mark");
    let renewing_token = renewing.fencing_token();
    renewing.release().await.unwrap();
    let writer = within(BOUND, "the writer after the live reader left", writer)
        .await
        .unwrap()
        .unwrap();
    assert!(writer.fencing_token() > renewing_token.max(forgotten_token));
    writer.release().await.unwrap();
}
