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
    let mut conn = connect(&config).await?;
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

/// One plain connection, as the floors use: no dlock code on it.
async fn connect(config: &MySqlConfig) -> Result<MySqlConnection> {
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
    timeout(
        config.connect_timeout,
        MySqlConnection::connect_with(&options),
    )
    .await
    .map_err(|_| timed_out(config.connect_timeout))?
    .map_err(map_err)
}

/// **Benchmark helper.** Measures the server-queue hand-off this backend is compared with: two
/// connections take turns; one holds `GET_LOCK(n, 0)`, the other waits in a blocking
/// `GET_LOCK(n, 60)` (seen in state `User lock` in the process list before the release is sent),
/// and one sample is the time from the holder sending `RELEASE_LOCK(n)` to the waiter's
/// `GET_LOCK` answered: what the server's own lock queue hands off in, with nothing around it.
///
/// # Errors
/// As [`raw_floor`].
///
/// # Cancel safety
/// Cancel safe: dropping it closes both connections, which frees the lock.
pub async fn raw_handoff_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = MySqlConfig::from_url(url)?;
    let within = config.command_timeout;
    let mut first = connect(&config).await?;
    let mut second = connect(&config).await?;
    let ids: [u64; 2] = [
        connection_id(&mut first).await?,
        connection_id(&mut second).await?,
    ];
    let name = format!("dlock-floor-handoff/{:016x}", rand::random::<u64>());
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&name)
        .fetch_one(&mut first)
        .await
        .map_err(map_err)?;
    if got != Some(1) {
        return Err(unavailable(format!("floor lock {name} was not free")));
    }
    // One hand-off from `holder` to `waiter`; returns release sent → waiter answered.
    let handoff = async |holder: &mut MySqlConnection,
                         waiter: &mut MySqlConnection,
                         waiter_id: u64|
           -> Result<Duration> {
        let waiting = async {
            let got = sqlx::query_scalar::<_, Option<i64>>("SELECT GET_LOCK(?, 60)")
                .bind(&name)
                .fetch_one(&mut *waiter)
                .await;
            (got, Instant::now())
        };
        let releasing = async {
            // Off the clock: the waiter's statement must be queued at the server first.
            loop {
                let blocked: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                     WHERE ID = ? AND STATE = 'User lock'",
                )
                .bind(waiter_id)
                .fetch_one(&mut *holder)
                .await?;
                if blocked > 0 {
                    break;
                }
            }
            let sent = Instant::now();
            sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(&name)
                .execute(&mut *holder)
                .await?;
            Ok::<_, sqlx::Error>(sent)
        };
        let ((got, answered), sent) = timeout(within, async { tokio::join!(waiting, releasing) })
            .await
            .map_err(|_| timed_out(within))?;
        if got.map_err(map_err)? != Some(1) {
            return Err(unavailable(format!("the waiter did not get {name}")));
        }
        Ok(answered.saturating_duration_since(sent.map_err(map_err)?))
    };
    let samples = dlock_api::raw::floor::sample_handoffs(duration, async |forward| {
        if forward {
            handoff(&mut first, &mut second, ids[1]).await
        } else {
            handoff(&mut second, &mut first, ids[0]).await
        }
    })
    .await?;
    let _ = timeout(within, first.close()).await;
    let _ = timeout(within, second.close()).await;
    Ok(samples)
}

async fn connection_id(conn: &mut MySqlConnection) -> Result<u64> {
    sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(conn)
        .await
        .map_err(map_err)
}
