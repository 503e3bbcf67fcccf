//! [`MySqlDriver`]: the statements the shared session pool runs on MySQL / MariaDB connections.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{DriverError, PoolConfig, SessionDriver, TriedAll, Waited};
use dlock_api::{Leader, LockError, LockName};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection, Executor, Row};
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::{MySqlConfig, config_error};
use crate::election::LeaderSql;
use crate::error::{error_number, is_connection_error, map_err};
use crate::sql::{
    Cmd, ER_UNKNOWN_SEQUENCES, FENCE_RETENTION, Fence, HELLO, Reply, Sql, exec, raise_sequence,
    waits_in_fractions,
};
use crate::tls;

mod permits;
mod set;

pub(crate) use permits::{COUNT_PERMITS, MAX_PERMITS, SUFFIX_CHARS, semaphore_key};

impl MySqlConfig {
    /// The sqlx connect options of every connection dlock opens: the server (or its socket), the user, TLS as
    /// `ssl_mode` asks (certificate files read now), no statement logging. For tools that talk to
    /// the same server with sqlx directly, as `dlock bench` does for its raw floors.
    ///
    /// # Errors
    /// [`LockError::Config`] if a certificate file cannot be read, or `ssl_cert` comes without
    /// `ssl_key` (or the reverse).
    #[cfg(feature = "driver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "driver")))]
    pub fn connect_options(&self) -> dlock_api::Result<MySqlConnectOptions> {
        self.driver_options()
    }

    /// [`connect_options`](Self::connect_options), for this crate's own connections.
    pub(crate) fn driver_options(&self) -> dlock_api::Result<MySqlConnectOptions> {
        let mut options = MySqlConnectOptions::new()
            .host(&self.host)
            .port(self.port)
            .username(&self.username)
            .disable_statement_logging();
        if let Some(password) = &self.password {
            options = options.password(password.expose());
        }
        if let Some(database) = &self.database {
            options = options.database(database);
        }
        if let Some(socket) = &self.socket {
            options = options.socket(socket);
        }
        tls::apply(options, self.ssl_mode, &self.tls_files)
    }
}

/// `GET_LOCK` named locks for a [`SessionPool`](dlock_api::raw::SessionPool). Keys are mapped
/// names (with the prefix); tokens come from the fencing table in the same statement.
pub(crate) struct MySqlDriver {
    pub(crate) config: MySqlConfig,
    sql: Sql,
    connect: MySqlConnectOptions,
    init: String,
    /// Where tokens come from: decided by the first connection's server.
    fence: OnceLock<Fence>,
    /// Whether the server's `GET_LOCK` waits for fractions of a second: decided by the first
    /// connection's server.
    fractional_waits: OnceLock<bool>,
    /// When this client last swept old counter rows (`None`: not yet).
    last_sweep: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// The leaders table's statements; `None` with fencing off (elections need terms).
    leaders: Option<LeaderSql>,
    /// The semaphores' statements, built once per number of permits.
    permit_sql: permits::PermitSql,
}

impl MySqlDriver {
    pub(crate) fn new(config: MySqlConfig) -> dlock_api::Result<Self> {
        Ok(Self {
            sql: Sql::new(&config),
            init: Sql::init(&config),
            leaders: config.fencing.then(|| LeaderSql::new(&config)),
            connect: config.driver_options()?.statement_cache_capacity(16),
            config,
            fence: OnceLock::new(),
            fractional_waits: OnceLock::new(),
            last_sweep: std::sync::Mutex::new(None),
            permit_sql: permits::PermitSql::default(),
        })
    }

    /// Where this client's tokens come from (`Row` until a connection has met the server).
    pub(crate) fn fence(&self) -> Fence {
        self.fence.get().copied().unwrap_or(if self.config.fencing {
            Fence::Row
        } else {
            Fence::Off
        })
    }

