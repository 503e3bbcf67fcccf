//! Postgres's raw floors, with sqlx alone: prepared `pg_try_advisory_lock` +
//! `pg_advisory_unlock` on a held connection, and a blocking `pg_advisory_lock` handed on by
//! the server.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_postgres::PostgresConfig;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::{ConnectOptions, Connection};
use tokio::time::{Instant, timeout};

use crate::floor::{FreeList, Ops, Pairs, Protocol, WarmUp, many, sample, sample_handoffs};

const BACKEND: &str = "postgres";

fn failed(error: sqlx::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

fn timed_out(after: Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}

/// The server a `postgres://` URL names.
#[derive(Debug)]
pub(crate) struct Postgres {
    config: PostgresConfig,
}

impl Postgres {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: PostgresConfig::from_url(url)?,
        })
    }

    /// Connections as dlock opens them (no TLS, no `.pgpass`, no start-up parameters a pooler
    /// would refuse, no statement logging), without any session settings.
    fn options(&self) -> PgConnectOptions {
        let c = &self.config;
        let mut options = PgConnectOptions::new_without_pgpass()
            .host(&c.host)
            .port(c.port)
            .username(&c.user)
            .database(&c.database)
            .ssl_mode(PgSslMode::Disable)
            .application_name(&c.application_name)
            .extra_float_digits(None)
            .disable_statement_logging();
        if let Some(password) = &c.password {
            options = options.password(password.expose());
        }
        options
    }

    async fn connect(&self) -> Result<PgConnection> {
        connect(&self.options(), self.config.connect_timeout).await
    }
}

async fn connect(options: &PgConnectOptions, within: Duration) -> Result<PgConnection> {
    timeout(within, PgConnection::connect_with(options))
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)
}

/// One pair on `conn`: `pg_try_advisory_lock(key)` then `pg_advisory_unlock(key)`, both true.
async fn pair(conn: &mut PgConnection, key: i64, within: Duration) -> Result<()> {
    let got: bool = timeout(
        within,
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut *conn),
    )
    .await
    .map_err(|_| timed_out(within))?
    .map_err(failed)?;
    let released: bool = timeout(
        within,
        sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .fetch_one(&mut *conn),
    )
    .await
    .map_err(|_| timed_out(within))?
    .map_err(failed)?;
    if !(got && released) {
        return Err(LockError::unexpected(
            BACKEND,
            "the raw floor's random key was held by someone else",
        ));
    }
    Ok(())
}

/// Pairs through a pool as large as dlock's: each takes a connection, runs its pair and gives
/// it back.
struct PooledPairs {
    pool: FreeList<PgConnection>,
    options: PgConnectOptions,
    keys: Vec<i64>,
    connect_timeout: Duration,
    within: Duration,
}

impl Pairs for PooledPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let key = self.keys[task];
        self.pool
            .with(
                || connect(&self.options, self.connect_timeout),
                async |conn| pair(conn, key, self.within).await,
            )
            .await
    }
}

async fn backend_pid(conn: &mut PgConnection) -> Result<i32> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .map_err(failed)
}

impl Protocol for Postgres {
    fn ops(&self) -> Ops {
        Ops {
            pair: "pg_try_advisory_lock + pg_advisory_unlock, prepared",
            handoff: "pg_advisory_unlock, then the waiter's blocking pg_advisory_lock answers",
            client: format!(
                "a pool of {} connections (max_connections, as dlock's own pool)",
                self.config.max_connections
            ),
        }
    }

    /// On **one connection held throughout**, a random key (concurrent runs do not contend),
    /// after a warm-up of 300 ms (at most `duration`).
    async fn pairs(&self, duration: Duration) -> Result<Vec<Duration>> {
        let mut conn = self.connect().await?;
        let key: i64 = rand::random();
        let within = self.config.command_timeout;
        let warm_up = WarmUp::For(Duration::from_millis(300).min(duration));
        let samples = sample(warm_up, duration, async || {
            pair(&mut conn, key, within).await
        })
        .await?;
        let _ = timeout(within, conn.close()).await;
        Ok(samples)
    }

    /// Two held connections take turns; one holds `pg_advisory_lock($1)`, the other waits in
    /// `pg_advisory_lock($1)` (seen waiting in `pg_stat_activity` before the release is sent),
    /// and one sample is the time from the holder sending `pg_advisory_unlock($1)` to the
    /// waiter's statement answered.
    async fn handoffs(&self, duration: Duration) -> Result<Vec<Duration>> {
        let within = self.config.command_timeout;
        let mut first = self.connect().await?;
        let mut second = self.connect().await?;
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
            .map_err(failed)?;
        // One hand-off from `holder` to `waiter`; returns release sent → waiter answered.
        let handoff = async |holder: &mut PgConnection,
                             waiter: &mut PgConnection,
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
            granted.map_err(failed)?;
            Ok(answered.saturating_duration_since(sent.map_err(failed)?))
        };
        let samples = sample_handoffs(duration, async |forward| {
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

    /// A pool as large as dlock's own (`max_connections`), shared by the tasks: the least a
    /// pool does (no ping or reset of a connection between two pairs).
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<f64> {
        let pairs = Arc::new(PooledPairs {
            pool: FreeList::new(self.config.max_connections),
            options: self.options(),
            keys: (0..tasks).map(|_| rand::random()).collect(),
            connect_timeout: self.config.connect_timeout,
            within: self.config.command_timeout,
        });
        let result = many(pairs.clone(), tasks, duration).await;
        if let Some(pairs) = Arc::into_inner(pairs) {
            for conn in pairs.pool.into_connections() {
                let _ = timeout(self.config.command_timeout, conn.close()).await;
            }
        }
        result
    }
}
