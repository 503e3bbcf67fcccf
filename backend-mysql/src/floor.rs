//! The raw protocol floor, for benchmarks: what `GET_LOCK` + `RELEASE_LOCK` cost with nothing
//! around them.

use std::time::Duration;

use dlock_api::Result;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlSslMode};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::{Instant, timeout};

use crate::config::MySqlConfig;
use crate::error::{map_err, timed_out, unavailable};

/// **Benchmark helper.** Measures the raw floor this backend is compared against: `SELECT
/// GET_LOCK(n, 0)` then `SELECT RELEASE_LOCK(n)`, prepared statements, on **one connection held
/// throughout**, issued directly with sqlx (no dlock code, no fencing), back to back for
/// `duration` after a short warm-up. Returns each pair's latency.
///
/// `dlock bench` prints it next to dlock's own figures; the ratio is the backend's overhead.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL;
/// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server cannot be reached
/// or a command times out; [`LockError::Backend`](dlock_api::LockError::Backend) if the lock was
/// unexpectedly busy or the server refused a statement.
///
/// # Cancel safety
/// Cancel safe: dropping it closes its connection, which frees its lock.
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = MySqlConfig::from_url(url)?;
    let mut options = MySqlConnectOptions::new()
        .host(&config.host)
        .port(config.port)
        .username(&config.username)
        .ssl_mode(MySqlSslMode::Disabled)
        .disable_statement_logging();
    if let Some(password) = &config.password {
        options = options.password(password.expose());
    }
    if let Some(database) = &config.database {
        options = options.database(database);
    }
    let mut conn = timeout(
        config.connect_timeout,
        MySqlConnection::connect_with(&options),
    )
    .await
    .map_err(|_| timed_out(config.connect_timeout))?
    .map_err(map_err)?;
    let name = format!("dlock-floor/{:016x}", rand::random::<u64>());
    let limit = config.command_timeout;
    let warm_up = Duration::from_millis(200).min(duration / 5);
    let mut samples = Vec::new();
    let begun = Instant::now();
    loop {
        let now = Instant::now();
        let elapsed = now - begun;
        if elapsed >= warm_up + duration {
            break;
        }
        let pair = async {
            let got: Option<i64> = sqlx::query("SELECT GET_LOCK(?, 0)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?
                .try_get(0)?;
            let released: Option<i64> = sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(&name)
                .fetch_one(&mut conn)
                .await?
                .try_get(0)?;
            Ok::<_, sqlx::Error>((got, released))
        };
        let (got, released) = timeout(limit, pair)
            .await
            .map_err(|_| timed_out(limit))?
            .map_err(map_err)?;
        if got != Some(1) || released != Some(1) {
            return Err(unavailable(format!(
                "floor lock {name} was not free: GET_LOCK {got:?}, RELEASE_LOCK {released:?}"
            )));
        }
        if elapsed >= warm_up {
            samples.push(now.elapsed());
        }
    }
    let _ = conn.close().await;
    Ok(samples)
}
