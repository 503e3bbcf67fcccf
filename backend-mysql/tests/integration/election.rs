//! Elections on MySQL/MariaDB: the leaders table's row, a leader whose connection is killed
//! (its row reads vacant at once, with nothing cleaned up), and a proclaim refused over a higher
//! term. (A candidate whose waiting session ends is the pool's, tested once on Postgres; a
//! waiter's killed connection is noticed as the suite's `waiting::` cases check.)

use crate::common;

use std::time::Duration;

use common::{MySqlHarness, holder, kill_connection, raw};
use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_mysql::MySqlLock;
use sqlx::{Executor, Row};

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

/// Hand-overs of many neighbouring names at once: each waiting candidate's statement upserts
/// its row while the other names' leaders delete theirs and their candidates upsert beside
/// them in the same part of the index. Every campaign leads within its wait, every round, with
/// its own term and value in its row, and no lock stays.
#[tokio::test]
async fn hand_overs_of_neighbouring_names_at_once_all_lead_with_their_rows() {
    const NAMES: usize = 24;
    const ROUNDS: usize = 6;
    let harness = MySqlHarness::shared();
    let url = harness.url();
    // Room for every candidate of a client to wait at the server at once.
    let roomy = format!("{url}?max_connections={}", NAMES + 2);
    let (a, b) = (
        MySqlLock::connect_url(&roomy).await.unwrap(),
        MySqlLock::connect_url(&roomy).await.unwrap(),
    );
    // One prefix, consecutive suffixes: neighbours in the leaders table's index.
    let prefix = name("neighbours");
    let names: Vec<LockName> = (0..NAMES)
        .map(|i| LockName::new(format!("{prefix}/{i:03}")).unwrap())
        .collect();
    let mut leaders = Vec::new();
    for n in &names {
        leaders.push(a.campaign(n, b"first", &wait()).await.unwrap());
    }
    let (mut current, mut next) = (a, b);
    for round in 0..ROUNDS {
        let mut candidates = tokio::task::JoinSet::new();
        for (i, n) in names.iter().enumerate() {
            let (locks, n) = (next.clone(), n.clone());
            candidates.spawn(async move {
                let value = format!("round {round}");
                (i, locks.campaign(&n, value.as_bytes(), &wait()).await)
            });
        }
        // Every candidate waits at the server before the leaders resign, all at once.
        let mut conn = raw(url).await;
        for n in &names {
            waiting_connection(&mut conn, &current.key(n)).await;
        }
        let mut resignations = tokio::task::JoinSet::new();
        for leadership in leaders.drain(..) {
            resignations.spawn(leadership.resign());
        }
        let mut won = Vec::new();
        while let Some(joined) = tokio::time::timeout(BOUND, candidates.join_next())
            .await
            .expect("every candidate to lead in time")
        {
            let (i, led) = joined.unwrap();
            let leadership = led.unwrap_or_else(|e| panic!("round {round}, name {i}: {e}"));
            won.push((i, leadership));
        }
        while let Some(resigned) = resignations.join_next().await {
            resigned.unwrap().unwrap();
        }
        won.sort_by_key(|(i, _)| *i);
        for (i, leadership) in &won {
            let key = next.key(&names[*i]);
            let (term, value, _) = row(url, &key).await.expect("the new leader's row");
            assert_eq!(term, leadership.term().get());
            assert_eq!(value, format!("round {round}").as_bytes());
        }
        leaders = won.into_iter().map(|(_, leadership)| leadership).collect();
        std::mem::swap(&mut current, &mut next);
    }
    for leadership in leaders {
        leadership.resign().await.unwrap();
    }
    for n in &names {
        assert_eq!(holder(url, &current.key(n)).await, None, "a lock stayed");
    }
}

/// A transaction holding a shared lock on `key`'s row of the leaders table (a stale row it
/// writes first, as a killed leader leaves), heavier than a candidate's statement (rows it
/// wrote), so that InnoDB picks the candidate's as the victim of the deadlock it starts.
async fn share_the_row(url: &str, key: &str) -> sqlx::MySqlConnection {
    let mut other = raw(url).await;
    let stale = format!(
        "INSERT INTO {LEADERS} (name, term, value, holder) VALUES (?, 1, 'stale', 0) \
         ON DUPLICATE KEY UPDATE holder = 0"
    );
    sqlx::query(&stale)
        .bind(key)
        .execute(&mut other)
        .await
        .unwrap();
    other
        .execute(sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS dlock_test_ballast \
             (id INT AUTO_INCREMENT PRIMARY KEY, pad INT) ENGINE=InnoDB",
        ))
        .await
        .unwrap();
    other.execute(sqlx::raw_sql("BEGIN")).await.unwrap();
    let ballast = format!(
        "INSERT INTO dlock_test_ballast (pad) VALUES {}",
        vec!["(1)"; 20].join(", ")
    );
    other.execute(sqlx::raw_sql(&ballast)).await.unwrap();
    let shared = format!("SELECT term FROM {LEADERS} WHERE name = ? LOCK IN SHARE MODE");
    sqlx::query(&shared)
        .bind(key)
        .fetch_one(&mut other)
        .await
        .unwrap();
    other
}

