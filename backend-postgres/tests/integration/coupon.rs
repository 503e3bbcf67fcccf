//! The coupon scenario on a real table, three ways: 100 concurrent tasks each take one
//! coupon from a stock of 100 with a read-then-write in a transaction; each way leaves exactly 0.
//!
//! 1. session advisory lock (`DistributedLock`), commit, then release;
//! 2. transaction-scoped advisory lock (`xact_lock`), released by the commit itself;
//! 3. row lock (`RowLock`, `SELECT … FOR UPDATE` with a bounded wait).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_postgres::{PostgresLock, RowLock, RowLockOutcome, RowWait, xact_lock};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};

const TASKS: i32 = 100;

fn sql_err(e: sqlx::Error) -> LockError {
    LockError::backend("postgres", e)
}

/// A fresh coupon table with one row of stock 100.
async fn setup(pool: &PgPool) -> String {
    let table = common::unique("coupon");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, stock int NOT NULL, last_token bigint NOT NULL DEFAULT 0); \
         INSERT INTO {table} VALUES (1, {TASKS}, 0)"
    ))
    .execute(pool)
    .await
    .unwrap();
    table
}

async fn stock(pool: &PgPool, table: &str) -> i32 {
    sqlx::query(&format!("SELECT stock FROM {table} WHERE id = 1"))
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0)
}

async fn pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&common::shared_url())
        .await
        .unwrap()
}

/// Read the stock, yield (widening the race window), write stock - 1.
async fn take_one(tx: &mut sqlx::PgConnection, table: &str) -> Result<(), LockError> {
    let left: i32 = sqlx::query(&format!("SELECT stock FROM {table} WHERE id = 1"))
        .fetch_one(&mut *tx)
        .await
        .map_err(sql_err)?
        .get(0);
    tokio::task::yield_now().await;
    sqlx::query(&format!("UPDATE {table} SET stock = $1 WHERE id = 1"))
        .bind(left - 1)
        .execute(&mut *tx)
        .await
        .map_err(sql_err)?;
    Ok(())
}

async fn run_all<F, Fut>(task: F)
where
    F: Fn(i32) -> Fut,
    Fut: std::future::Future<Output = Result<(), LockError>> + Send + 'static,
{
    let tasks: Vec<_> = (0..TASKS).map(|i| tokio::spawn(task(i))).collect();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("task finished")
            .expect("task did not panic")
            .expect("task succeeded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_with_session_lock_commit_then_release() {
    let pool = pool().await;
    let table = setup(&pool).await;
    let locks: Vec<Arc<PostgresLock>> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(Arc::new(
                PostgresLock::connect_url(&common::shared_url())
                    .await
                    .unwrap(),
            ));
        }
        v
    };
    let name = LockName::new(format!("coupon:{table}")).unwrap();
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(60));
    run_all(|i| {
        let (lock, pool, table, name, opts) = (
            locks[i as usize % 4].clone(),
            pool.clone(),
            table.clone(),
            name.clone(),
            opts.clone(),
        );
        async move {
            let guard = lock.acquire(&name, &opts).await?;
            let mut tx = pool.begin().await.map_err(sql_err)?;
            take_one(&mut tx, &table).await?;
            // The storage refuses a stale holder: the write carries the fencing token.
            let fenced = sqlx::query(&format!(
                "UPDATE {table} SET last_token = $1 WHERE id = 1 AND last_token < $1"
            ))
            .bind(guard.fencing_token().get() as i64)
            .execute(&mut *tx)
            .await
            .map_err(sql_err)?;
            assert_eq!(fenced.rows_affected(), 1, "a fencing token did not rise");
            tx.commit().await.map_err(sql_err)?;
            guard.release().await // after the commit, never before
        }
    })
    .await;
    assert_eq!(stock(&pool, &table).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_with_transaction_scoped_lock() {
    let pool = pool().await;
    let table = setup(&pool).await;
    let name = LockName::new(format!("coupon:{table}")).unwrap();
    run_all(|_| {
        let (pool, table, name) = (pool.clone(), table.clone(), name.clone());
        async move {
            let mut tx = pool.begin().await.map_err(sql_err)?;
            xact_lock(&mut tx, name, Some(Duration::from_secs(60))).await?;
            take_one(&mut tx, &table).await?;
            tx.commit().await.map_err(sql_err) // releases the lock
        }
    })
    .await;
    assert_eq!(stock(&pool, &table).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_with_row_lock() {
    let pool = pool().await;
    let table = setup(&pool).await;
    let rows = RowLock::new(&table)
        .unwrap()
        .with_wait(RowWait::Timeout(Duration::from_secs(60)));
    run_all(|_| {
        let (pool, table, rows) = (pool.clone(), table.clone(), rows.clone());
        async move {
            let mut tx = pool.begin().await.map_err(sql_err)?;
            assert_eq!(rows.lock(&mut tx, 1).await?, RowLockOutcome::Locked);
            take_one(&mut tx, &table).await?;
            tx.commit().await.map_err(sql_err)
        }
    })
    .await;
    assert_eq!(stock(&pool, &table).await, 0);
}
