//! Elections on Postgres: the leaders table's row, a leader whose backend is terminated (its row
//! reads vacant at once, with nothing cleaned up), a proclaim refused over a higher term, a
//! candidate whose waiting backend is terminated, and the notifications observers listen for.

use crate::common;

use std::time::Duration;

use common::{shared_url, sql, terminate_holder, terminate_waiters, unique};
use dlock_api::{DistributedLock, LeaderEvent, LockError, LockName, LockOptions, LostReason};
use dlock_postgres::{AdvisoryKey, PostgresLock};
use futures::StreamExt;
use sqlx::Row;
use sqlx::postgres::PgListener;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);
/// The leaders table of the default fence sequence.
const LEADERS: &str = "dlock_fence_seq_leaders";

fn name(s: &str) -> LockName {
    LockName::new(unique(s)).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

/// The name's row: (key, term, value, holder pid, whether the holder's start time is kept).
async fn row(url: &str, name: &LockName) -> Option<(i64, i64, Vec<u8>, i32, bool)> {
    let mut conn = sql(url).await;
    let row = sqlx::query(&format!(
        "SELECT key, term, value, holder, holder_start IS NOT NULL FROM {LEADERS} WHERE name = $1"
    ))
    .bind(name.as_str())
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    row.map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
}

/// The pid holding `name`'s advisory key.
async fn holder_pid(url: &str, name: &LockName) -> Option<i32> {
    common::holder_pid(url, &AdvisoryKey::Name(name.clone())).await
}

#[tokio::test]
async fn the_record_is_a_row_of_term_value_and_holder_deleted_on_resignation() {
    let url = shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let n = name("record");
    let leadership = locks.campaign(&n, b"host-a:8080", &wait()).await.unwrap();
    let (key, term, value, holder, started) = row(&url, &n).await.expect("a row");
    assert_eq!(key, dlock_api::KeyMapper::hash_i64(&n));
    assert_eq!(term.unsigned_abs(), leadership.term().get());
    assert_eq!(value, b"host-a:8080");
    assert_eq!(Some(holder), holder_pid(&url, &n).await);
    assert!(started, "the holder's backend_start guards a reused pid");
    leadership.proclaim(b"host-a:9090").await.unwrap();
    assert_eq!(row(&url, &n).await.unwrap().2, b"host-a:9090");
    leadership.resign().await.unwrap();
    assert!(
        row(&url, &n).await.is_none(),
        "a resignation leaves its row"
    );
    // The same session taking the name again as a plain lock is no leader.
    let guard = locks.acquire(&n, &wait()).await.unwrap();
    assert_eq!(locks.leader(&n).await.unwrap(), None);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_terminated_leader_reads_vacant_at_once_and_the_next_leads_with_a_higher_term() {
    let url = shared_url();
    let (a, b) = (
        PostgresLock::connect_url(&url).await.unwrap(),
        PostgresLock::connect_url(&url).await.unwrap(),
    );
    let n = name("terminated");
    let first = a.campaign(&n, b"a", &wait()).await.unwrap();
    let killed = terminate_holder(&url, &AdvisoryKey::Name(n.clone()))
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // `pg_terminate_backend` returns once signalled; the lock goes when the backend exits.
    common::eventually("the terminated backend's lock to go", || async {
        holder_pid(&url, &n).await.is_none()
    })
    .await;
    assert!(row(&url, &n).await.is_some(), "nothing cleaned the row up");
    assert_eq!(b.leader(&n).await.unwrap(), None);
    let second = b.campaign(&n, b"b", &wait()).await.unwrap();
    assert!(second.term() > first.term());
    // The successor's proclaim took the row over (what a deposed leader's proclaim then gets is
    // the suite's `election::crashed_leader_hands_over`).
    assert_eq!(
        row(&url, &n).await.unwrap().1.unsigned_abs(),
        second.term().get()
    );
    drop(first);
    second.resign().await.unwrap();
}

#[tokio::test]
async fn a_proclaim_over_a_higher_term_is_not_held_and_writes_nothing() {
    let url = shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let n = name("higher");
    let leadership = locks.campaign(&n, b"mine", &wait()).await.unwrap();
    let mut conn = sql(&url).await;
    sqlx::query(&format!(
        "UPDATE {LEADERS} SET term = term + 1000000, value = 'newer' WHERE name = $1"
    ))
    .bind(n.as_str())
    .execute(&mut conn)
    .await
    .unwrap();
    // Refused on the server, and the leadership is then lost.
    let refused = leadership.proclaim(b"older").await;
    let lost = !leadership.is_held();
    assert!(
        matches!(refused, Err(LockError::NotHeld { .. })) && lost,
        "{refused:?}"
    );
    let (_, term, value, ..) = row(&url, &n).await.unwrap();
    assert_eq!(term.unsigned_abs(), leadership.term().get() + 1_000_000);
    assert_eq!(value, b"newer");
    let _ = leadership.resign().await;
}

#[tokio::test]
async fn a_candidate_whose_waiting_backend_is_terminated_is_lost_not_leader() {
    let url = shared_url();
    let (a, b) = (
        PostgresLock::connect_url(&url).await.unwrap(),
        PostgresLock::connect_url(&url).await.unwrap(),
    );
    let n = name("candidate");
    let leader = a.campaign(&n, b"a", &wait()).await.unwrap();
    let candidate = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.campaign(&n, b"b", &wait()).await })
    };
    // The candidate's backend waits in the server's lock queue once its wait has started.
    let (url_ref, key) = (&url, &AdvisoryKey::Name(n.clone()));
    common::eventually(
        "the candidate's waiting backend to be terminated",
        || async move { terminate_waiters(url_ref, key).await.unwrap() > 0 },
    )
    .await;
    leader.resign().await.unwrap();
    let outcome = timeout(BOUND, candidate).await.unwrap().unwrap();
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                reason: LostReason::SessionExpired,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(a.leader(&n).await.unwrap(), None);
}

