//! MySQL's and MariaDB's raw floors, with sqlx alone: prepared `GET_LOCK(n, 0)` +
//! `RELEASE_LOCK(n)` on a held connection, and the server's own lock queue handing a blocking
//! `GET_LOCK` on.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_mysql::MySqlConfig;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlSslMode};
use sqlx::{ConnectOptions, Connection};
use tokio::time::timeout;

use crate::contend::{Contender, contend};
use crate::floor::{FreeList, Measured, Ops, Pairs, Protocol, Throughput, WarmUp, many, sample};

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

impl Protocol for MySql {
    fn ops(&self) -> Ops {
        Ops {
            pair: "GET_LOCK(n,0) + RELEASE_LOCK(n), prepared",
            fenced_pair: None,
            handoff: "RELEASE_LOCK, then the next blocking GET_LOCK answers (raw connections contending as dlock's clients do)",
            client: format!(
                "a pool of {} connections (max_connections, as dlock's own pool)",
                self.config.max_connections
            ),
        }
    }

    /// On **one connection held throughout**, after a warm-up of 200 ms (at most a fifth of
    /// `duration`).
    async fn pairs(&self, duration: Duration) -> Result<Measured> {
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

    /// `waiters` connections, each waiting in a blocking `GET_LOCK(name, 3600)` and holding the
    /// lock `hold` once the server grants it, run through the same contention loop as dlock's
    /// own phase: a sample is the time from a holder sending `RELEASE_LOCK` to the next
    /// holder's `GET_LOCK` answered.
    async fn handoffs(
        &self,
        duration: Duration,
        waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let name = Self::name("-handoff");
        let mut contenders = Vec::with_capacity(waiters);
        for _ in 0..waiters.max(2) {
            contenders.push(RawContender {
                conn: self.connect().await?,
                name: name.clone(),
            });
        }
        let (samples, _) = contend(contenders, duration, hold).await?;
        Ok(samples)
    }

    /// A pool as large as dlock's own (`max_connections`), shared by the tasks: the least a
    /// pool does (no ping or reset of a connection between two pairs).
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
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

/// One connection contending for a name with `GET_LOCK` and `RELEASE_LOCK`.
struct RawContender {
    conn: MySqlConnection,
    name: String,
}

impl Contender for RawContender {
    async fn lock(&mut self) -> Result<()> {
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 3600)")
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .map_err(failed)?;
        if got == Some(1) {
            Ok(())
        } else {
            Err(LockError::unexpected(
                BACKEND,
                format!("GET_LOCK({}) answered {got:?}", self.name),
            ))
        }
    }

    async fn unlock(&mut self) -> Result<()> {
        let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .map_err(failed)?;
        Ok(())
    }
}
