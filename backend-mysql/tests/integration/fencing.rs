//! Fencing tokens on MariaDB come from a sequence: no row is written per acquire (so a server
//! that flushes its log at every commit pays no flush per lock), tokens rise in grant order, and
//! they start above the tokens of a counter table an earlier version of dlock left behind.

use crate::common;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_mysql::MySqlLock;
use sqlx::{Executor, Row};

/// How far InnoDB's redo log has gone (bytes): every committed row change moves it.
async fn log_written(url: &str) -> u64 {
    let mut conn = common::raw(url).await;
    let row = conn
        .fetch_one(
            "SELECT CAST(VARIABLE_VALUE AS UNSIGNED) FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME = 'INNODB_LSN_CURRENT'",
        )
        .await
        .unwrap();
    row.try_get::<u64, _>(0).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_writes_no_row_and_tokens_rise() {
    let server = tokio::task::block_in_place(common::own_server);
    let url = server.url();
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    let name = LockName::new("dlock-test/fencing/rows").unwrap();
    let opts = LockOptions::new();
    // The first grants create the sequence and reserve its first block of values.
    let mut last = 0;
    for _ in 0..3 {
        let guard = locks.acquire(&name, &opts).await.unwrap();
        last = guard.fencing_token().get();
        guard.release().await.unwrap();
    }
    let before = log_written(&url).await;
    for _ in 0..50 {
        let guard = locks.acquire(&name, &opts).await.unwrap();
        let token = guard.fencing_token().get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
    // A counter row per acquire moves the log by about 100 bytes each (5 KB here); the
    // sequence's cache writes nothing until its 1000 values are used up.
    let grew = log_written(&url).await - before;
    assert!(
        grew < 1000,
        "50 acquires wrote {grew} bytes of redo log: the token should come from the sequence's cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_start_above_an_earlier_counter_table() {
    let server = tokio::task::block_in_place(common::own_server);
    let url = server.url();
    // What an earlier version left: a counter row per key, floored by the server's clock.
    let mut conn = common::raw(&url).await;
    conn.execute(
        "CREATE TABLE dlock_fence (name VARBINARY(255) NOT NULL PRIMARY KEY, \
         token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    let name = LockName::new("dlock-test/fencing/upgrade").unwrap();
    let key = MySqlLock::connect_url(&url).await.unwrap().key(&name);
    conn.execute(
        sqlx::query(
            "INSERT INTO dlock_fence (name, token) \
             VALUES (?, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED))",
        )
        .bind(key),
    )
    .await
    .unwrap();
    let old: u64 = conn
        .fetch_one("SELECT MAX(token) FROM dlock_fence")
        .await
        .unwrap()
        .get(0);
    // The clients of the earlier version have stopped; this version's start.
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    let guard = locks.acquire(&name, &LockOptions::new()).await.unwrap();
    assert!(
        guard.fencing_token().get() > old,
        "token {} is not above the counter table's {old}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

/// Clients that connect and take their first locks at the same moment, on a server where no
/// fence exists yet, all get one, and no two grants share a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_starting_at_once_all_create_the_fence() {
    let server = tokio::task::block_in_place(common::own_server);
    let url = server.url().to_owned();
    let firsts: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            tokio::spawn(async move {
                let locks = MySqlLock::connect_url(&url).await.unwrap();
                let name = LockName::new(format!("dlock-test/fencing/race-{i}")).unwrap();
                let guard = locks.acquire(&name, &LockOptions::new()).await.unwrap();
                let token = guard.fencing_token().get();
                guard.release().await.unwrap();
                token
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for first in firsts {
        tokens.push(first.await.unwrap());
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "two grants shared a token: {tokens:?}");
}

/// The counter table (`fencing=table`, MySQL's own fence) does not grow for ever with names used
/// once, a lock per order id: a row whose token the server's clock passed ten minutes ago is
/// deleted by a client's next release (its first, then once per ten minutes), and the name's next
/// token is still above it. Rows of recent tokens stay. The table's tokens are per name, so
/// `inspect` reports the holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_rows_of_names_gone_quiet_are_swept_and_tokens_still_rise() {
    let server = tokio::task::block_in_place(common::own_server);
    let url = format!("{}?fencing=table", server.url());
    let locks = MySqlLock::connect_url(&url).await.unwrap();
    // The first client creates the table; its first release sweeps nothing yet.
    let first = LockName::new("dlock-test/fencing/first").unwrap();
    locks
        .acquire(&first, &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // Orders of an hour ago: 500 names used once, their rows' tokens the clock then.
    let mut conn = common::raw(&server.url()).await;
    let names: Vec<LockName> = (0..500)
        .map(|i| LockName::new(format!("dlock-test/fencing/order-{i}")).unwrap())
        .collect();
    for name in &names {
        conn.execute(
            sqlx::query(
                "INSERT INTO dlock_fence (name, token) \
                 VALUES (?, CAST((UNIX_TIMESTAMP(NOW(6)) - 3600) * 1000000 AS UNSIGNED))",
            )
            .bind(locks.key(name)),
        )
        .await
        .unwrap();
    }
    assert_eq!(rows(&mut conn).await, 501);
    let old: u64 = conn
        .fetch_one("SELECT MAX(token) FROM dlock_fence WHERE name LIKE '%order-%'")
        .await
        .unwrap()
        .get(0);

    // A new client's first release sweeps; the row of the name it just used stays.
    let sweeper = MySqlLock::connect_url(&url).await.unwrap();
    let recent = LockName::new("dlock-test/fencing/recent").unwrap();
    let guard = sweeper.acquire(&recent, &LockOptions::new()).await.unwrap();
    let inspected = sweeper.inspect(&recent).await.unwrap();
    assert_eq!(
        inspected.token,
        Some(guard.fencing_token()),
        "the counter table keeps each name's token"
    );
    guard.release().await.unwrap();
    assert_eq!(
        rows(&mut conn).await,
        2,
        "only the rows of the two names used just now are left"
    );
    // A swept name starts again from the clock: above every token it had.
    let again = sweeper
        .acquire(&names[0], &LockOptions::new())
        .await
        .unwrap();
    assert!(
        again.fencing_token().get() > old,
        "token {} after a swept row's {old}",
        again.fencing_token()
    );
    again.release().await.unwrap();
}

async fn rows(conn: &mut sqlx::MySqlConnection) -> i64 {
    conn.fetch_one("SELECT COUNT(*) FROM dlock_fence")
        .await
        .unwrap()
        .get::<i64, _>(0)
}