/// The channel a name's leader changes are notified on.
fn channel(n: &LockName) -> String {
    format!("dlock_leader_{:016x}", dlock_api::KeyMapper::hash_i64(n))
}

/// The next notification on `heard`'s channels: its payload.
async fn told(heard: &mut PgListener) -> String {
    let notification = timeout(BOUND, heard.recv())
        .await
        .expect("a notification")
        .unwrap();
    notification.payload().to_owned()
}

#[tokio::test]
async fn a_proclaim_and_a_resignation_notify_the_name_and_an_observer_listens_again_after_a_kill() {
    let url = shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let n = name("notified");
    let mut heard = PgListener::connect(&url).await.unwrap();
    heard.listen(&channel(&n)).await.unwrap();

    let leadership = locks.campaign(&n, b"a", &wait()).await.unwrap();
    let term = leadership.term().get().to_string();
    assert_eq!(told(&mut heard).await, term, "the first proclaim");
    leadership.proclaim(b"b").await.unwrap();
    assert_eq!(told(&mut heard).await, term, "a proclaim");

    let mut observer = locks.observe(&n).await.unwrap();
    let first = timeout(BOUND, observer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(&first, LeaderEvent::Leads(leader) if leader.value() == b"b"),
        "{first:?}"
    );
    // The observer's client listens on the name's channel: a session beside this test's whose
    // last statement was that LISTEN.
    let ours: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut heard)
        .await
        .unwrap();
    let listen = format!("LISTEN \"{}\"", channel(&n));
    let listening = |url: String, listen: String| async move {
        let mut conn = sql(&url).await;
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity WHERE query = $1 AND pid <> $2",
        )
        .bind(listen)
        .bind(ours)
        .fetch_all(&mut conn)
        .await
        .unwrap()
    };
    common::eventually("the observer's client to listen", || {
        let listed = listening(url.clone(), listen.clone());
        async move { !listed.await.is_empty() }
    })
    .await;
    let first_listener = listening(url.clone(), listen.clone()).await;
    // Its listening connection terminated, it connects and listens again, and goes on hearing.
    let mut conn = sql(&url).await;
    for pid in &first_listener {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    common::eventually("the observer's client to listen again", || {
        let listed = listening(url.clone(), listen.clone());
        let first_listener = &first_listener;
        async move {
            let now = listed.await;
            !now.is_empty() && now.iter().all(|pid| !first_listener.contains(pid))
        }
    })
    .await;

    leadership.resign().await.unwrap();
    assert_eq!(told(&mut heard).await, term, "a resignation");
    let vacant = timeout(BOUND, observer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(vacant, LeaderEvent::Vacant);

    // A plain lock's release tells nobody.
    let guard = locks.acquire(&n, &wait()).await.unwrap();
    guard.release().await.unwrap();
    let quiet = timeout(Duration::from_millis(200), heard.recv()).await;
    assert!(quiet.is_err(), "{quiet:?}");
}

/// How many sessions last ran `listen`.
async fn sessions_that_ran(url: &str, listen: &str) -> i64 {
    let mut conn = sql(url).await;
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query = $1")
        .bind(listen)
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[test]
fn each_runtime_that_uses_a_client_listens_on_a_connection_of_its_own() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let (first, second) = (runtime(), runtime());
    let url = shared_url();
    let n = name("runtimes");
    let locks = first.block_on(PostgresLock::connect_url(&url)).unwrap();
    // An observer on each runtime: a socket belongs to the runtime that opened it.
    let observe = |on: &tokio::runtime::Runtime| {
        let (locks, n) = (locks.clone(), n.clone());
        on.spawn(async move {
            let mut changes = locks.observe(&n).await.unwrap();
            while changes.next().await.is_some() {}
        })
    };
    let observers = [observe(&first), observe(&second)];
    let listen = format!("LISTEN \"{}\"", channel(&n));
    first.block_on(common::eventually("both runtimes to listen", || {
        let (url, listen) = (&url, &listen);
        async move { sessions_that_ran(url, listen).await == 2 }
    }));
    for observer in observers {
        observer.abort();
    }
}

#[tokio::test]
async fn a_waiting_candidate_writes_its_record_with_its_grant() {
    let url = shared_url();
    let (a, b) = (
        PostgresLock::connect_url(&url).await.unwrap(),
        PostgresLock::connect_url(&url).await.unwrap(),
    );
    let n = name("granted-record");
    // A client's first grant reserves its window of fencing tokens; its record waits for a
    // token from the window, so b takes one first.
    b.acquire(&name("warm-up"), &wait())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let first = a.campaign(&n, b"a", &wait()).await.unwrap();
    let candidate = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.campaign(&n, b"b", &wait()).await })
    };
    // The candidate waits at the server, in the statement that will also write its record.
    let key = AdvisoryKey::Name(n.clone());
    common::eventually("the candidate to wait at the server", || {
        let (url, key) = (&url, &key);
        async move { common::pids_at(url, key, false).await.len() == 1 }
    })
    .await;
    first.resign().await.unwrap();
    let second = timeout(BOUND, candidate).await.unwrap().unwrap().unwrap();
    let (_, term, value, holder, _) = row(&url, &n).await.expect("the new leader's row");
    assert_eq!(
        (term.unsigned_abs(), value.as_slice()),
        (second.term().get(), &b"b"[..])
    );
    // No statement of its own followed the grant: the holder's last statement was its wait.
    let mut conn = sql(&url).await;
    let last: String = sqlx::query_scalar("SELECT query FROM pg_stat_activity WHERE pid = $1")
        .bind(holder)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(last.starts_with("WITH g AS"), "{last}");
    second.resign().await.unwrap();
    assert!(row(&url, &n).await.is_none());
}