    /// The pool limits this client's options ask for.
    pub(crate) fn pool_config(&self) -> PoolConfig {
        // Waits go to the server in 30 s pieces (so a silently dead connection is noticed), and
        // a wait the server has not ended 250 ms past its deadline is interrupted with
        // `KILL QUERY`: the pool's defaults.
        let c = &self.config;
        PoolConfig::new(
            c.max_connections,
            c.connect_timeout,
            c.command_timeout,
            c.keepalive,
        )
    }

    /// Runs `cmd`, telling a dead connection from a failed statement.
    async fn run(&self, conn: &mut MySqlConnection, cmd: &Cmd) -> Result<Reply, DriverError> {
        exec(conn, &self.sql, cmd).await.map_err(failure)
    }

    fn acquire(&self, key: &Arc<str>, wait: Duration) -> Cmd {
        Cmd::Acquire {
            key: key.clone(),
            wait,
            fence: self.fence(),
            create_table: self.config.create_table,
        }
    }

    /// Whether this release should sweep the counter table (claiming the sweep if so): on the
    /// counter-row fence, at the first release and then once per [`FENCE_RETENTION`].
    fn sweep_due(&self) -> bool {
        if self.fence() != Fence::Row || !self.config.fencing {
            return false;
        }
        let now = tokio::time::Instant::now();
        let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
        let due = last.is_none_or(|at| now.saturating_duration_since(at) >= FENCE_RETENTION);
        if due {
            *last = Some(now);
        }
        due
    }

    /// Creates the fencing table, or sequence, on a connection of its own.
    pub(crate) async fn migrate(&self) -> dlock_api::Result<()> {
        let (mut conn, _) = self.open().await?;
        let cmd = Cmd::CreateTable(self.fence());
        let create = async {
            let reply = self.run(&mut conn, &cmd).await?;
            if let Some(leaders) = &self.leaders {
                leaders.create(&mut conn).await.map_err(failure)?;
            }
            Ok(reply)
        };
        let reply = tokio::time::timeout(self.config.command_timeout, create)
            .await
            .map_err(|_| LockError::command_timeout(BACKEND, self.config.command_timeout))?
            .map_err(|f: DriverError| f.error);
        let _ = tokio::time::timeout(self.config.command_timeout, conn.close()).await;
        reply.map(drop)
    }
}

/// `KILL QUERY` ended the statement.
const ER_QUERY_INTERRUPTED: u16 = 1317;
/// InnoDB rolled a statement back as a deadlock's victim.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// InnoDB rolled a statement back after `innodb_lock_wait_timeout` waiting for a row lock.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// A statement's row lock not granted: the statement rolled back, the transaction did not.
const ROW_LOCK_FAILED: [u16; 2] = [ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT];

fn failure(error: sqlx::Error) -> DriverError {
    if is_connection_error(&error) {
        DriverError::broken(map_err(error))
    } else {
        DriverError::statement(map_err(error))
    }
}

impl MySqlDriver {
    /// The leaders table's statements, or `Unsupported` with fencing off.
    fn leaders(&self) -> Result<&LeaderSql, DriverError> {
        self.leaders.as_ref().ok_or_else(|| {
            DriverError::statement(LockError::Unsupported {
                backend: BACKEND,
                operation: "elections without fencing (a term is a fencing token)",
            })
        })
    }
}

fn unexpected(reply: Reply) -> DriverError {
    DriverError::statement(LockError::unexpected(
        BACKEND,
        format!("unexpected reply {reply:?}"),
    ))
}

