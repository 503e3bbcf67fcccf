//! Semaphores against a real Redis: what a permit is on the server (a member of the name's
//! sorted set scored on the server's clock, and the name's lock key marking the limit), that a
//! name used once leaves nothing, that a lock and a semaphore never share a name, and that
//! waiters are served in the order they queued, past waiters that left or vanished, each woken by
//! the release that grants it its permit and by no other.

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use dlock_redis::{LockKeys, RedisLock};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::fence::{raw, server};

/// The server's clock in ms.
pub(crate) async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

/// The name's lease set holds `count` members, each scored with the end of a 30 s lease granted
/// between `before` and `after` on the server's clock; the lock key says `mark`; both keys
/// expire within 30 s.
pub(crate) async fn assert_leases_of_30s(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &LockKeys,
    mark: &str,
    count: usize,
    (before, after): (u64, u64),
) {
    let scores: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(keys.permits())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(scores.len(), count, "{scores:?}");
    for (_, ends) in &scores {
        assert!(
            (before + 30_000..=after + 30_000).contains(ends),
            "a lease ending at {ends}, granted between {before} and {after} for 30 s"
        );
    }
    let found: String = redis::cmd("GET")
        .arg(&keys.lock)
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(found, mark);
    for key in [&keys.lock, &keys.permits()] {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap();
        assert!((1..=30_000).contains(&pttl), "{key}: PTTL {pttl}");
    }
}

