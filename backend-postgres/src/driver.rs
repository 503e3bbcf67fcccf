//! [`PgDriver`]: the statements the shared session pool runs on Postgres connections.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::permits_mismatch;
use dlock_api::raw::{ChangeBell, DriverError, PoolConfig, SessionDriver, TriedAll, Waited};
use dlock_api::{Leader, LockError, LockName, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::time::timeout;

use crate::config::PostgresConfig;
use crate::election::{LeaderSql, OWN_START_SETTING, UNDEFINED_TABLE, leader_from};
use crate::error::{
    LOCK_NOT_AVAILABLE, QUERY_CANCELED, is_connection_error, map_err, sqlstate, timed_out,
};
use crate::fence::Fence;
use crate::key::{RawKey, limit_key, slot_key};
use crate::listen::{Listener, leader_channel};
use crate::sql::{self, Sql};
use crate::tls;

mod claims;
mod derived;
mod room;
mod set;

use claims::int_key;
pub(crate) use claims::slot_keys;
use derived::DerivedKeys;
use dlock_api::raw::random_below;
use room::FirstInLine;

/// The most permits a semaphore has here. Each permit attempt carries every slot's key and
/// probes them in one statement, a refusal and `count_permits` look up as many keys in
/// `pg_locks`, and each permit holds three advisory locks on its session (the slot, and the
/// name's key and limit key shared) in the server's shared lock table, which is sized for
/// `max_locks_per_transaction` (64 by default) per connection: a few dozen permits keep all of
/// that small, and a name needing more concurrent holders than that is better served by a
/// counter the application shards.
pub(crate) const MAX_PERMITS: u32 = 64;

/// Session advisory locks for a [`SessionPool`](dlock_api::raw::SessionPool); tokens are drawn
/// in the same statement, and renewed by the [`Fence`] when outside its window.
pub(crate) struct PgDriver {
    pub(crate) config: PostgresConfig,
    sql: Sql,
    /// Where tokens come from; `None` with fencing off.
    fence: Option<Fence>,
    /// The leaders table's statements; `None` with fencing off (elections need terms).
    pub(crate) leaders: Option<LeaderSql>,
    /// Where observers hear leader changes and a semaphore's first waiter its releases.
    pub(crate) listener: Listener,
    /// This client's semaphore waiters first in line, for interrupts to reach.
    first_in_line: FirstInLine,
    /// The semaphores' and readers' keys derived so far.
    derived: DerivedKeys,
    /// How long a semaphore's or a reader's attempt waits for the name's gate, as
    /// `lock_timeout` reads it: the command timeout.
    gate_timeout: String,
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
    pub(crate) fn new(
        config: PostgresConfig,
        sql: Sql,
        fence: Option<Fence>,
        leaders: Option<LeaderSql>,
    ) -> Result<Self> {
        let connect = config.driver_options()?;
        let listener = Listener::new(connect.clone(), config.connect_timeout);
        let gate_ms = u64::try_from(config.command_timeout.as_millis()).unwrap_or(u64::MAX);
        Ok(Self {
            gate_timeout: format!("{}ms", gate_ms.max(1)),
            derived: DerivedKeys::default(),
            connect,
            config,
            sql,
            fence,
            leaders,
            listener,
            first_in_line: FirstInLine::default(),
        })
    }

    /// The leaders table's statements, or `Unsupported` with fencing off.
    fn leaders(&self) -> std::result::Result<&LeaderSql, DriverError> {
        self.leaders.as_ref().ok_or_else(|| {
            DriverError::statement(LockError::Unsupported {
                backend: crate::BACKEND,
                operation: "elections without fencing (a term is a fencing token)",
            })
        })
    }

    /// A statement on the leaders table failed: a missing table is a configuration to fix.
    fn leaders_failure(&self, error: sqlx::Error) -> DriverError {
        match (&self.leaders, sqlstate(&error).as_deref()) {
            (Some(leaders), Some(UNDEFINED_TABLE)) => {
                DriverError::statement(crate::config::config_error(format!(
                    "the leaders table {} does not exist: call PostgresLock::migrate() (or set create_fence=true)",
                    leaders.table()
                )))
            }
            _ => failure(error),
        }
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

    /// The gate and the readers' mark (the limit key of one) of the 64-bit key `k`.
    fn reader_keys(&self, k: i64) -> sql::Gated {
        self.derived.of(k, 1).gated()
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
    /// session; no `idle_session_timeout` (PG 14+) on a session that holds locks; the backend's
    /// start time kept for the leaders table's records (see `election.rs`).
    pub(crate) async fn prepare(&self, conn: &mut PgConnection) -> Result<u64> {
        let within = self.config.command_timeout;
        let c = &self.config;
        let row = timeout(
            within,
            sqlx::query(&format!(
                "SELECT pg_backend_pid(), set_config('synchronous_commit', 'on', false), \
                 set_config('statement_timeout', '0', false), \
                 set_config('idle_in_transaction_session_timeout', '0', false), \
                 set_config('client_min_messages', 'error', false), \
                 set_config('tcp_keepalives_idle', $1, false), \
                 set_config('tcp_keepalives_interval', $2, false), \
                 set_config('tcp_keepalives_count', $3, false), \
                 (SELECT set_config('idle_session_timeout', '0', false) \
                 WHERE current_setting('server_version_num')::int >= 140000), \
                 {OWN_START_SETTING}"
            ))
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
        name: &LockName,
        key: &RawKey,
    ) -> std::result::Result<Option<u64>, DriverError> {
        let row = self
            .sql
            .try_lock(*key)
            .fetch_one(&mut *conn)
            .await
            .map_err(failure)?;
        let drawn: Option<i64> = row.try_get(0).map_err(failure)?;
        match (drawn, key) {
            (Some(drawn), _) => self.settle(conn, drawn).await.map(Some),
            (None, RawKey::Int(k))
                if row.try_get::<Option<bool>, _>(1).map_err(failure)? == Some(true) =>
            {
                // Held in share mode only: by a semaphore's permits, whose limit `pg_locks`
                // tells (nothing there: gone meanwhile, busy when asked).
                match self.in_use(conn, *k).await? {
                    Some(in_use) if in_use != 1 => {
                        Err(DriverError::statement(permits_mismatch(name, 1, in_use)))
                    }
                    _ => Ok(None),
                }
            }
            (None, _) => Ok(None),
        }
    }

    async fn try_lock_all(
        &self,
        conn: &mut PgConnection,
        _names: &[LockName],
        keys: &[RawKey],
    ) -> std::result::Result<TriedAll, DriverError> {
        self.try_set(conn, keys).await
    }

    async fn try_permit(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        permits: u32,
    ) -> std::result::Result<Option<(u64, u32)>, DriverError> {
        self.try_permit_from(conn, name, key, permits, random_below(permits))
            .await
    }

    async fn wait_permit(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        permits: u32,
        wait: Duration,
    ) -> std::result::Result<Waited, DriverError> {
        self.wait_in_line(conn, (name, key), permits, wait).await
    }

    async fn unlock_permit(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
        permits: u32,
        slot: Option<u32>,
    ) -> std::result::Result<bool, DriverError> {
        let k = int_key(key)?;
        let keys = self.derived.of(k, permits);
        let slot_key = slot.map(|slot| {
            let at = usize::try_from(slot).ok();
            at.and_then(|at| keys.slots.get(at).copied())
                .unwrap_or_else(|| slot_key(k, slot))
        });
        let query = || match slot_key {
            Some(slot) => {
                sql::unlock_permit(slot, k, keys.limit, (keys.room, keys.channel.clone()))
            }
            None => sql::undo_permit(keys.slots.to_vec(), k, keys.limit),
        };
        unlock_retrying(conn, query).await
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
            Err(e) => wait_failed(e),
        }
    }

    async fn wait_lock_as_leader(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        wait: Duration,
        value: &[u8],
    ) -> std::result::Result<(Waited, bool), DriverError> {
        let (Some(leaders), Some(fence), RawKey::Int(k)) = (&self.leaders, &self.fence, key) else {
            return Ok((self.wait_lock(conn, key, wait).await?, false));
        };
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        let waiting = leaders.wait_leading((name.as_str(), *k), ms, value, fence.kept_below());
        match waiting.fetch_one(&mut *conn).await {
            Ok(row) => {
                let drawn: i64 = row.try_get(0).map_err(failure)?;
                let wrote: bool = row.try_get(1).map_err(failure)?;
                let token = self.settle(conn, drawn).await?;
                Ok((
                    Waited::Granted(token),
                    wrote && token == drawn.unsigned_abs(),
                ))
            }
            Err(e) if sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                Ok((Waited::NotGrantedUnsure, false))
            }
            Err(e) => Err(self.leaders_failure(e)),
        }
    }

    async fn unlock(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
    ) -> std::result::Result<bool, DriverError> {
        unlock_retrying(conn, || sql::unlock(*key)).await
    }

    async fn try_lock_shared(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
    ) -> std::result::Result<Option<u64>, DriverError> {
        let k = int_key(key)?;
        let row = match sql::try_read_query(&self.sql, k, self.reader_keys(k), &self.gate_timeout)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(row) => row,
            // The gate stayed taken for the whole timeout (the statement's only wait, and its
            // first lock: nothing was taken): busy.
            Err(e) if sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => return Ok(None),
            Err(e) => return Err(failure(e)),
        };
        self.read_granted(conn, name, k, &row).await
    }

    async fn wait_lock_shared(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        wait: Duration,
    ) -> std::result::Result<Waited, DriverError> {
        let k = int_key(key)?;
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        let permit_limits = (2..=MAX_PERMITS).map(|n| limit_key(k, n)).collect();
        match sql::wait_read_query(&self.sql, k, self.reader_keys(k), ms, permit_limits)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(row) => Ok(match self.read_granted(conn, name, k, &row).await? {
                Some(token) => Waited::Granted(token),
                None => Waited::NotGranted,
            }),
            // The timeout can also fire on the gate, after the share was granted.
            Err(e) => wait_failed(e),
        }
    }

    async fn unlock_shared(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
    ) -> std::result::Result<bool, DriverError> {
        let k = int_key(key)?;
        let mark = self.reader_keys(k).limit;
        unlock_retrying(conn, || sql::unlock_read(k, mark)).await
    }

    async fn proclaim(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        term: u64,
        value: &[u8],
    ) -> std::result::Result<bool, DriverError> {
        let leaders = self.leaders()?;
        let term = i64::try_from(term).map_err(|_| {
            DriverError::statement(LockError::unexpected(
                crate::BACKEND,
                format!("term {term} out of range"),
            ))
        })?;
        let written = leaders
            .proclaim(name.as_str(), int_key(key)?, term, value)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.leaders_failure(e))?;
        Ok(written.is_some())
    }

    async fn leader(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
    ) -> std::result::Result<Option<Leader>, DriverError> {
        let leaders = self.leaders()?;
        let row = match leaders
            .leader(name.as_str(), int_key(key)?)
            .fetch_optional(&mut *conn)
            .await
        {
            Ok(row) => row,
            // Nobody has proclaimed yet where nothing creates the table.
            Err(e) if sqlstate(&e).as_deref() == Some(UNDEFINED_TABLE) => None,
            Err(e) => return Err(failure(e)),
        };
        row.map(|row| {
            let term: i64 = row.try_get(0).map_err(failure)?;
            let value: Vec<u8> = row.try_get(1).map_err(failure)?;
            Ok(leader_from(term, value))
        })
        .transpose()
    }

    async fn unlock_leader(
        &self,
        conn: &mut PgConnection,
        key: &RawKey,
    ) -> std::result::Result<bool, DriverError> {
        let leaders = self.leaders()?;
        let k = int_key(key)?;
        // The unlock first, alone, as a lock's release: the successor is granted at once, and
        // its write finds the row unlocked (a delete first, in the unlock's transaction, would
        // make that write wait for its commit). Meanwhile the row counts for nobody, as its
        // writer no longer holds the key; it goes before this connection can take the key
        // again, or the row would count once more.
        let unlocked = unlock_retrying(conn, || sql::unlock(RawKey::Int(k))).await?;
        match leaders.forget(k).execute(&mut *conn).await {
            Ok(_) => Ok(unlocked),
            // Closing the connection is what keeps its row from counting again.
            Err(e) => Err(DriverError::broken(map_err(e))),
        }
    }

    async fn leader_bell(&self, key: &RawKey) -> Result<Option<ChangeBell>> {
        match (&self.leaders, key) {
            (Some(_), RawKey::Int(k)) => self.listener.bell(leader_channel(*k)).await.map(Some),
            _ => Ok(None),
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
        // A semaphore's first waiter waits between statements, where only this reaches it.
        self.first_in_line.interrupt(target);
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

/// How a server-side wait that failed with `error` ended. Seen under load: `lock_timeout` fires
/// as the lock is granted, and the error is raised with the lock already in the session's lock
/// table (a session lock outlives the failed statement): not granted, but to be undone.
fn wait_failed(error: sqlx::Error) -> std::result::Result<Waited, DriverError> {
    if sqlstate(&error).as_deref() == Some(LOCK_NOT_AVAILABLE) {
        Ok(Waited::NotGrantedUnsure)
    } else {
        Err(failure(error))
    }
}

/// Runs an unlock statement whose first column says whether the lock was held. A cancel
/// request is a signal the server may act on late: one that lands on this statement (ours, for
/// a wait that just ended) is retried.
async fn unlock_retrying<'q>(
    conn: &mut PgConnection,
    query: impl Fn() -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> std::result::Result<bool, DriverError> {
    let mut attempts: u32 = 0;
    loop {
        attempts = attempts.saturating_add(1);
        match query().fetch_one(&mut *conn).await {
            Ok(row) => return row.try_get::<bool, _>(0).map_err(failure),
            Err(e) if attempts < 3 && sqlstate(&e).as_deref() == Some(QUERY_CANCELED) => {}
            Err(e) => return Err(failure(e)),
        }
    }
}

impl fmt::Debug for PgDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgDriver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