#[async_trait]
impl SessionDriver for MySqlDriver {
    type Conn = MySqlConnection;
    type Key = Arc<str>;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    async fn open(&self) -> dlock_api::Result<(MySqlConnection, u64)> {
        let mut conn = MySqlConnection::connect_with(&self.connect)
            .await
            .map_err(|e| {
                if tls::is_tls_refusal(&e) {
                    config_error(format!("TLS with the server failed: {e}"))
                } else if matches!(e, sqlx::Error::Database(_)) && !is_connection_error(&e) {
                    // Access denied, an unknown database, …: a configuration to fix, not an
                    // outage to wait out (as Postgres reports it).
                    config_error(format!(
                        "the server refused the connection: {}",
                        e.as_database_error().map(|d| d.message()).unwrap_or("")
                    ))
                } else {
                    map_err(e)
                }
            })?;
        conn.execute(sqlx::raw_sql(&self.init))
            .await
            .map_err(map_err)?;
        let row = sqlx::query(HELLO)
            .fetch_one(&mut conn)
            .await
            .map_err(map_err)?;
        let server_id = row.try_get::<i64, _>(0).map_err(map_err)?;
        let version = row.try_get::<String, _>(1).map_err(map_err)?;
        let now_micros = row.try_get::<u64, _>(2).map_err(map_err)?;
        let fence = *self.fence.get_or_init(|| {
            Fence::for_server(self.config.fencing, self.config.fence_table, &version)
        });
        self.fractional_waits
            .get_or_init(|| waits_in_fractions(&version));
        if fence == Fence::Sequence {
            raise_sequence(&mut conn, &self.sql, now_micros, self.config.create_table)
                .await
                .map_err(map_err)?;
        }
        Ok((conn, server_id.unsigned_abs()))
    }

    async fn try_lock(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
    ) -> Result<Option<u64>, DriverError> {
        match self.run(conn, &self.acquire(key, Duration::ZERO)).await? {
            Reply::Acquired(token) => Ok(token),
            other => Err(unexpected(other)),
        }
    }

    async fn try_lock_all(
        &self,
        conn: &mut MySqlConnection,
        names: &[LockName],
        keys: &[Arc<str>],
    ) -> Result<TriedAll, DriverError> {
        self.try_set(conn, names, keys).await
    }

    async fn wait_lock(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
        wait: Duration,
    ) -> Result<Waited, DriverError> {
        match self.run(conn, &self.acquire(key, wait)).await? {
            Reply::Acquired(Some(token)) => Ok(Waited::Granted(token)),
            // 0: timed out; NULL: interrupted (`KILL QUERY`). Either way not granted.
            Reply::Acquired(None) => Ok(Waited::NotGranted),
            other => Err(unexpected(other)),
        }
    }

    async fn unlock(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
    ) -> Result<bool, DriverError> {
        let released = match self.run(conn, &Cmd::Release { key: key.clone() }).await? {
            // 0: another connection holds it; NULL: nobody does. Either way not ours.
            Reply::Released(released) => released == Some(1),
            other => return Err(unexpected(other)),
        };
        if self.sweep_due() {
            // Counter rows of names no longer used go here, a few at a time, at most once per
            // retention per client: off the acquire path, and never failing the release.
            match self.run(conn, &Cmd::SweepFence).await {
                Ok(Reply::Swept(rows)) if rows > 0 => {
                    tracing::debug!(
                        rows,
                        "dlock mysql: deleted counter rows past their retention"
                    );
                }
                Ok(_) => {}
                Err(failure) => {
                    tracing::debug!(error = %failure.error, "dlock mysql: the counter sweep failed");
                }
            }
        }
        Ok(released)
    }

    /// Every slot of the semaphore `key` tried in one statement, from a random one round.
    async fn try_permit(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
        permits: u32,
    ) -> Result<Option<(u64, u32)>, DriverError> {
        self.try_permit_now(conn, key, permits).await
    }

    /// In line for the semaphore's room, then as the first in line every slot tried with a
    /// short wait on one (see the crate docs, *Semaphores*).
    async fn wait_permit(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
        permits: u32,
        wait: Duration,
    ) -> Result<Waited, DriverError> {
        self.wait_permit_in_line(conn, key, permits, wait).await
    }

    async fn unlock_permit(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
        permits: u32,
        slot: Option<u32>,
    ) -> Result<bool, DriverError> {
        self.release_permit(conn, key, permits, slot).await
    }

