//! Faults specific to Postgres sessions: the holder's backend terminated, a client partitioned
//! by the fault proxy, more lockers than connections, cancelled waits, and PgBouncer in
//! transaction mode (the whole suite through session mode is the `pooled` test binary). (A frozen, dead or
//! restarted server is the fault suite's: `faults::dead_or_frozen_server_answers_unavailable`,
//! `faults::server_restart_while_held_is_lost_or_kept`.) Each test that harms its server starts
//! its own.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use common::{advisory_locks, eventually, own_server, terminate_holder, unique, with_options};
use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions, LostReason};
use dlock_postgres::{AdvisoryKey, PostgresLock};
use dlock_test_servers::{FaultProxy, PgBouncer, PoolMode, ProxyMode};
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(unique(s)).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

async fn lost(guard: &LockGuard) -> LostReason {
    timeout(BOUND, guard.lost())
        .await
        .expect("lost signal within the bound")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backend_fires_lost_on_every_guard_of_its_session() {
    let server = own_server();
    // With two connections at most, every lock but a wait's shares one (a pool of more gives
    // locks held at once connections of their own, up to half its limit).
    let a = PostgresLock::connect_url(&with_options(&server.url(), "max_connections=2"))
        .await
        .unwrap();
    let b = PostgresLock::connect_url(&server.url()).await.unwrap();
    let names: Vec<LockName> = (0..3).map(|i| name(&format!("term{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(
            a.try_acquire(n, &LockOptions::new())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // The three share one session: terminating it ends all three.
    let killed = terminate_holder(&server.url(), &AdvisoryKey::Name(names[0].clone()))
        .await
        .unwrap();
    assert_eq!(killed, 1);
    for guard in &guards {
        assert_eq!(lost(guard).await, LostReason::SessionClosed);
        assert!(!guard.is_held());
    }
    for n in &names {
        let g = b.acquire(n, &wait()).await.unwrap();
        g.release().await.unwrap();
    }
    for guard in guards {
        assert!(matches!(
            guard.release().await,
            Err(LockError::Lost {
                reason: LostReason::SessionClosed,
                ..
            })
        ));
    }
    // The client itself recovers with fresh connections.
    let again = a.acquire(&names[0], &wait()).await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_client_loses_its_locks_and_they_free_after_heal() {
    let server = own_server();
    let proxy = FaultProxy::start(server.addr()).unwrap();
    let via_proxy = format!("postgres://postgres@{}/postgres", proxy.addr());
    let a = PostgresLock::connect_url(&with_options(
        &via_proxy,
        "keepalive=200ms&command_timeout=500ms&connect_timeout=500ms",
    ))
    .await
    .unwrap();
    let b = PostgresLock::connect_url(&server.url()).await.unwrap();
    let n = name("partition");
    let guard = a.acquire(&n, &wait()).await.unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    assert_eq!(lost(&guard).await, LostReason::SessionClosed);
    // The server cannot tell yet: the lock stays held, which is safe.
    assert!(
        b.try_acquire(&n, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    // A cut-off client fails promptly instead of hanging.
    let started = tokio::time::Instant::now();
    let cut_off = a.try_acquire(&name("other"), &LockOptions::new()).await;
    assert!(
        matches!(cut_off, Err(LockError::Unavailable { .. })),
        "{cut_off:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    proxy.heal();
    // The closed connection reaches the server: the lock frees.
    let next = b.acquire(&n, &wait()).await.unwrap();
    next.release().await.unwrap();
    assert!(guard.release().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_lockers_than_connections() {
    let url = common::shared_url();
    let tag = unique("small-pool");
    let small = Arc::new(
        PostgresLock::connect_url(&with_options(
            &url,
            &format!("max_connections=2&application_name={tag}"),
        ))
        .await
        .unwrap(),
    );
    // 40 tasks on one name through 2 connections: exact count, no overlap.
    let n = name("coupon-small-pool");
    let stock = Arc::new(AtomicI64::new(40));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..40 {
        let (small, n, stock, inside) = (small.clone(), n.clone(), stock.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let guard = small.acquire(&n, &wait()).await?;
            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            let left = stock.load(Ordering::SeqCst);
            tokio::task::yield_now().await;
            stock.store(left - 1, Ordering::SeqCst);
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await
        }));
    }
    for task in tasks {
        timeout(BOUND, task).await.unwrap().unwrap().unwrap();
    }
    assert_eq!(stock.load(Ordering::SeqCst), 0);
    assert!(small.connections() <= 2);

    // 10 names held elsewhere, 10 blocking acquires through 2 connections: after the holder
    // lets go, all 10 are held by the small client at once (2 through server-side waits, the
    // rest through the polling fallback on the shared sessions).
    let other = PostgresLock::connect_url(&url).await.unwrap();
    let names: Vec<LockName> = (0..10).map(|i| name(&format!("many{i}"))).collect();
    let mut held = Vec::new();
    for n in &names {
        held.push(
            other
                .try_acquire(n, &LockOptions::new())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let all_held = Arc::new(tokio::sync::Barrier::new(names.len()));
    let mut tasks = Vec::new();
    for n in names.clone() {
        let (small, all_held) = (small.clone(), all_held.clone());
        tasks.push(tokio::spawn(async move {
            let guard = small.acquire(&n, &wait()).await?;
            all_held.wait().await;
            guard.release().await
        }));
    }
    // The lockers are queued before the holder lets go: at least one waits on the server.
    eventually("a locker waiting on the server", || async {
        advisory_locks(&url, &tag).await.1 > 0
    })
    .await;
    for guard in held {
        guard.release().await.unwrap();
    }
    for task in tasks {
        timeout(BOUND, task).await.unwrap().unwrap().unwrap();
    }
    assert!(small.connections() <= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_wait_is_cancelled_on_the_server() {
    let url = common::shared_url();
    let tag = unique("cancel");
    let holder = PostgresLock::connect_url(&url).await.unwrap();
    let waiter = PostgresLock::connect_url(&with_options(&url, &format!("application_name={tag}")))
        .await
        .unwrap();
    let n = name("cancel");
    let guard = holder.acquire(&n, &wait()).await.unwrap();
    for _ in 0..3 {
        let dropped = timeout(
            Duration::from_millis(300),
            waiter.acquire(&n, &LockOptions::new()),
        )
        .await;
        assert!(
            dropped.is_err(),
            "the wait finished while the lock was held"
        );
    }
    // No waiting (or granted) advisory lock of the waiter stays on the server.
    eventually("the cancelled waits to leave pg_locks", || async {
        advisory_locks(&url, &tag).await == (0, 0)
    })
    .await;
    guard.release().await.unwrap();
    let third = PostgresLock::connect_url(&url).await.unwrap();
    let free = third.try_acquire(&n, &LockOptions::new()).await.unwrap();
    assert!(free.is_some(), "a cancelled wait took the lock");
    assert_eq!(advisory_locks(&url, &tag).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stacked_lock_is_left_behind() {
    let url = common::shared_url();
    let tag = unique("stack");
    let a = PostgresLock::connect_url(&with_options(&url, &format!("application_name={tag}")))
        .await
        .unwrap();
    let n = name("stack");
    let guard = a.acquire(&n, &wait()).await.unwrap();
    assert!(
        a.try_acquire(&n, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    let again = a
        .acquire(
            &n,
            &LockOptions::new().with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(again, Err(LockError::Timeout { .. })), "{again:?}");
    // Cancelled non-blocking attempts at ever later points.
    for micros in [0u64, 50, 100, 200, 400, 800, 1600] {
        let other = name("stack-race");
        if let Ok(got) = timeout(
            Duration::from_micros(micros),
            a.try_acquire(&other, &LockOptions::new()),
        )
        .await
        {
            if let Some(g) = got.unwrap() {
                g.release().await.unwrap();
            }
        }
    }
    assert!(advisory_locks(&url, &tag).await.0 >= 1);
    guard.release().await.unwrap();
    eventually("every advisory lock of the client to be gone", || async {
        advisory_locks(&url, &tag).await == (0, 0)
    })
    .await;
    let b = PostgresLock::connect_url(&url).await.unwrap();
    let free = b
        .try_acquire(&n, &LockOptions::new())
        .await
        .unwrap()
        .expect("the lock is free after one release");
    free.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_forgotten_guards_are_unlocked() {
    let url = common::shared_url();
    let tag = unique("drop");
    let a = PostgresLock::connect_url(&with_options(&url, &format!("application_name={tag}")))
        .await
        .unwrap();
    let b = PostgresLock::connect_url(&url).await.unwrap();
    let (n1, n2) = (name("dropped"), name("forgotten"));
    drop(a.acquire(&n1, &wait()).await.unwrap());
    a.acquire(&n2, &wait()).await.unwrap().forget();
    for n in [&n1, &n2] {
        let g = b.acquire(n, &wait()).await.unwrap();
        g.release().await.unwrap();
    }
    eventually("the client's locks to be gone", || async {
        advisory_locks(&url, &tag).await == (0, 0)
    })
    .await;
}

/// PgBouncer in transaction mode in front of a private server: (server, pooler).
fn transaction_pooler() -> (dlock_test_servers::Postgres, PgBouncer) {
    let server = own_server();
    let pooler = PgBouncer::start(server.addr(), PoolMode::Transaction, 2)
        .unwrap_or_else(|e| panic!("cannot start PgBouncer for the tests: {e}"));
    (server, pooler)
}

/// The hazard `connect` guards against, shown with plain connections: through a transaction
/// pooler, a second client's `pg_try_advisory_lock` of a held key lands on the holder's server
/// session, stacks, and succeeds. (The negative control of the refusal below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooler_lets_two_clients_hold_one_session_lock() {
    use sqlx::{Connection, PgConnection, Row};
    let (_server, pooler) = transaction_pooler();
    let mut first = PgConnection::connect(&pooler.url()).await.unwrap();
    let mut second = PgConnection::connect(&pooler.url()).await.unwrap();
    let try_lock = "SELECT pg_try_advisory_lock(4242), pg_backend_pid()";
    let a = sqlx::raw_sql(try_lock).fetch_one(&mut first).await.unwrap();
    let b = sqlx::raw_sql(try_lock)
        .fetch_one(&mut second)
        .await
        .unwrap();
    let (a_got, a_pid): (bool, i32) = (a.get(0), a.get(1));
    let (b_got, b_pid): (bool, i32) = (b.get(0), b.get(1));
    assert!(a_got, "the first client must get the lock");
    assert!(
        b_got && a_pid == b_pid,
        "through a transaction pooler the second client was expected to land on the first's \
         server session and stack the lock (got {b_got} on pid {b_pid}, the holder is pid \
         {a_pid}): the refusal below would then guard against nothing observable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooler_is_refused_at_connect() {
    let (_server, pooler) = transaction_pooler();
    let error = PostgresLock::connect_url(&pooler.url())
        .await
        .expect_err("connect must refuse a transaction pooler");
    assert!(
        matches!(error, LockError::Config { .. }) && error.to_string().contains("pool_mode"),
        "{error}"
    );
}

/// The transaction-scoped helpers live inside one transaction, which a transaction pooler keeps
/// on one server session: they work through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xact_lock_works_through_a_transaction_pooler() {
    use sqlx::{Connection, PgConnection};
    let (_server, pooler) = transaction_pooler();
    let url = format!("{}?statement-cache-capacity=0", pooler.url());
    let mut first = PgConnection::connect(&url).await.unwrap();
    let mut second = PgConnection::connect(&url).await.unwrap();
    let name = name("xact");
    let mut tx = first.begin().await.unwrap();
    dlock_postgres::xact_lock(&mut tx, name.clone(), None)
        .await
        .unwrap();
    let mut other = second.begin().await.unwrap();
    let busy = dlock_postgres::try_xact_lock(&mut other, name.clone())
        .await
        .unwrap();
    assert!(!busy, "a second transaction must not get the lock");
    other.rollback().await.unwrap();
    tx.commit().await.unwrap();
    let mut other = second.begin().await.unwrap();
    assert!(
        dlock_postgres::try_xact_lock(&mut other, name.clone())
            .await
            .unwrap(),
        "free after the holder's commit"
    );
    other.rollback().await.unwrap();
}

/// A server that refuses this client a second connection: a lock taken while another is held
/// goes where the first one is, instead of failing on the connection the pool would have
/// opened to keep them apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_leaves_locks_on_the_one_open() {
    let url = common::shared_url();
    let role = unique("one_conn");
    let mut admin = common::sql(&url).await;
    // Two: connecting checks that two connections are two sessions (no transaction pooler).
    sqlx::raw_sql(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 2"))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut config =
        dlock_postgres::PostgresConfig::from_url(&with_options(&url, "fencing=false")).unwrap();
    config.user = role.clone();
    let locks = PostgresLock::connect(config).await.unwrap();
    // The role's other connection, taken once the connect check's has gone.
    let as_role = url.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(as_role, url, "the shared server's URL names its user");
    eventually("the connect check's connection to close", || async {
        let mut admin = common::sql(&url).await;
        let sessions: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = $1")
                .bind(&role)
                .fetch_one(&mut admin)
                .await
                .unwrap();
        sessions == 1
    })
    .await;
    let other = <sqlx::PgConnection as sqlx::Connection>::connect(&as_role)
        .await
        .unwrap();
    let first = locks
        .try_acquire(&name("refused-a"), &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let second = locks
        .try_acquire(&name("refused-b"), &LockOptions::new())
        .await
        .expect("the open connection takes the second lock")
        .expect("free");
    second.release().await.unwrap();
    first.release().await.unwrap();
    drop((locks, other));
    sqlx::raw_sql(&format!("DROP ROLE {role}"))
        .execute(&mut admin)
        .await
        .ok();
}