/// None of `keys` is on the server any more.
pub(crate) async fn assert_gone(conn: &mut redis::aio::MultiplexedConnection, keys: &[&str]) {
    for key in keys {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{key} left after the last lease went");
    }
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
    assert_leases_of_30s(&mut conn, &keys, "#permits:3", 2, (before, after)).await;
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert_gone(&mut conn, &[&keys.lock, &keys.permits()]).await;
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

/// Bound on every wait below: generous, as the machine may be loaded; none is a timed assertion.
const BOUND: Duration = Duration::from_secs(60);

/// Starts a waiter for one of `limit` permits of `name` on a client of its own, which sends its
/// `label` and permit on `granted` once it holds it; returns once the server counts it as one
/// more live waiter in the name's queue (`queued` then).
async fn queue_waiter(
    url: &str,
    name: &LockName,
    limit: u32,
    label: &'static str,
    queued: usize,
    granted: &mpsc::UnboundedSender<(&'static str, LockGuard)>,
) -> JoinHandle<()> {
    let client = RedisLock::connect_url(url).await.unwrap();
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(120))
        .with_wait_timeout(BOUND);
    let (task_client, task_name, granted) = (client.clone(), name.clone(), granted.clone());
    let task = tokio::spawn(async move {
        let permit = task_client
            .acquire_permit(&task_name, limit, &opts)
            .await
            .unwrap();
        let _ = granted.send((label, permit));
    });
    timeout(BOUND, async {
        loop {
            if client.inspect(name).await.unwrap().waiters == Some(queued) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{label} never queued as waiter {queued}"));
    task
}

/// The next waiter granted a permit, within the bound.
async fn next_granted(
    granted: &mut mpsc::UnboundedReceiver<(&'static str, LockGuard)>,
) -> (&'static str, LockGuard) {
    timeout(BOUND, granted.recv())
        .await
        .expect("a waiter is granted the released permit")
        .expect("the waiters are alive")
}

/// Two permits held, waiters A, B and C queued in that order: each permit released goes to the
/// first waiter still waiting, A, then B, then C (the release grants it to the first in line
/// in its own script, and tells that waiter alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_are_served_in_queue_order() {
    let server = server();
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let name = LockName::new("permits-in-order").unwrap();
    let long = LockOptions::new().with_ttl(Duration::from_secs(120));
    let first = locks.acquire_permit(&name, 2, &long).await.unwrap();
    let second = locks.acquire_permit(&name, 2, &long).await.unwrap();
    let (granted, mut grants) = mpsc::unbounded_channel();
    let url = server.url();
    let mut tasks = Vec::new();
    for (queued, label) in ["A", "B", "C"].into_iter().enumerate() {
        tasks.push(queue_waiter(&url, &name, 2, label, queued + 1, &granted).await);
    }

    first.release().await.unwrap();
    let (label, a) = next_granted(&mut grants).await;
    assert_eq!(label, "A");
    second.release().await.unwrap();
    let (label, b) = next_granted(&mut grants).await;
    assert_eq!(label, "B");
    a.release().await.unwrap();
    let (label, c) = next_granted(&mut grants).await;
    assert_eq!(label, "C");
    for task in tasks {
        task.await.unwrap();
    }
    b.release().await.unwrap();
    c.release().await.unwrap();
    assert_eq!(locks.count_permits(&name).await.unwrap(), 0);
    assert_eq!(locks.inspect(&name).await.unwrap().waiters, Some(0));
}

/// A waiter whose wait is dropped mid-queue (B) leaves the queue at once, and one that vanished
/// without leaving (a queue entry whose presence lapsed, first in line) is skipped: the permits
/// released go to A and then to C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_left_or_vanished_do_not_block_those_behind() {
    let server = server();
    let mut conn = raw(&server).await;
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let name = LockName::new("permits-past-the-gone").unwrap();
    let keys = locks.keys(&name);
    let long = LockOptions::new().with_ttl(Duration::from_secs(120));
    let first = locks.acquire_permit(&name, 2, &long).await.unwrap();
    let second = locks.acquire_permit(&name, 2, &long).await.unwrap();
    // A waiter that crashed: queued first, its presence deadline long past.
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg(&keys.queue)
        .arg("ghost")
        .ignore()
        .cmd("HSET")
        .arg(&keys.waiters)
        .arg("ghost")
        .arg("1:120000")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let (granted, mut grants) = mpsc::unbounded_channel();
    let url = server.url();
    let a = queue_waiter(&url, &name, 2, "A", 1, &granted).await;
    let b = queue_waiter(&url, &name, 2, "B", 2, &granted).await;
    let c = queue_waiter(&url, &name, 2, "C", 3, &granted).await;
    b.abort();
    assert!(b.await.unwrap_err().is_cancelled());
    timeout(BOUND, async {
        loop {
            if locks.inspect(&name).await.unwrap().waiters == Some(2) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the dropped wait leaves the queue");

    first.release().await.unwrap();
    let (label, permit_a) = next_granted(&mut grants).await;
    assert_eq!(label, "A");
    second.release().await.unwrap();
    let (label, permit_c) = next_granted(&mut grants).await;
    assert_eq!(label, "C");
    a.await.unwrap();
    c.await.unwrap();
    permit_a.release().await.unwrap();
    permit_c.release().await.unwrap();
    for key in [&keys.lock, &keys.queue, &keys.waiters] {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(exists, 0, "{key} left after every waiter was served");
    }
}

/// How many acquire and release scripts the server ran since the last `CONFIG RESETSTAT`.
async fn scripts_run(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    stats
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Two permits, a line of 200 waiters over four clients: each release hands its permit to the
/// next waiter and wakes no other. Every waiter is served, never more than two at once, and
/// the server runs a few scripts per waiter (its release, and the presence refreshes of a
/// wait), not the thousands that waking the whole line at each release takes (when releases
/// announced `free` to every waiter, this run took 12,572 scripts; now 202).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_it_grants_and_no_other() {
    use std::sync::atomic::Ordering::SeqCst;

    const WAITERS: usize = 200;
    let server = server();
    let mut conn = raw(&server).await;
    // A long command timeout, so the waiters' presence refreshes (every two thirds of it) are
    // few over the run even on a loaded machine.
    let url = format!("{}?command_timeout=5s", server.url());
    let locks = RedisLock::connect_url(&url).await.unwrap();
    let name = LockName::new("permits-woken-one-by-one").unwrap();
    let long = LockOptions::new().with_ttl(Duration::from_secs(120));
    let first = locks.acquire_permit(&name, 2, &long).await.unwrap();
    let second = locks.acquire_permit(&name, 2, &long).await.unwrap();
    let in_flight = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let client = RedisLock::connect_url(&url).await.unwrap();
        for _ in 0..WAITERS / 4 {
            let (client, name, in_flight) = (client.clone(), name.clone(), in_flight.clone());
            let options = LockOptions::new()
                .with_ttl(Duration::from_secs(120))
                .with_wait_timeout(BOUND);
            waiters.spawn(async move {
                let permit = client.acquire_permit(&name, 2, &options).await.unwrap();
                let at_once = in_flight.fetch_add(1, SeqCst) + 1;
                tokio::task::yield_now().await;
                // Counted out before the release is sent: the permit is held until then.
                in_flight.fetch_sub(1, SeqCst);
                permit.release().await.unwrap();
                at_once
            });
        }
    }
    timeout(BOUND, async {
        while locks.inspect(&name).await.unwrap().waiters != Some(WAITERS) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every waiter queues");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    first.release().await.unwrap();
    second.release().await.unwrap();
    let most_at_once = timeout(BOUND, async {
        let mut most = 0;
        while let Some(served) = waiters.join_next().await {
            most = most.max(served.expect("a waiter panicked"));
        }
        most
    })
    .await
    .expect("every waiter is served");
    assert!(
        most_at_once <= 2,
        "{most_at_once} permits of 2 held at once"
    );
    let scripts = scripts_run(&mut conn).await;
    assert!(
        scripts < (WAITERS * WAITERS / 8) as u64,
        "{scripts} scripts for {WAITERS} hand-offs: the releases woke waiters they did not grant"
    );
    assert_eq!(locks.count_permits(&name).await.unwrap(), 0);
}
