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

/// **Benchmark helper.** Measures the server-queue hand-off this backend is compared with: two
/// held connections take turns; one holds `pg_advisory_lock($1)`, the other waits in
/// `pg_advisory_lock($1)` (seen waiting in `pg_stat_activity` before the release is sent), and
/// one sample is the time from the holder sending `pg_advisory_unlock($1)` to the waiter's
/// statement answered: what a blocking advisory lock hands off in, with nothing around it.
///
/// # Errors
/// As [`raw_floor`].
///
/// # Cancel safety
/// Cancel safe: dropping it closes both connections, which frees the lock.
pub async fn raw_handoff_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = PostgresConfig::from_url(url)?;
    let within = config.command_timeout;
    let mut first = open_connection(&config).await?;
    let mut second = open_connection(&config).await?;
    let pids: [i32; 2] = [
        backend_pid(&mut first).await?,
        backend_pid(&mut second).await?,
    ];
    let key: i64 = rand::random();
    let lock = "SELECT pg_advisory_lock($1)";
    sqlx::query(lock)
        .bind(key)
        .execute(&mut first)
        .await
        .map_err(map_err)?;
    // One hand-off from `holder` to `waiter`; returns release sent → waiter answered.
    let handoff = async |holder: &mut sqlx::PgConnection,
                         waiter: &mut sqlx::PgConnection,
                         waiter_pid: i32|
           -> Result<Duration> {
        let waiting = async {
            let granted = sqlx::query(lock).bind(key).execute(&mut *waiter).await;
            (granted, Instant::now())
        };
        let releasing = async {
            // Off the clock: the waiter's statement must be queued at the server first.
            loop {
                let blocked: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 \
                     AND wait_event_type = 'Lock')",
                )
                .bind(waiter_pid)
                .fetch_one(&mut *holder)
                .await?;
                if blocked {
                    break;
                }
            }
            let sent = Instant::now();
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .execute(&mut *holder)
                .await?;
            Ok::<_, sqlx::Error>(sent)
        };
        let ((granted, answered), sent) =
            timeout(within, async { tokio::join!(waiting, releasing) })
                .await
                .map_err(|_| timed_out(within))?;
        granted.map_err(map_err)?;
        Ok(answered.saturating_duration_since(sent.map_err(map_err)?))
    };
    let samples = dlock_api::raw::floor::sample_handoffs(duration, async |forward| {
        if forward {
            handoff(&mut first, &mut second, pids[1]).await
        } else {
            handoff(&mut second, &mut first, pids[0]).await
        }
    })
    .await?;
    let _ = timeout(within, first.close()).await;
    let _ = timeout(within, second.close()).await;
    Ok(samples)
}

async fn backend_pid(conn: &mut sqlx::PgConnection) -> Result<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .map_err(map_err)
}
