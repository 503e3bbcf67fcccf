//! The duplicate purchase-order scenario with `with_lock` around a transaction: ten copies of
//! one order request arrive at once (a double-clicked button, a client retrying); each takes
//! the request's lock, and inside it a transaction checks whether the order exists, inserts it
//! if not, stamps the row with the lock's fencing token through a conditional write
//! (`… WHERE fence < $token`: a holder whose lease ran out cannot overwrite a newer holder's
//! work), and commits. `with_lock` releases only after the closure, commit included, returns,
//! so the next copy sees the committed row. Exactly one order is created.
//!
//! `DLOCK_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run -p dlock-postgres --example
//! with_lock_transaction` (the URL may also be the first argument; it uses a table
//! `purchase_order` of its own).

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockOptions};
use dlock_postgres::PostgresLock;
use sqlx::postgres::PgPoolOptions;

fn sql_err(e: sqlx::Error) -> LockError {
    LockError::backend("postgres", e)
}

/// One copy of the request: creates the order unless an earlier copy did. Returns whether this
/// copy created it.
async fn place_order(
    locks: &PostgresLock,
    pool: &sqlx::PgPool,
    request: &str,
) -> Result<bool, LockError> {
    let options = LockOptions::new().with_wait_timeout(Duration::from_secs(30));
    let name = format!("purchase-order:{request}");
    let created = locks
        .with_lock(name.as_str(), &options, |lock| async move {
            let presented = lock.fencing_token();
            let token = i64::try_from(presented.get()).map_err(|_| LockError::InvalidArgument {
                what: "fencing token",
                reason: "a token above i64::MAX does not fit the fence column".into(),
            })?;
            let mut tx = pool.begin().await.map_err(sql_err)?;
            let exists: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM purchase_order WHERE request_id = $1)",
            )
            .bind(request)
            .fetch_one(&mut *tx)
            .await
            .map_err(sql_err)?;
            if !exists {
                sqlx::query("INSERT INTO purchase_order (request_id, fence) VALUES ($1, 0)")
                    .bind(request)
                    .execute(&mut *tx)
                    .await
                    .map_err(sql_err)?;
            }
            // The storage's own check: a stale holder's token is refused here.
            let stamped = sqlx::query(
                "UPDATE purchase_order SET fence = $2 WHERE request_id = $1 AND fence < $2",
            )
            .bind(request)
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(sql_err)?;
            if stamped.rows_affected() == 0 {
                let highest: i64 =
                    sqlx::query_scalar("SELECT fence FROM purchase_order WHERE request_id = $1")
                        .bind(request)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(sql_err)?;
                return Err(LockError::Fenced {
                    name: request.to_owned(),
                    presented,
                    highest: dlock_api::FencingToken::new(u64::try_from(highest).unwrap_or(0)),
                });
            }
            tx.commit().await.map_err(sql_err)?; // before the release, never after
            Ok::<_, LockError>(!exists)
        })
        .await??;
    Ok(created)
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
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
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS purchase_order \
         (request_id text PRIMARY KEY, fence bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .map_err(sql_err)?;
    let request = format!("req-{:08x}", rand::random::<u32>());
    let locks = PostgresLock::connect_url(&url).await?;
    let mut copies = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (locks, pool, request) = (locks.clone(), pool.clone(), request.clone());
        copies.spawn(async move { place_order(&locks, &pool, &request).await });
    }
    let mut created = 0;
    while let Some(copy) = copies.join_next().await {
        if copy.expect("a copy panicked")? {
            created += 1;
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM purchase_order WHERE request_id = $1")
        .bind(&request)
        .fetch_one(&pool)
        .await
        .map_err(sql_err)?;
    println!("10 copies of order {request}: {created} created it, {rows} row(s) in the table");
    assert_eq!((created, rows), (1, 1), "exactly one order per request");
    Ok(())
}
