//! The coupon scenario on a real table: 100 concurrent requests each issue one coupon
//! from a stock of 100, under a dlock named lock. The right order is **lock → begin → change rows
//! → commit → release**; releasing before the commit lets the next holder read the stock before
//! the previous change is visible, and coupons are issued twice.
//!
//! `DLOCK_URL=mysql://root@127.0.0.1:3306/test cargo run -p dlock-mysql --example coupon`
//! (the URL may also be the first argument; it creates and drops a table of its own).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions, Result};
use dlock_mysql::MySqlLock;
use sqlx::mysql::MySqlPool;
use sqlx::{Executor, Row};

/// When the lock is released relative to the commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Commit, then release: correct.
    CommitThenRelease,
    /// Release, then commit: the classic bug (the next request reads the stock before this commit lands).
    ReleaseThenCommit,
}

/// What the run left behind.
#[derive(Debug)]
pub struct Outcome {
    /// Coupons left in stock (100 requests on 100: 0 is correct).
    pub left: i64,
    /// Coupons recorded as issued.
    pub issued: i64,
    /// Whether the fencing tokens stored with the issued coupons rise in issue order.
    pub tokens_rise: bool,
}

/// Sets up a coupon with stock 100 and runs `requests` concurrent requests in `order`.
pub async fn issue_coupons(url: &str, order: Order, requests: usize) -> Result<Outcome> {
    // The data lives in ordinary tables, reached through an ordinary pool; the lock has its own
    // connections (a MySqlLock), so no lock ever rides on a pooled connection.
    let db = MySqlPool::connect(url).await.map_err(backend)?;
    let coupon_id: i64 = rand::random::<u32>() as i64;
    db.execute(
        "CREATE TABLE IF NOT EXISTS coupon (id BIGINT PRIMARY KEY, stock INT NOT NULL, \
         fence BIGINT UNSIGNED NOT NULL DEFAULT 0) ENGINE=InnoDB",
    )
    .await
    .map_err(backend)?;
    db.execute(
        "CREATE TABLE IF NOT EXISTS coupon_issue (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
         coupon_id BIGINT NOT NULL, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
    )
    .await
    .map_err(backend)?;
    db.execute(sqlx::query("INSERT INTO coupon (id, stock) VALUES (?, 100)").bind(coupon_id))
        .await
        .map_err(backend)?;

    let locks = MySqlLock::connect_url(url).await?;
    let name = LockName::new(format!("coupon:{coupon_id}"))?;
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for _ in 0..requests {
        let (db, locks, name, opts) = (db.clone(), locks.clone(), name.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locks.acquire(&name, &opts).await?;
            let token = guard.fencing_token().get();
            let mut tx = db.begin().await.map_err(backend)?;
            let stock: i32 = sqlx::query("SELECT stock FROM coupon WHERE id = ?")
                .bind(coupon_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?
                .try_get(0)
                .map_err(backend)?;
            if stock > 0 {
                // Fenced write: a holder with an older token than the last writer changes nothing.
                sqlx::query("UPDATE coupon SET stock = ?, fence = ? WHERE id = ? AND fence < ?")
                    .bind(stock - 1)
                    .bind(token)
                    .bind(coupon_id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
                sqlx::query("INSERT INTO coupon_issue (coupon_id, token) VALUES (?, ?)")
                    .bind(coupon_id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
            }
            match order {
                Order::CommitThenRelease => {
                    tx.commit().await.map_err(backend)?;
                    guard.release().await?;
                }
                Order::ReleaseThenCommit => {
                    guard.release().await?;
                    // Anything between release and commit widens the window; here, a yield.
                    tokio::task::yield_now().await;
                    tx.commit().await.map_err(backend)?;
                }
            }
            Ok::<(), dlock_api::LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| dlock_api::LockError::backend("mysql", e))??;
    }
    let left: i32 = sqlx::query("SELECT stock FROM coupon WHERE id = ?")
        .bind(coupon_id)
        .fetch_one(&db)
        .await
        .map_err(backend)?
        .try_get(0)
        .map_err(backend)?;
    let tokens: Vec<u64> =
        sqlx::query("SELECT token FROM coupon_issue WHERE coupon_id = ? ORDER BY seq")
            .bind(coupon_id)
            .fetch_all(&db)
            .await
            .map_err(backend)?
            .iter()
            .map(|row| row.try_get::<u64, _>(0))
            .collect::<std::result::Result<_, _>>()
            .map_err(backend)?;
    Ok(Outcome {
        left: left.into(),
        issued: tokens.len() as i64,
        tokens_rise: tokens.windows(2).all(|w| w[0] < w[1]),
    })
}

/// The server: the first argument, else `DLOCK_URL` (as sqlx's examples take `DATABASE_URL`).
fn database_url() -> Result<String> {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DLOCK_URL").ok())
        .ok_or_else(|| dlock_api::LockError::Config {
            backend: "mysql",
            reason: "set DLOCK_URL (or pass the URL), e.g. mysql://root@127.0.0.1:3306/test".into(),
        })
}

fn backend(e: sqlx::Error) -> dlock_api::LockError {
    dlock_api::LockError::backend("mysql", e)
}

#[tokio::main]
async fn main() -> Result<()> {
    let url: Arc<str> = database_url()?.into();
    let right = issue_coupons(&url, Order::CommitThenRelease, 100).await?;
    println!(
        "commit, then release: {} left, {} issued (expected 0 and 100), tokens rise: {}",
        right.left, right.issued, right.tokens_rise
    );
    let wrong = issue_coupons(&url, Order::ReleaseThenCommit, 100).await?;
    println!(
        "release, then commit: {} left, {} issued: the next holder read the stock before the \
         previous commit, so coupons were issued on stale counts",
        wrong.left, wrong.issued
    );
    Ok(())
}
