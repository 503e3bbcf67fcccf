//! The coupon scenario three ways on a real table: 100 concurrent requests take one
//! coupon each from a stock of 100, and each way leaves exactly 0.
//!
//! `DLOCK_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run -p dlock-postgres --example
//! coupon` (the URL may also be the first argument; it uses a table `coupon` of its own).

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_postgres::{PostgresLock, RowLock, RowWait, xact_lock};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool, Row};

fn sql_err(e: sqlx::Error) -> LockError {
    LockError::backend("postgres", e)
}

/// Read the stock, then write it back minus one: racy without a lock.
async fn take_one(tx: &mut PgConnection) -> Result<(), LockError> {
    let row = sqlx::query("SELECT stock FROM coupon WHERE id = 1")
        .fetch_one(&mut *tx)
        .await
        .map_err(sql_err)?;
    let left: i32 = row.get(0);
    tokio::task::yield_now().await;
    sqlx::query("UPDATE coupon SET stock = $1 WHERE id = 1")
        .bind(left - 1)
        .execute(&mut *tx)
        .await
        .map_err(sql_err)?;
    Ok(())
}

async fn reset(pool: &PgPool) -> Result<(), LockError> {
    sqlx::query("INSERT INTO coupon VALUES (1, 100) ON CONFLICT (id) DO UPDATE SET stock = 100")
        .execute(pool)
        .await
        .map_err(sql_err)?;
    Ok(())
}

async fn left(pool: &PgPool) -> Result<i32, LockError> {
    let row = sqlx::query("SELECT stock FROM coupon WHERE id = 1")
        .fetch_one(pool)
        .await
        .map_err(sql_err)?;
    Ok(row.get(0))
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Result<(), LockError>>>) -> Result<(), LockError> {
    for task in tasks {
        task.await.expect("task panicked")?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    // The first argument, else `DLOCK_URL` (as sqlx's examples take `DATABASE_URL`).
    let url = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_URL").ok())
        .ok_or_else(|| LockError::Config {
            backend: "postgres",
            reason:
                "set DLOCK_URL (or pass the URL), e.g. postgres://postgres@127.0.0.1:5432/postgres"
                    .into(),
        })?;
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect(&url)
        .await
        .map_err(sql_err)?;
    sqlx::query("CREATE TABLE IF NOT EXISTS coupon (id int PRIMARY KEY, stock int NOT NULL)")
        .execute(&pool)
        .await
        .map_err(sql_err)?;

    // 1. Session advisory lock: commit, then release.
    reset(&pool).await?;
    let locks = PostgresLock::connect_url(&url).await?;
    let name = LockName::new("coupon:1")?;
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (locks, pool, name, opts) = (locks.clone(), pool.clone(), name.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locks.acquire(&name, &opts).await?;
            let mut tx = pool.begin().await.map_err(sql_err)?;
            take_one(&mut tx).await?;
            tx.commit().await.map_err(sql_err)?;
            guard.release().await // after the commit, never before
        }));
    }
    join(tasks).await?;
    println!(
        "session lock + commit-then-release: {} left",
        left(&pool).await?
    );

    // 2. Transaction-scoped advisory lock: the commit releases it.
    reset(&pool).await?;
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (pool, name) = (pool.clone(), name.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.map_err(sql_err)?;
            xact_lock(&mut tx, name, Some(Duration::from_secs(30))).await?;
            take_one(&mut tx).await?;
            tx.commit().await.map_err(sql_err)
        }));
    }
    join(tasks).await?;
    println!(
        "transaction-scoped advisory lock:   {} left",
        left(&pool).await?
    );

    // 3. Row lock: SELECT … FOR UPDATE with a bounded wait.
    reset(&pool).await?;
    let rows = RowLock::new("coupon")?.with_wait(RowWait::Timeout(Duration::from_secs(30)));
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let (pool, rows) = (pool.clone(), rows.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = pool.begin().await.map_err(sql_err)?;
            rows.lock(&mut tx, 1).await?;
            take_one(&mut tx).await?;
            tx.commit().await.map_err(sql_err)
        }));
    }
    join(tasks).await?;
    println!(
        "row lock (FOR UPDATE, bounded):     {} left",
        left(&pool).await?
    );
    Ok(())
}
