//! [`PgDriver`]: the statements the shared session pool runs on Postgres connections.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::{DriverError, PoolConfig, SessionDriver, Waited};
use dlock_api::{LockError, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::timeout;

use crate::config::PostgresConfig;
use crate::error::{
    LOCK_NOT_AVAILABLE, QUERY_CANCELED, is_connection_error, map_err, sqlstate, timed_out,
};
use crate::fence::Fence;
use crate::key::RawKey;
use crate::sql::{self, Sql};
use crate::tls;

/// Session advisory locks for a [`SessionPool`](dlock_api::raw::SessionPool); tokens are drawn
/// in the same statement, and renewed by the [`Fence`] when outside its window.
pub(crate) struct PgDriver {
    pub(crate) config: PostgresConfig,
    sql: Sql,
    /// Where tokens come from; `None` with fencing off.
    fence: Option<Fence>,
    connect: PgConnectOptions,
}

impl PostgresConfig {
    /// The sqlx connect options of every connection dlock opens: the server, the user, TLS as
    /// `sslmode` asks (certificate files read now), no `.pgpass`, no statement logging, and no
    /// start-up parameters a pooler would refuse. For tools that talk to the same server with
    /// sqlx directly, as `dlock bench` does for its raw floors.
    ///
    /// # Errors
    /// [`LockError::Config`] if a certificate file cannot be read, or `sslcert` comes without
    /// `sslkey` (or the reverse).
    #[cfg(feature = "driver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "driver")))]
    pub fn connect_options(&self) -> Result<PgConnectOptions> {
        self.driver_options()
    }

    /// [`connect_options`](Self::connect_options), for this crate's own connections.
    pub(crate) fn driver_options(&self) -> Result<PgConnectOptions> {
        let mut options = PgConnectOptions::new_without_pgpass()
            .host(&self.host)
            .port(self.port)
            .username(&self.user)
            .database(&self.database)
            .application_name(&self.application_name)
            // dlock reads no floats; and a pooler refuses start-up parameters it does not know, so
            // the session settings go in `prepare`'s statement, not in the start-up packet.
            .extra_float_digits(None)
            .disable_statement_logging();
        if let Some(password) = &self.password {
            options = options.password(password.expose());
        }
        tls::apply(options, self.sslmode, &self.tls_files)
    }
}

/// Opens one connection within the connect timeout.
pub(crate) async fn open_connection(config: &PostgresConfig) -> Result<PgConnection> {
    open_with(&config.driver_options()?, config.connect_timeout).await
}

async fn open_with(options: &PgConnectOptions, within: Duration) -> Result<PgConnection> {
    match timeout(within, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) if matches!(e, sqlx::Error::Database(_)) && !is_connection_error(&e) => {
            // Authentication, unknown database, …: a configuration problem, not an outage.
            Err(crate::config::config_error(format!(
                "the server refused the connection: {}",
                e.as_database_error().map(|d| d.message()).unwrap_or("")
            )))
        }
        // An untrusted certificate, a name it does not cover, a server without TLS: retrying
        // will not help, the URL or the server's setup must change. (rustls reports a refused
        // certificate as invalid data on the socket.)
        Ok(Err(e)) if is_tls_failure(&e) => Err(crate::config::config_error(format!(
            "TLS with the server failed: {e}"
        ))),
        Ok(Err(e)) => Err(LockError::unavailable(crate::BACKEND, e)),
        Err(_) => Err(timed_out(within)),
    }
}

fn is_tls_failure(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(e) => e.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    }
}

fn failure(error: sqlx::Error) -> DriverError {
    if is_connection_error(&error) {
        DriverError::broken(map_err(error))
    } else {
        DriverError::statement(map_err(error))
    }
}

impl PgDriver {
    pub(crate) fn new(config: PostgresConfig, sql: Sql, fence: Option<Fence>) -> Result<Self> {
        Ok(Self {
            connect: config.driver_options()?,
            config,
            sql,
            fence,
        })
    }

    /// The token of a grant whose statement drew `drawn`: kept, or renewed by the fence on
    /// the same connection (an error leaves the caller holding the lock, to unlock).
    async fn settle(
        &self,
        conn: &mut PgConnection,
        drawn: i64,
    ) -> std::result::Result<u64, DriverError> {
        let token = match &self.fence {
            Some(fence) => fence.settle(conn, drawn).await.map_err(failure)?,
            None => drawn,
        };
        Ok(token.unsigned_abs())
    }

    /// The pool limits this client's options ask for.
    pub(crate) fn pool_config(&self) -> PoolConfig {
        let c = &self.config;
        PoolConfig::new(
            c.max_connections,
            c.connect_timeout,
            c.command_timeout,
            c.keepalive,
        )
        .with_wait_chunk(c.wait_slice)
    }