    async fn proclaim(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
        term: u64,
        value: &[u8],
    ) -> Result<bool, DriverError> {
        self.leaders()?
            .proclaim(conn, key, term, value)
            .await
            .map_err(failure)
    }

    /// On MariaDB's fencing sequence, one statement waits, draws the token and writes the
    /// record (`LeaderSql::wait_leading`); the counter row (MySQL) takes its own statement for
    /// the token, so there the record is proclaimed after the grant.
    async fn wait_lock_as_leader(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
        wait: Duration,
        value: &[u8],
    ) -> Result<(Waited, bool), DriverError> {
        let leaders = match &self.leaders {
            Some(leaders) if self.fence() == Fence::Sequence => leaders,
            _ => return Ok((self.wait_lock(conn, key, wait).await?, false)),
        };
        let until = after(Instant::now(), wait);
        let mut left = wait;
        loop {
            return match leaders.wait_leading(conn, key, left, value).await {
                Ok(Some(token)) => Ok((Waited::Granted(token), true)),
                // 0 rows: timed out, or interrupted (`KILL QUERY`) in `GET_LOCK`: not granted.
                Ok(None) => Ok((Waited::NotGranted, false)),
                // Interrupted with the lock maybe granted (the statement ends on the kill after
                // `GET_LOCK` returned, and rolls back the record but not the session's lock).
                Err(e) if error_number(&e) == Some(ER_QUERY_INTERRUPTED) => {
                    Ok((Waited::NotGrantedUnsure, false))
                }
                // The record's write, granted the key, found its row locked by another
                // transaction (a resigning leader's delete not yet committed, anyone's reader)
                // and InnoDB rolled the statement back, as a deadlock's victim or after
                // `innodb_lock_wait_timeout`: not the lock it took. The lock goes back (only
                // the lock: there is no record of this grant to delete, and a delete would wait
                // for the same row) and the wait goes on, as InnoDB asks.
                Err(e) if error_number(&e).is_some_and(|n| ROW_LOCK_FAILED.contains(&n)) => {
                    self.run(conn, &Cmd::Release { key: key.clone() }).await?;
                    left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok((Waited::NotGranted, false));
                    }
                    continue;
                }
                // The sequence went since this connection raised it: the lock's own statement
                // makes it again, and the record is proclaimed after the grant.
                Err(e) if error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) => {
                    Ok((self.wait_lock(conn, key, left).await?, false))
                }
                Err(e) => Err(failure(e)),
            };
        }
    }

    async fn leader(
        &self,
        conn: &mut MySqlConnection,
        _name: &LockName,
        key: &Arc<str>,
    ) -> Result<Option<Leader>, DriverError> {
        self.leaders()?.leader(conn, key).await.map_err(failure)
    }

    /// The lock first, alone, as a lock's release: the successor is granted at once, not a
    /// delete (and its commit) later. Meanwhile the row counts for nobody, as its writer no
    /// longer holds the key; it goes (only if still this connection's: a successor's stays)
    /// before this connection can take the key again, or the row would count once more.
    async fn unlock_leader(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
    ) -> Result<bool, DriverError> {
        let leaders = self.leaders()?;
        let unlocked = self.unlock(conn, key).await?;
        match leaders.forget(conn, key).await {
            Ok(()) => Ok(unlocked),
            // Closing the connection is what keeps its row from counting again.
            Err(e) => Err(DriverError::broken(map_err(e))),
        }
    }

    async fn ping(&self, conn: &mut MySqlConnection) -> Result<(), DriverError> {
        self.run(conn, &Cmd::Ping).await.map(|_| ())
    }

    async fn interrupt(&self, conn: &mut MySqlConnection, target: u64) -> Result<(), DriverError> {
        self.run(conn, &Cmd::KillQuery(target)).await.map(|_| ())
    }
}

impl fmt::Debug for MySqlDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlDriver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