/// A new leader's first proclaim (a candidate that took a free name at once) finds its row held
/// by another transaction (`FOR SHARE`, then updated): it waits for the row, not failing, and
/// the campaign leads with its own term and value once the other is done. (The deadlock of
/// MariaDB's test does not arise here: Postgres lets the row's only locker update it without
/// queueing behind the waiter.)
#[tokio::test]
async fn a_new_leaders_first_proclaim_waits_for_a_row_another_transaction_holds() {
    let url = shared_url();
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let n = name("deadlock-proclaim");
    // The table, then a row for the shared lock: a terminated leader's, left behind.
    let earlier = locks.campaign(&n, b"earlier", &wait()).await.unwrap();
    earlier.resign().await.unwrap();
    let mut other = sql(&url).await;
    let key = dlock_api::KeyMapper::hash_i64(&n);
    sqlx::query(&format!(
        "INSERT INTO {LEADERS} (name, key, term, value, holder) VALUES ($1, $2, 1, 'stale', 0) \
         ON CONFLICT (name) DO UPDATE SET holder = 0"
    ))
    .bind(n.as_str())
    .bind(key)
    .execute(&mut other)
    .await
    .unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query(&format!(
        "SELECT term FROM {LEADERS} WHERE name = $1 FOR SHARE"
    ))
    .bind(n.as_str())
    .fetch_one(&mut other)
    .await
    .unwrap();
    let campaign_of = n.clone();
    let candidate =
        tokio::spawn(async move { locks.campaign(&campaign_of, b"candidate", &wait()).await });
    common::eventually("the candidate's proclaim to wait for the row", || {
        let url = url.clone();
        async move {
            let mut watcher = sql(&url).await;
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity a, pg_locks l \
                 WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted \
                 AND l.objid = ($1::bigint & 4294967295)::oid AND a.wait_event_type = 'Lock')",
            )
            .bind(key)
            .fetch_one(&mut watcher)
            .await
            .unwrap()
        }
    })
    .await;
    sqlx::query(&format!(
        "UPDATE {LEADERS} SET value = 'other' WHERE name = $1"
    ))
    .bind(n.as_str())
    .execute(&mut other)
    .await
    .unwrap();
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let leadership = timeout(BOUND, candidate)
        .await
        .expect("the candidate to lead once the row is free")
        .unwrap()
        .unwrap();
    let (_, term, value, holder, _) = row(&url, &n).await.expect("the new leader's row");
    assert_eq!(term.unsigned_abs(), leadership.term().get());
    assert_eq!(value, b"candidate");
    assert_eq!(Some(holder), holder_pid(&url, &n).await);
    leadership.resign().await.unwrap();
}
