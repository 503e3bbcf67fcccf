//! Elections on MySQL/MariaDB: the leaders table's row, a leader whose connection is killed
//! (its row reads vacant at once, with nothing cleaned up), and a proclaim refused over a higher
//! term. (A candidate whose waiting session ends is the pool's, tested once on Postgres; a
//! waiter's killed connection is noticed as the suite's `waiting::` cases check.)

use crate::common;

use std::time::Duration;

use common::{MySqlHarness, holder, kill_connection, raw};
use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_mysql::MySqlLock;
use sqlx::Row;

const BOUND: Duration = Duration::from_secs(30);
/// The leaders table of the default fencing table.
const LEADERS: &str = "dlock_fence_leaders";

fn name(what: &str) -> LockName {
    LockName::new(format!("election/{what}/{:08x}", rand::random::<u32>())).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

/// The key's row: (term, value, holder).
async fn row(url: &str, key: &str) -> Option<(u64, Vec<u8>, u64)> {
    let mut conn = raw(url).await;
    let row = sqlx::query(&format!(
        "SELECT term, value, holder FROM {LEADERS} WHERE name = ?"
    ))
    .bind(key)
    .fetch_optional(&mut conn)
    .await
    .unwrap();
    row.map(|r| (r.get(0), r.get(1), r.get(2)))
}

/// Raises the key's row to a term `by` above its own, as a later leader's would be, with the
/// value `newer`.
async fn raise_term(url: &str, key: &str, by: u64) {
    let mut conn = raw(url).await;
    let raise = format!("UPDATE {LEADERS} SET term = term + ?, value = 'newer' WHERE name = ?");
    let query = sqlx::query(&raise).bind(by).bind(key);
    assert_eq!(query.execute(&mut conn).await.unwrap().rows_affected(), 1);
}

#[tokio::test]
async fn the_record_is_a_row_of_term_value_and_holder_deleted_on_resignation() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let locks = MySqlLock::connect_url(url).await.unwrap();
    let n = name("record");
    let key = locks.key(&n);
    let leadership = locks.campaign(&n, b"host-a:8080", &wait()).await.unwrap();
    let (term, value, writer) = row(url, &key).await.expect("a row");
    assert_eq!(term, leadership.term().get());
    assert_eq!(value, b"host-a:8080");
    assert_eq!(Some(writer), holder(url, &key).await);
    leadership.proclaim(b"host-a:9090").await.unwrap();
    assert_eq!(row(url, &key).await.unwrap().1, b"host-a:9090");
    leadership.resign().await.unwrap();
    assert!(
        row(url, &key).await.is_none(),
        "a resignation leaves its row"
    );
    // (That a plain lock taken on the same connection afterwards is no leader is the pool's,
    // tested on Postgres.)
}

#[tokio::test]
async fn a_killed_leader_reads_vacant_at_once_and_the_next_leads_with_a_higher_term() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let (a, b) = (
        MySqlLock::connect_url(url).await.unwrap(),
        MySqlLock::connect_url(url).await.unwrap(),
    );
    let n = name("killed");
    let key = a.key(&n);
    let first = a.campaign(&n, b"a", &wait()).await.unwrap();
    let id = a.holder_connection_id(&n).expect("held");
    kill_connection(url, id).await.unwrap();
    // `KILL` returns once the connection is marked; its locks go as its thread ends.
    let give_up = tokio::time::Instant::now() + BOUND;
    while holder(url, &key).await.is_some() {
        assert!(tokio::time::Instant::now() < give_up, "the lock stayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(row(url, &key).await.is_some(), "nothing cleaned the row up");
    assert_eq!(b.leader(&n).await.unwrap(), None);
    let second = b.campaign(&n, b"b", &wait()).await.unwrap();
    assert!(second.term() > first.term());
    // The successor's proclaim took the row over (what a deposed leader's proclaim then gets is
    // the suite's `election::crashed_leader_hands_over`).
    assert_eq!(row(url, &key).await.unwrap().0, second.term().get());
    drop(first);
    second.resign().await.unwrap();
}

#[tokio::test]
async fn a_proclaim_over_a_higher_term_is_not_held_and_writes_nothing() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let locks = MySqlLock::connect_url(url).await.unwrap();
    let n = name("higher");
    let key = locks.key(&n);
    let leadership = locks.campaign(&n, b"mine", &wait()).await.unwrap();
    raise_term(url, &key, 1_000_000).await;
    let refused = leadership.proclaim(b"older").await;
    let lost = !leadership.is_held();
    assert!(
        matches!(refused, Err(LockError::NotHeld { .. })) && lost,
        "{refused:?}"
    );
    let (term, value, _) = row(url, &key).await.unwrap();
    assert_eq!(term, leadership.term().get() + 1_000_000);
    assert_eq!(value, b"newer");
    let _ = leadership.resign().await;
}

/// The connection waiting in `GET_LOCK` for `key`, once there is one (only one may wait).
async fn waiting_connection(conn: &mut sqlx::MySqlConnection, key: &str) -> u64 {
    let waiters = tokio::time::timeout(BOUND, async {
        loop {
            let waiters = common::lock_waiters(&mut *conn, key).await.unwrap();
            if !waiters.is_empty() {
                return waiters;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the candidate to wait at the server");
    assert_eq!(waiters.len(), 1, "{waiters:?}");
    waiters[0]
}

/// How many prepared statements the connection `id` has run to their end, by
/// performance_schema's summary of its thread.
async fn executed(conn: &mut sqlx::MySqlConnection, id: u64) -> u64 {
    sqlx::query_scalar(
        "SELECT CAST(s.COUNT_STAR AS UNSIGNED) \
         FROM performance_schema.events_statements_summary_by_thread_by_event_name s \
         JOIN performance_schema.threads t ON t.THREAD_ID = s.THREAD_ID \
         WHERE t.PROCESSLIST_ID = ? AND s.EVENT_NAME = 'statement/com/Execute'",
    )
    .bind(id)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// On MariaDB's fencing sequence, a candidate that waits takes the lock, draws its term and
/// writes its row in one statement: when its campaign returns, the row is there with its term
/// and value, and the new leader ran no statement after that wait (no proclaim of its own).
#[tokio::test]
async fn a_waiting_candidate_writes_its_row_with_its_grant() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let (a, b) = (
        MySqlLock::connect_url(url).await.unwrap(),
        MySqlLock::connect_url(url).await.unwrap(),
    );
    let n = name("granted-row");
    let key = a.key(&n);
    let first = a.campaign(&n, b"a", &wait()).await.unwrap();
    let candidate = {
        let (b, n) = (b.clone(), n.clone());
        tokio::spawn(async move { b.campaign(&n, b"b", &wait()).await })
    };
    let mut conn = raw(url).await;
    let waiter = waiting_connection(&mut conn, &key).await;
    // The statement in progress is counted once it ends.
    let before = executed(&mut conn, waiter).await;
    first.resign().await.unwrap();
    let second = tokio::time::timeout(BOUND, candidate)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let (term, value, writer) = row(url, &key).await.expect("the new leader's row");
    assert_eq!((term, value.as_slice()), (second.term().get(), &b"b"[..]));
    assert_eq!((writer, holder(url, &key).await), (waiter, Some(waiter)));
    assert_eq!(
        executed(&mut conn, waiter).await,
        before + 1,
        "the new leader ran a statement of its own after the one that waited"
    );
    second.resign().await.unwrap();
    assert!(row(url, &key).await.is_none());
}