    /// Makes an open connection one of the pool's: its backend pid, and the session settings
    /// every dlock connection runs with (set here rather than as start-up options, which
    /// PgBouncer refuses): fence tokens must survive a crash where the server commits
    /// asynchronously (`synchronous_commit`); a blocking wait is bounded by `lock_timeout`, not
    /// a server-wide `statement_timeout`; `pg_advisory_unlock` of a key not held only warns, and
    /// dlock handles the `false` itself; the server's TCP keepalive ends a vanished client's
    /// session; no `idle_session_timeout` (PG 14+) on a session that holds locks.
    pub(crate) async fn prepare(&self, conn: &mut PgConnection) -> Result<u64> {
        let within = self.config.command_timeout;
        let c = &self.config;
        let row = timeout(
            within,
            sqlx::query(
                "SELECT pg_backend_pid(), set_config('synchronous_commit', 'on', false), \
                 set_config('statement_timeout', '0', false), \
                 set_config('idle_in_transaction_session_timeout', '0', false), \
                 set_config('client_min_messages', 'error', false), \
                 set_config('tcp_keepalives_idle', $1, false), \
                 set_config('tcp_keepalives_interval', $2, false), \
                 set_config('tcp_keepalives_count', $3, false), \
                 (SELECT set_config('idle_session_timeout', '0', false) \
                 WHERE current_setting('server_version_num')::int >= 140000)",
            )
            .bind(c.tcp_keepalives_idle.as_secs().max(1).to_string())
            .bind(c.tcp_keepalives_interval.as_secs().max(1).to_string())
            .bind(c.tcp_keepalives_count.to_string())
            .fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)?;
        let pid: i32 = row.try_get(0).map_err(map_err)?;
        Ok(u64::from(pid.unsigned_abs()))
    }
}

#[async_trait]
impl SessionDriver for PgDriver {
    type Conn = PgConnection;
    type Key = RawKey;

    fn backend(&self) -> &'static str {
        crate::BACKEND
    }

    async fn open(&self) -> Result<(PgConnection, u64)> {
        let mut conn = open_with(&self.connect, self.config.connect_timeout).await?;
        let pid = self.prepare(&mut conn).await?;
        Ok((conn, pid))
    }

    async fn try_lock(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
    ) -> std::result::Result<Option<u64>, DriverError> {
        let row = self
            .sql
            .try_lock(*key)
            .fetch_one(&mut *conn)
            .await
            .map_err(failure)?;
        let drawn: Option<i64> = row.try_get(0).map_err(failure)?;
        match drawn {
            Some(drawn) => self.settle(conn, drawn).await.map(Some),
            None => Ok(None),
        }
    }

    async fn wait_lock(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
        wait: Duration,
    ) -> std::result::Result<Waited, DriverError> {
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        match self.sql.wait_lock(*key, ms).fetch_one(&mut *conn).await {
            Ok(row) => {
                let drawn: i64 = row.try_get(0).map_err(failure)?;
                self.settle(conn, drawn).await.map(Waited::Granted)
            }
            // Seen under load: `lock_timeout` fires as the lock is granted, and the error is
            // raised with the lock already in the session's lock table (a session lock outlives
            // the failed statement).
            Err(e) if sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                Ok(Waited::NotGrantedUnsure)
            }
            Err(e) => Err(failure(e)),
        }
    }

    async fn unlock(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
    ) -> std::result::Result<bool, DriverError> {
        // A cancel request is a signal the server may act on late: one that lands on this
        // statement (ours, for a wait that just ended) is retried.
        let mut attempts: u32 = 0;
        loop {
            attempts = attempts.saturating_add(1);
            match sql::unlock(*key).fetch_one(&mut *conn).await {
                Ok(row) => return row.try_get::<bool, _>(0).map_err(failure),
                Err(e) if attempts < 3 && sqlstate(&e).as_deref() == Some(QUERY_CANCELED) => {}
                Err(e) => return Err(failure(e)),
            }
        }
    }

    async fn ping(&self, conn: &mut PgConnection) -> std::result::Result<(), DriverError> {
        conn.ping().await.map_err(failure)
    }

    async fn interrupt(
        &self,
        conn: &mut PgConnection,
        target: u64,
    ) -> std::result::Result<(), DriverError> {
        let pid = i32::try_from(target).map_err(|_| {
            DriverError::statement(LockError::unexpected(
                crate::BACKEND,
                format!("backend pid {target} out of range"),
            ))
        })?;
        sqlx::query("SELECT pg_cancel_backend($1)")
            .bind(pid)
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(failure)
    }
}

impl fmt::Debug for PgDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgDriver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