/// Once the candidate's connection `victim` waits for the row behind `other`'s shared lock,
/// `other` asks to update the row too: the deadlock of the MySQL manual's example, whose victim
/// is the candidate's statement, the lighter. Then `other` rolls back, and the row is free.
async fn deadlock_then_let_go(
    other: &mut sqlx::MySqlConnection,
    url: &str,
    key: &str,
    victim: u64,
) {
    let mut watcher = raw(url).await;
    row_lock_wait(&mut watcher, victim).await;
    // Granted only once InnoDB rolled the candidate's statement back (were the machine slow
    // enough for the candidate's `innodb_lock_wait_timeout` to pass first, that too).
    let update = format!("UPDATE {LEADERS} SET value = 'other' WHERE name = ?");
    sqlx::query(&update)
        .bind(key)
        .execute(&mut *other)
        .await
        .unwrap();
    other.execute(sqlx::raw_sql("ROLLBACK")).await.unwrap();
}

/// The candidate leads, with its row.
async fn leads_with_its_row(
    url: &str,
    key: &str,
    candidate: tokio::task::JoinHandle<dlock_api::Result<dlock_api::Leadership>>,
) {
    let leadership = tokio::time::timeout(BOUND, candidate)
        .await
        .expect("the candidate to lead once the row is free")
        .unwrap()
        .unwrap();
    let (term, value, writer) = row(url, key).await.expect("the new leader's row");
    assert_eq!(
        (term, value.as_slice()),
        (leadership.term().get(), &b"candidate"[..])
    );
    assert_eq!(Some(writer), holder(url, key).await);
    leadership.resign().await.unwrap();
    assert_eq!(holder(url, key).await, None);
}

/// A new leader's record write chosen as an InnoDB deadlock's victim, in the two places a
/// campaign writes it (one after the other: two such transactions at once would make each
/// other's deadlocks):
/// - a waiting candidate's statement, once granted: it rolls back, not the `GET_LOCK` it took;
///   the candidate gives that back and waits again, and leads once the row is free;
/// - the first proclaim of a candidate that took a free name at once: the statement rolled
///   back and the name is still held, so the campaign proclaims again and leads;
///
/// instead of failing the campaign with error 1213.
#[tokio::test]
async fn a_new_leaders_record_write_chosen_as_a_deadlocks_victim_is_tried_again() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    waiting_candidate_as_victim(url).await;
    first_proclaim_as_victim(url).await;
}

/// A client, a new name and its key, the leaders table there (an earlier leader came and went)
/// and `other`, holding the name's row shared ([`share_the_row`]).
async fn behind_a_shared_row(
    url: &str,
    what: &str,
) -> (MySqlLock, LockName, String, sqlx::MySqlConnection) {
    let locks = MySqlLock::connect_url(url).await.unwrap();
    let n = name(what);
    let key = locks.key(&n);
    let earlier = locks.campaign(&n, b"earlier", &wait()).await.unwrap();
    earlier.resign().await.unwrap();
    let other = share_the_row(url, &key).await;
    (locks, n, key, other)
}

/// `locks`' campaign for `n` with the value `candidate`, in a task of its own.
fn candidate(
    locks: MySqlLock,
    n: &LockName,
) -> tokio::task::JoinHandle<dlock_api::Result<dlock_api::Leadership>> {
    let n = n.clone();
    tokio::spawn(async move { locks.campaign(&n, b"candidate", &wait()).await })
}

async fn waiting_candidate_as_victim(url: &str) {
    let (locks, n, key, mut other) = behind_a_shared_row(url, "deadlock-waiting").await;
    // The other holds the key while the candidate starts, so the candidate's statement is the
    // one that waits in `GET_LOCK`.
    let taken: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&key)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(taken, 1);
    let candidate = candidate(locks, &n);
    let waiter = waiting_connection(&mut raw(url).await, &key).await;
    sqlx::query_scalar::<_, i64>("SELECT RELEASE_LOCK(?)")
        .bind(&key)
        .fetch_one(&mut other)
        .await
        .unwrap();
    deadlock_then_let_go(&mut other, url, &key, waiter).await;
    leads_with_its_row(url, &key, candidate).await;
}

async fn first_proclaim_as_victim(url: &str) {
    let (locks, n, key, mut other) = behind_a_shared_row(url, "deadlock-proclaim").await;
    let candidate = candidate(locks, &n);
    let give_up = tokio::time::Instant::now() + BOUND;
    let leader = loop {
        if let Some(id) = holder(url, &key).await {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the candidate never took the name"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    deadlock_then_let_go(&mut other, url, &key, leader).await;
    leads_with_its_row(url, &key, candidate).await;
}

/// Waits until the connection `id` waits for a row lock in InnoDB: its transaction says so, or
/// (`innodb_trx` does not always list a statement's transaction that never wrote) it runs a
/// statement while InnoDB counts a row lock wait. Were it a wait of another test's, the
/// update that follows comes early and makes no deadlock: the candidate then waits for the
/// row and leads all the same, so the case still checks what it must.
async fn row_lock_wait(conn: &mut sqlx::MySqlConnection, id: u64) {
    let give_up = tokio::time::Instant::now() + BOUND;
    loop {
        let (state, running, waits): (Option<String>, i64, i64) = sqlx::query_as(
            "SELECT \
             (SELECT trx_state FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = ?), \
             (SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO IS NOT NULL), \
             (SELECT CAST(VARIABLE_VALUE AS SIGNED) FROM information_schema.GLOBAL_STATUS \
              WHERE VARIABLE_NAME = 'INNODB_ROW_LOCK_CURRENT_WAITS')",
        )
        .bind(id)
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if state.as_deref() == Some("LOCK WAIT") || (running > 0 && waits > 0) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the candidate's statement never waited for the row ({state:?})"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
