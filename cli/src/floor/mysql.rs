//! MySQL's and MariaDB's raw floors, with sqlx alone: prepared `GET_LOCK(n, 0)` +
//! `RELEASE_LOCK(n)` on a held connection, and the server's own lock queue handing a blocking
//! `GET_LOCK` on.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_mysql::MySqlConfig;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlSslMode};
use sqlx::{ConnectOptions, Connection};
use tokio::time::{Instant, timeout};

use crate::floor::{FreeList, Ops, Pairs, Protocol, WarmUp, many, sample, sample_handoffs};

const BACKEND: &str = "mysql";

fn failed(error: sqlx::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

fn timed_out(after: Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}

/// The server a `mysql://` or `mariadb://` URL names.
#[derive(Debug)]
pub(crate) struct MySql {
    config: MySqlConfig,
}

impl MySql {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: MySqlConfig::from_url(url)?,
        })
    }

    /// Plain connections: no TLS, no statement logging, nothing of dlock's.
    fn options(&self) -> MySqlConnectOptions {
        let c = &self.config;
        let mut options = MySqlConnectOptions::new()
            .host(&c.host)
            .port(c.port)
            .username(&c.username)
            .ssl_mode(MySqlSslMode::Disabled)
            .disable_statement_logging();
        if let Some(password) = &c.password {
            options = options.password(password.expose());
        }
        if let Some(database) = &c.database {
            options = options.database(database);
        }
        options
    }

    async fn connect(&self) -> Result<MySqlConnection> {
        connect(&self.options(), self.config.connect_timeout).await
    }

    /// A lock name of this run.
    fn name(what: &str) -> String {
        format!("dlock-floor{what}/{:016x}", rand::random::<u64>())
    }
}

async fn connect(options: &MySqlConnectOptions, within: Duration) -> Result<MySqlConnection> {
    timeout(within, MySqlConnection::connect_with(options))
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)
}

/// One pair on `conn`: `GET_LOCK(name, 0)` then `RELEASE_LOCK(name)`, both answering 1.
async fn pair(conn: &mut MySqlConnection, name: &str, within: Duration) -> Result<()> {
    let statements = async {
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        Ok::<_, sqlx::Error>((got, released))
    };
    let (got, released) = timeout(within, statements)
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)?;
    if got != Some(1) || released != Some(1) {
        return Err(LockError::unexpected(
            BACKEND,
            format!("floor lock {name} was not free: GET_LOCK {got:?}, RELEASE_LOCK {released:?}"),
        ));
    }
    Ok(())
}

/// Pairs through a pool as large as dlock's: each takes a connection, runs its pair and gives
/// it back.
struct PooledPairs {
    pool: FreeList<MySqlConnection>,
    options: MySqlConnectOptions,
    names: Vec<String>,
    connect_timeout: Duration,
    within: Duration,
}

impl Pairs for PooledPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let name = &self.names[task];
        self.pool
            .with(
                || connect(&self.options, self.connect_timeout),
                async |conn| pair(conn, name, self.within).await,
            )
            .await
    }
}

async fn connection_id(conn: &mut MySqlConnection) -> Result<u64> {
    sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(conn)
        .await
        .map_err(failed)
}

impl Protocol for MySql {
    fn ops(&self) -> Ops {
        Ops {
            pair: "GET_LOCK(n,0) + RELEASE_LOCK(n), prepared",
            handoff: "RELEASE_LOCK, then the waiter's blocking GET_LOCK answers",
            client: format!(
                "a pool of {} connections (max_connections, as dlock's own pool)",
                self.config.max_connections
            ),
        }
    }

    /// On **one connection held throughout**, after a warm-up of 200 ms (at most a fifth of
    /// `duration`).
    async fn pairs(&self, duration: Duration) -> Result<Vec<Duration>> {
        let mut conn = self.connect().await?;
        let name = Self::name("");
        let within = self.config.command_timeout;
        let warm_up = WarmUp::For(Duration::from_millis(200).min(duration / 5));
        let samples = sample(warm_up, duration, async || {
            pair(&mut conn, &name, within).await
        })
        .await?;
        let _ = timeout(within, conn.close()).await;
        Ok(samples)
    }

    /// Two connections take turns; one holds `GET_LOCK(n, 0)`, the other waits in a blocking
    /// `GET_LOCK(n, 60)` (seen in state `User lock` in the process list before the release is
    /// sent), and one sample is the time from the holder sending `RELEASE_LOCK(n)` to the
    /// waiter's `GET_LOCK` answered.
    async fn handoffs(&self, duration: Duration) -> Result<Vec<Duration>> {
        let within = self.config.command_timeout;
        let mut first = self.connect().await?;
        let mut second = self.connect().await?;
        let ids: [u64; 2] = [
            connection_id(&mut first).await?,
            connection_id(&mut second).await?,
        ];
        let name = Self::name("-handoff");
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(&name)
            .fetch_one(&mut first)
            .await
            .map_err(failed)?;
        if got != Some(1) {
            return Err(LockError::unexpected(
                BACKEND,
                format!("floor lock {name} was not free"),
            ));
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
            let ((got, answered), sent) =
                timeout(within, async { tokio::join!(waiting, releasing) })
                    .await
                    .map_err(|_| timed_out(within))?;
            if got.map_err(failed)? != Some(1) {
                return Err(LockError::unexpected(
                    BACKEND,
                    format!("the waiter did not get {name}"),
                ));
            }
            Ok(answered.saturating_duration_since(sent.map_err(failed)?))
        };
        let samples = sample_handoffs(duration, async |forward| {
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

    /// A pool as large as dlock's own (`max_connections`), shared by the tasks: the least a
    /// pool does (no ping or reset of a connection between two pairs).
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<f64> {
        let run = Self::name("-parallel");
        let pairs = Arc::new(PooledPairs {
            pool: FreeList::new(self.config.max_connections),
            options: self.options(),
            names: (0..tasks).map(|i| format!("{run}/{i}")).collect(),
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
