//! Faults specific to MariaDB sessions, each against its own server: the holder's connection
//! killed, a client cut off by the fault proxy, a cancelled blocking wait, a pool under
//! pressure, and the server's wall clock stepped (tokens are floored by it). (A frozen, dead or restarted server is the fault suite's: `faults::dead_or_frozen_server_answers_unavailable`,
//! `faults::server_restart_while_held_is_lost_or_kept`.)

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{MySqlHarness, holder, kill_connection, own_server, raw};
use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LostReason};
use dlock_mysql::MySqlLock;
use dlock_test_servers::{FaultProxy, ProxyMode};
use sqlx::{Executor, Row};
use tokio::time::{Instant, timeout};

const BOUND: Duration = Duration::from_secs(30);

fn name(what: &str) -> LockName {
    LockName::new(format!("faults/{what}/{:08x}", rand::random::<u32>())).unwrap()
}

fn wait(d: Duration) -> LockOptions {
    LockOptions::new().with_wait_timeout(d)
}

#[tokio::test]
async fn killed_connection_fires_lost_on_every_guard_it_held() {
    let server = own_server();
    let url = server.url();
    // With two connections at most, every lock but a wait's shares one (a pool of more gives
    // locks held at once connections of their own, up to half its limit).
    let locks = MySqlLock::connect_url(&format!("{url}?max_connections=2"))
        .await
        .unwrap();
    let names: Vec<LockName> = (0..5).map(|i| name(&format!("k{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            locks
                .try_acquire(n, &LockOptions::new())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let id = locks.holder_connection_id(&names[0]).expect("held");
    assert!(
        names
            .iter()
            .all(|n| locks.holder_connection_id(n) == Some(id)),
        "non-blocking acquires share one session connection"
    );
    assert_eq!(holder(&url, &locks.key(&names[0])).await, Some(id));
    kill_connection(&url, id).await.unwrap();
    for g in &guards {
        let reason = timeout(BOUND, g.lost())
            .await
            .expect("lost within the bound");
        assert_eq!(reason, LostReason::SessionClosed);
    }
    let other = MySqlLock::connect_url(&url).await.unwrap();
    for (g, n) in guards.into_iter().zip(&names) {
        let released = g.release().await;
        assert!(
            matches!(released, Err(LockError::Lost { .. })),
            "{released:?}"
        );
        other
            .acquire(n, &wait(BOUND))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // The client recovers: new locks work on a new connection.
    locks
        .try_acquire(&names[0], &LockOptions::new())
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn partitioned_client_loses_its_lock_and_the_server_frees_it() {
    let server = own_server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let through_proxy = format!(
        "mysql://root@{}/test?keepalive=500ms&command_timeout=1s&session_timeout=4s",
        proxy.addr()
    );
    let cut_off = MySqlLock::connect_url(&through_proxy).await.unwrap();
    let n = name("partition");
    let guard = cut_off.acquire(&n, &LockOptions::new()).await.unwrap();
    let other = MySqlLock::connect_url(&server.url()).await.unwrap();
    assert!(
        other
            .try_acquire(&n, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    proxy.set_mode(ProxyMode::Blackhole);
    let started = Instant::now();
    let reason = timeout(BOUND, guard.lost())
        .await
        .expect("lost within the bound");
    assert_eq!(reason, LostReason::SessionClosed);
    let noticed = started.elapsed();
    // The server frees the lock when the silent connection passes its wait_timeout (4 s).
    let next = timeout(BOUND, other.acquire(&n, &wait(BOUND)))
        .await
        .expect("the server frees a half-open holder's lock")
        .unwrap();
    let freed = started.elapsed();
    eprintln!("partition: client noticed after {noticed:?}, server freed after {freed:?}");
    assert!(
        noticed <= freed,
        "the client believed it held the lock after the server freed it"
    );
    assert!(guard.release().await.is_err());
    next.release().await.unwrap();
    proxy.heal();
    let after = timeout(BOUND, cut_off.acquire(&n, &wait(BOUND)))
        .await
        .unwrap()
        .unwrap();
    after.release().await.unwrap();
}

#[tokio::test]
async fn dropped_blocking_acquire_is_interrupted_on_the_server() {
    // Its own server: the probe counts every waiting GET_LOCK on it.
    let server = own_server();
    let url = server.url();
    let (a, b) = (
        MySqlLock::connect_url(&url).await.unwrap(),
        MySqlLock::connect_url(&url).await.unwrap(),
    );
    let n = name("cancel");
    let key = a.key(&n);
    let held = a.acquire(&n, &LockOptions::new()).await.unwrap();
    let dropped = timeout(
        Duration::from_millis(300),
        b.acquire(&n, &LockOptions::new()),
    )
    .await;
    assert!(dropped.is_err());
    // Within the bound no statement waits on the key any more: the wait was KILLed, not left.
    let mut probe = raw(&url).await;
    let started = Instant::now();
    loop {
        let row = probe
            .fetch_one(
                sqlx::query(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%GET_LOCK%' AND ID <> CONNECTION_ID()",
                ),
            )
            .await
            .unwrap();
        let waiting: i64 = row.try_get(0).unwrap();
        if waiting == 0 {
            break;
        }
        assert!(
            started.elapsed() < BOUND,
            "a cancelled GET_LOCK is still waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
    let mut probe = raw(&url).await;
    let free: i64 = probe
        .fetch_one(sqlx::query("SELECT IS_FREE_LOCK(?)").bind(key))
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    assert_eq!(free, 1, "a cancelled waiter took the lock");
}

#[tokio::test]
async fn pool_under_pressure_neither_deadlocks_nor_mixes_connections() {
    let h = MySqlHarness::shared();
    let url = format!("{}?max_connections=3", h.url());
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    let names: Vec<LockName> = (0..4).map(|i| name(&format!("p{i}"))).collect();
    let counters: Arc<HashMap<LockName, (AtomicUsize, AtomicUsize)>> = Arc::new(
        names
            .iter()
            .map(|n| (n.clone(), (AtomicUsize::new(0), AtomicUsize::new(0))))
            .collect(),
    );
    let overlaps = Arc::new(AtomicUsize::new(0));
    let max_conns = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (locks, counters, overlaps, max_conns) = (
            locks.clone(),
            counters.clone(),
            overlaps.clone(),
            max_conns.clone(),
        );
        let n = names[i % names.len()].clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = locks.acquire(&n, &wait(BOUND)).await?;
                let (inside, done) = &counters[&n];
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                max_conns.fetch_max(locks.connection_count(), Ordering::SeqCst);
                tokio::task::yield_now().await;
                done.fetch_add(1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                // A release on the wrong connection would answer 0 or NULL: NotHeld.
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("no deadlock")
            .unwrap()
            .unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let total: usize = counters
        .values()
        .map(|(_, d)| d.load(Ordering::SeqCst))
        .sum();
    assert_eq!(total, 200);
    assert!(
        max_conns.load(Ordering::SeqCst) <= 3,
        "{} connections",
        max_conns.load(Ordering::SeqCst)
    );
    // try_acquire still gets a connection while waiters use the others.
    let held = locks.acquire(&names[0], &LockOptions::new()).await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (locks, n) = (locks.clone(), names[0].clone());
            tokio::spawn(async move { locks.acquire(&n, &wait(Duration::from_secs(2))).await })
        })
        .collect();
    // Wait (bounded) until a waiter is blocked in GET_LOCK on the server, holding a connection.
    let deadline = Instant::now() + BOUND;
    loop {
        let mut conn = raw(h.url()).await;
        let waiting: i64 = conn
            .fetch_one(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'",
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no waiter blocked on the server");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = locks
        .try_acquire(&names[1], &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    other.release().await.unwrap();
    held.release().await.unwrap();
    for w in waiters {
        if let Ok(g) = w.await.unwrap() {
            g.release().await.unwrap();
        }
    }
}

/// The server's wall clock stepped an hour back, then forward, then back to the true time (an
/// NTP step, a VM restored from a snapshot), with libfaketime preloaded into `mariadbd`: fencing
/// tokens are floored by the server's clock (`UNIX_TIMESTAMP(NOW(6))` in microseconds) but raised
/// past the last one a name had, so each grant's token is still above the one before, whichever
/// way the clock went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_rising_when_the_server_clock_steps() {
    use dlock_conformance::nemesis::clock::SteppedClock;
    let dir = std::env::temp_dir().join(format!("dlock-mysql-clock-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let clock = SteppedClock::in_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    let server =
        tokio::task::block_in_place(|| dlock_test_servers::MariaDb::start_with_env(&clock.env()))
            .unwrap_or_else(|e| panic!("cannot start MariaDB under libfaketime: {e}"));
    let locks = MySqlLock::connect_url(&server.url()).await.unwrap();
    let n = name("clock");
    let mut conn = raw(&server.url()).await;
    let mut last = 0;
    for offset in ["+0", "-1h", "+1h", "+0", "-2h"] {
        clock.set(offset).unwrap();
        let expected: i64 = match offset {
            "+0" => 0,
            "-1h" => -3600,
            "+1h" => 3600,
            _ => -7200,
        };
        // libfaketime re-reads the offset file at most once a second: wait until the server's
        // clock shows the step.
        let give_up = Instant::now() + BOUND;
        loop {
            let server_now: i64 = conn
                .fetch_one("SELECT CAST(UNIX_TIMESTAMP() AS SIGNED)")
                .await
                .unwrap()
                .get(0);
            let true_now = i64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs(),
            )
            .unwrap();
            if (server_now - true_now - expected).abs() <= 5 {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "the server's clock did not step to {offset}: {} s off",
                server_now - true_now
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let guard = locks.acquire(&n, &wait(BOUND)).await.unwrap();
        let token = guard.fencing_token().get();
        assert!(
            token > last,
            "token {token} after {last}: the server clock's step to {offset} took it back"
        );
        last = token;
        guard.release().await.unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
