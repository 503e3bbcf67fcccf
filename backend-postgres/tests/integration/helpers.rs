//! The transaction-scoped and row-lock helpers, integer keys, and the fence sequence checks.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, KeyMapper, LockError, LockName, LockOptions};
use dlock_postgres::{
    AdvisoryKey, PostgresConfig, PostgresLock, RowLock, RowLockOutcome, RowWait, try_xact_lock,
    xact_lock,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

async fn pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(&common::shared_url())
        .await
        .unwrap()
}

async fn table(pool: &PgPool) -> String {
    let table = common::unique("rows");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, code text UNIQUE NOT NULL); \
         INSERT INTO {table} VALUES (1, 'a'), (2, 'b')"
    ))
    .execute(pool)
    .await
    .unwrap();
    table
}

async fn lock_timeout(tx: &mut sqlx::PgConnection) -> String {
    sqlx::query("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lock_modes_map_lock_errors_and_keep_the_transaction_usable() {
    let pool = pool().await;
    let table = table(&pool).await;
    let mut holder = pool.begin().await.unwrap();
    let rows = RowLock::new(&table).unwrap();
    assert_eq!(
        rows.lock(&mut holder, 1).await.unwrap(),
        RowLockOutcome::Locked
    );

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let nowait = rows.clone().with_wait(RowWait::NoWait);
    assert_eq!(nowait.lock(&mut tx, 1).await.unwrap(), RowLockOutcome::Busy);
    let skip = rows.clone().with_wait(RowWait::SkipLocked);
    assert_eq!(skip.lock(&mut tx, 1).await.unwrap(), RowLockOutcome::Busy);
    assert_eq!(
        skip.lock(&mut tx, 99).await.unwrap(),
        RowLockOutcome::Missing
    );
    let bounded = rows
        .clone()
        .with_wait(RowWait::Timeout(Duration::from_millis(200)));
    let started = std::time::Instant::now();
    let timed_out = bounded.lock(&mut tx, 1).await;
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    // Busy and Timeout left the transaction usable, with its own lock_timeout back.
    assert_eq!(lock_timeout(&mut tx).await, "7s");
    assert_eq!(
        bounded.lock(&mut tx, 2).await.unwrap(),
        RowLockOutcome::Locked
    );
    assert_eq!(lock_timeout(&mut tx).await, "7s");
    assert_eq!(
        nowait.lock(&mut tx, 99).await.unwrap(),
        RowLockOutcome::Missing
    );
    let by_code = RowLock::new(&table)
        .unwrap()
        .with_key_column("code")
        .unwrap()
        .with_wait(RowWait::NoWait);
    assert_eq!(
        by_code.lock(&mut tx, "a").await.unwrap(),
        RowLockOutcome::Busy
    );
    tx.commit().await.unwrap();

    // The holder's commit releases the row.
    holder.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        nowait.lock(&mut tx, 1).await.unwrap(),
        RowLockOutcome::Locked
    );
    tx.rollback().await.unwrap();

    assert!(matches!(
        RowLock::new("x; drop table y"),
        Err(LockError::Config { .. })
    ));
    let missing = RowLock::new("no_such_table_here").unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(
        missing.lock(&mut tx, 1).await,
        Err(LockError::Backend { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xact_locks_end_with_the_transaction() {
    let pool = pool().await;
    let name = LockName::new(common::unique("xact")).unwrap();
    let mut a = pool.begin().await.unwrap();
    xact_lock(&mut a, name.clone(), None).await.unwrap();

    let mut b = pool.begin().await.unwrap();
    assert!(!try_xact_lock(&mut b, name.clone()).await.unwrap());
    let waited = xact_lock(&mut b, name.clone(), Some(Duration::from_millis(200))).await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    // Still usable after the timeout.
    assert_eq!(lock_timeout(&mut b).await, "0");

    // The session lock of the same name is the same key: it excludes too.
    let locks = PostgresLock::connect_url(&common::shared_url())
        .await
        .unwrap();
    assert!(
        locks
            .try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );

    a.commit().await.unwrap();
    xact_lock(&mut b, name.clone(), Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(lock_timeout(&mut b).await, "0");
    b.rollback().await.unwrap();
    let after = locks.try_acquire(&name, &LockOptions::new()).await.unwrap();
    assert!(after.is_some(), "rollback released the xact lock");

    // Pair keys.
    let mut c = pool.begin().await.unwrap();
    assert!(try_xact_lock(&mut c, (7, 8)).await.unwrap());
    let mut d = pool.begin().await.unwrap();
    assert!(
        !try_xact_lock(&mut d, AdvisoryKey::Pair(7, 8))
            .await
            .unwrap()
    );
    assert!(
        try_xact_lock(&mut d, AdvisoryKey::Pair(8, 7))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_keys_and_hash_collisions_only_wait() {
    let url = common::shared_url();
    let a = PostgresLock::connect_url(&url).await.unwrap();
    let b = PostgresLock::connect_url(&url).await.unwrap();
    let name = LockName::new(common::unique("collide")).unwrap();
    // An integer key equal to the name's hash is the same lock: a forced "collision". It makes
    // the two wait for each other; never two holders.
    let same = AdvisoryKey::Int(KeyMapper::hash_i64(&name));
    let held = a
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.try_acquire_key(&same, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    let waited = b
        .acquire_key(
            &same,
            &LockOptions::new().with_wait_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    held.release().await.unwrap();
    let g = b
        .acquire_key(
            &same,
            &LockOptions::new().with_wait_timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert_eq!(
        g.name().as_str(),
        format!("pg-advisory:{}", KeyMapper::hash_i64(&name))
    );
    g.release().await.unwrap();

    // Pair keys are their own space; tokens rise across key kinds too.
    let pair = AdvisoryKey::Pair(rand::random(), 1);
    let p1 = a
        .try_acquire_key(&pair, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.try_acquire_key(&pair, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    let t1 = p1.fencing_token();
    p1.release().await.unwrap();
    let p2 = b
        .try_acquire_key(&pair, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert!(p2.fencing_token() > t1);
    p2.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_sequence_is_checked_created_and_optional() {
    let url = common::shared_url();
    let seq = common::unique("fence");
    // Missing, and not allowed to create: a clear Config error; migrate() fixes it.
    let missing = PostgresLock::connect_url(&common::with_options(
        &url,
        &format!("fence_sequence={seq}&create_fence=false"),
    ))
    .await;
    let Err(LockError::Config { reason, .. }) = missing else {
        panic!("expected a Config error, got {missing:?}");
    };
    assert!(reason.contains("migrate"), "{reason}");
    let mut config = PostgresConfig::from_url(&url).unwrap();
    config.set_option("fence_sequence", &seq).unwrap();
    let created = PostgresLock::connect(config.clone()).await.unwrap();
    created.migrate().await.unwrap();
    config.set_option("create_fence", "false").unwrap();
    PostgresLock::connect(config).await.unwrap();

    // A cached sequence would hand out tokens out of order across clients: refused.
    let cached = common::unique("cached");
    let mut conn = common::sql(&url).await;
    sqlx::query(&format!("CREATE SEQUENCE {cached} CACHE 20"))
        .execute(&mut conn)
        .await
        .unwrap();
    // Why: each session takes a block of 20 values, so two sessions alternating grants hand out
    // 1, 21, 2: the third holder's token is below the second's, and a fenced resource would
    // refuse the rightful holder.
    let mut other = common::sql(&url).await;
    let mut tokens = Vec::new();
    for first in [true, false, true] {
        let session = if first { &mut conn } else { &mut other };
        let row = sqlx::query(&format!("SELECT nextval('{cached}')"))
            .fetch_one(&mut *session)
            .await
            .unwrap();
        tokens.push(row.get::<i64, _>(0));
    }
    assert!(
        tokens[2] < tokens[1],
        "a CACHE 20 sequence from two sessions gave {tokens:?}, in order"
    );
    let refused = PostgresLock::connect_url(&common::with_options(
        &url,
        &format!("fence_sequence={cached}"),
    ))
    .await;
    assert!(
        matches!(refused, Err(LockError::Config { .. })),
        "{refused:?}"
    );

    // fencing=false: no sequence needed, tokens are 0, capabilities say so.
    let plain = PostgresLock::connect_url(&common::with_options(
        &url,
        "fencing=false&fence_sequence=never_created",
    ))
    .await
    .unwrap();
    assert_eq!(plain.capabilities().fencing, dlock_api::Fencing::None);
    let g = plain
        .try_acquire(
            &LockName::new(common::unique("plain")).unwrap(),
            &LockOptions::new(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.fencing_token().get(), 0);
    g.release().await.unwrap();
    assert_eq!(
        plain.to_string(),
        format!("postgres({})", PostgresConfig::from_url(&url).unwrap())
    );
}

/// A row-lock holder that goes idle in its transaction past the server's
/// `idle_in_transaction_session_timeout` (a paused process, a forgotten transaction) is ended by
/// the server: the row goes to the next locker, and the stale holder's write can never commit
/// after the new holder's, because its lock and its writes die with the same transaction. This
/// is why row locks need no fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_in_transaction_kill_frees_the_row_and_the_stale_write_never_commits() {
    let pool = pool().await;
    let table = table(&pool).await;
    let rows = RowLock::new(&table).unwrap();
    let mut stale = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = '500ms'")
        .execute(&mut *stale)
        .await
        .unwrap();
    assert_eq!(
        rows.lock(&mut stale, 1).await.unwrap(),
        RowLockOutcome::Locked
    );
    // The next locker waits for the row (no limit): the server's kill is what frees it.
    let mut next = pool.begin().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), rows.lock(&mut next, 1))
        .await
        .expect("the idle holder's session was ended and the row handed on")
        .unwrap();
    assert_eq!(got, RowLockOutcome::Locked);
    sqlx::query(&format!("UPDATE {table} SET code = 'next' WHERE id = 1"))
        .execute(&mut *next)
        .await
        .unwrap();
    next.commit().await.unwrap();
    // The stale holder wakes and writes as if it still held the row: its session is gone.
    let late = sqlx::query(&format!("UPDATE {table} SET code = 'stale' WHERE id = 1"))
        .execute(&mut *stale)
        .await;
    assert!(late.is_err(), "a write in a killed transaction succeeded");
    assert!(stale.commit().await.is_err());
    let code: String = sqlx::query(&format!("SELECT code FROM {table} WHERE id = 1"))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(code, "next");
}
