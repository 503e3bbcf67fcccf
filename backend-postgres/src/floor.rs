//! The raw protocol floor, for `dlock bench`.

use std::time::Duration;

use dlock_api::Result;
use sqlx::Connection;
use tokio::time::{Instant, timeout};

use crate::config::PostgresConfig;
use crate::driver::open_connection;
use crate::error::{map_err, timed_out};

/// **Benchmark helper.** Measures the raw floor this backend is compared with: on **one held
/// connection**, `SELECT pg_try_advisory_lock($1)` then `SELECT pg_advisory_unlock($1)`
/// (prepared statements, issued directly with sqlx), back to back for `duration` after a short
/// warm-up. Returns each pair's latency.
///
/// The key is random per call, so concurrent runs do not contend. Nothing else (no fencing, no
/// session bookkeeping) is in the loop: it is what the protocol itself costs.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL;
/// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) /
/// [`LockError::Backend`](dlock_api::LockError::Backend) when the server fails, or if a pair
/// does not get the lock (someone else holds the random key).
///
/// # Cancel safety
/// Cancel safe: dropping it closes the connection, which frees the lock.
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = PostgresConfig::from_url(url)?;
    let mut conn = open_connection(&config).await?;
    let key: i64 = rand::random();
    let within = config.command_timeout;
    let pair = async |conn: &mut sqlx::PgConnection| -> Result<Duration> {
        let started = Instant::now();
        let got: bool = timeout(
            within,
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(key)
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)?;
        let released: bool = timeout(
            within,
            sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)?;
        if !(got && released) {
            return Err(crate::error::unavailable(
                "the raw floor's random key was held by someone else",
            ));
        }
        Ok(started.elapsed())
    };
    let warm_until = Instant::now() + Duration::from_millis(300).min(duration);
    while Instant::now() < warm_until {
        pair(&mut conn).await?;
    }
    let mut samples = Vec::with_capacity(16_384);
    let until = Instant::now() + duration;
    while Instant::now() < until {
        samples.push(pair(&mut conn).await?);
    }
    let _ = timeout(within, conn.close()).await;
    Ok(samples)
}
