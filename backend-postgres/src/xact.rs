//! Locks inside the caller's own transaction: transaction-scoped advisory locks and row locks.
//!
//! Both are released by the transaction's end (commit or rollback) and by nothing else, so the
//! commit-before-unlock rule holds by construction: the lock cannot be released before
//! the writes it protects are committed. Neither needs a fencing token: a holder's writes and
//! its lock live and die with the same transaction, so a stale holder's writes can never commit
//! after a new holder's.

use std::fmt;
use std::time::Duration;

use dlock_api::{LockError, Result};
use std::future::Future;
use std::pin::Pin;

use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{Executor, Row, Transaction};
use tokio::time::Instant;

use crate::config::quote_qualified;
use crate::error::{LOCK_NOT_AVAILABLE, map_err, sqlstate};
use crate::key::{AdvisoryKey, RawKey};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

const SAVEPOINT: &str = "dlock_lock_wait";

/// Takes the transaction-scoped advisory lock `key` inside `tx` if it is free, without waiting
/// (`pg_try_advisory_xact_lock`). Returns whether it was taken; it is released when `tx`
/// commits or rolls back.
///
/// # Errors
/// [`LockError::Unavailable`] / [`LockError::Backend`] when the statement fails (the
/// transaction is then aborted, as with any failed statement).
///
/// # Cancel safety
/// Cancel safe in that nothing outlives `tx`: if dropped midway, the lock may or may not be
/// held, and ends with the transaction either way.
///
/// # Examples
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> dlock_api::Result<()> {
/// use dlock_postgres::{AdvisoryKey, try_xact_lock};
/// let mut tx = pool.begin().await.map_err(|e| dlock_api::LockError::backend("postgres", e))?;
/// if try_xact_lock(&mut tx, AdvisoryKey::Int(42)).await? {
///     // … read, change; the commit releases the lock …
/// }
/// tx.commit().await.map_err(|e| dlock_api::LockError::backend("postgres", e))?;
/// # Ok(()) }
/// ```
pub async fn try_xact_lock(
    tx: &mut Transaction<'_, Postgres>,
    key: impl Into<AdvisoryKey>,
) -> Result<bool> {
    // Boxed so the future is `Send` for callers that spawn it (sqlx's executor lifetimes
    // otherwise trip rustc's higher-ranked `Send` check).
    let key = key.into();
    let conn: &mut PgConnection = tx;
    let fut: BoxFuture<'_, Result<bool>> = Box::pin(try_xact_lock_on(conn, key));
    fut.await
}

async fn try_xact_lock_on(tx: &mut PgConnection, key: AdvisoryKey) -> Result<bool> {
    let query = match key.raw() {
        RawKey::Int(k) => sqlx::query("SELECT pg_try_advisory_xact_lock($1)").bind(k),
        RawKey::Pair(a, b) => sqlx::query("SELECT pg_try_advisory_xact_lock($1, $2)")
            .bind(a)
            .bind(b),
    };
    let row = query.fetch_one(&mut *tx).await.map_err(map_err)?;
    row.try_get::<bool, _>(0).map_err(map_err)
}

/// Takes the transaction-scoped advisory lock `key` inside `tx`, waiting on the server
/// (`pg_advisory_xact_lock`) up to `wait` (`None`: no limit but the server's own
/// `statement_timeout`). The lock is released when `tx` commits or rolls back: commit your
/// writes, and the commit itself hands the lock to the next waiter.
///
/// A bounded wait runs inside a savepoint with `lock_timeout`, so a timeout leaves `tx` usable
/// (and its earlier `lock_timeout` restored).
///
/// # Errors
/// - [`LockError::Timeout`] when `wait` passed (the transaction stays usable);
/// - [`LockError::Unavailable`] / [`LockError::Backend`] when a statement fails (a deadlock,
///   say: the transaction is then aborted).
///
/// # Cancel safety
/// As [`try_xact_lock`]: nothing outlives the transaction. A dropped bounded wait may leave the
/// savepoint open; roll the transaction back.
///
/// # Examples
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::{LockError, LockName};
/// use dlock_postgres::xact_lock;
/// let sql_err = |e| LockError::backend("postgres", e);
/// let mut tx = pool.begin().await.map_err(sql_err)?;
/// xact_lock(&mut tx, LockName::new("coupon:42")?, Some(Duration::from_secs(5))).await?;
/// // … SELECT stock …; UPDATE … SET stock = stock - 1 …
/// tx.commit().await.map_err(sql_err)?; // releases the lock, after the write is durable
/// # Ok(()) }
/// ```
pub async fn xact_lock(
    tx: &mut Transaction<'_, Postgres>,
    key: impl Into<AdvisoryKey>,
    wait: Option<Duration>,
) -> Result<()> {
    let key = key.into();
    let conn: &mut PgConnection = tx;
    let fut: BoxFuture<'_, Result<()>> = Box::pin(xact_lock_on(conn, key, wait));
    fut.await
}

async fn xact_lock_on(
    tx: &mut PgConnection,
    key: AdvisoryKey,
    wait: Option<Duration>,
) -> Result<()> {
    let query = match key.raw() {
        RawKey::Int(k) => sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(k),
        RawKey::Pair(a, b) => sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(a)
            .bind(b),
    };
    let Some(wait) = wait else {
        query.execute(&mut *tx).await.map_err(map_err)?;
        return Ok(());
    };
    let started = Instant::now();
    let prev = begin_bounded(tx, wait).await?;
    match query.execute(&mut *tx).await {
        Ok(_) => end_bounded(tx, &prev).await,
        Err(e) => {
            let busy = sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE);
            abort_bounded(tx).await?;
            if busy {
                Err(LockError::Timeout {
                    name: key.lock_name().to_string(),
                    waited: started.elapsed(),
                })
            } else {
                Err(map_err(e))
            }
        }
    }
}

/// `SAVEPOINT; SHOW lock_timeout; SET LOCAL lock_timeout`: one round trip; returns the old value.
async fn begin_bounded(tx: &mut PgConnection, wait: Duration) -> Result<String> {
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    let batch =
        format!("SAVEPOINT {SAVEPOINT}; SHOW lock_timeout; SET LOCAL lock_timeout = '{ms}ms'");
    let rows = tx.fetch_all(batch.as_str()).await.map_err(map_err)?;
    let prev = rows
        .first()
        .map(|r| r.try_get::<String, _>(0))
        .transpose()
        .map_err(map_err)?
        .unwrap_or_else(|| "0".to_owned());
    Ok(prev)
}

/// Restores `lock_timeout` and releases the savepoint (keeping the lock).
async fn end_bounded(tx: &mut PgConnection, prev: &str) -> Result<()> {
    let batch = format!(
        "SET LOCAL lock_timeout = '{}'; RELEASE SAVEPOINT {SAVEPOINT}",
        prev.replace('\'', "''")
    );
    tx.execute(batch.as_str()).await.map_err(map_err)?;
    Ok(())
}

/// Rolls back to the savepoint (which also restores `lock_timeout`) and releases it.
async fn abort_bounded(tx: &mut PgConnection) -> Result<()> {
    let batch = format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}");
    tx.execute(batch.as_str()).await.map_err(map_err)?;
    Ok(())
}

/// How a [`RowLock`] waits for a row another transaction has locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowWait {
    /// `FOR UPDATE NOWAIT`: a locked row is [`RowLockOutcome::Busy`] at once.
    NoWait,
    /// `FOR UPDATE SKIP LOCKED`: a locked row is skipped and reported
    /// [`RowLockOutcome::Busy`] (one extra unlocking read tells busy from missing).
    SkipLocked,
    /// `FOR UPDATE` under `lock_timeout`: wait up to this long, then [`LockError::Timeout`].
    Timeout(Duration),
    /// Plain `FOR UPDATE`: wait without limit (but the server's `statement_timeout` and its
    /// deadlock detector).
    Forever,
}

/// What [`RowLock::lock`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowLockOutcome {
    /// The row is locked by your transaction until it ends.
    Locked,
    /// Another transaction holds the row ([`RowWait::NoWait`] / [`RowWait::SkipLocked`]).
    Busy,
    /// No row has that key.
    Missing,
}

/// The key value of the row to lock: bound as `bigint` or `text`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowKey {
    /// An integer key column (`smallint`, `integer`, `bigint`).
    Int(i64),
    /// A text key column (`text`, `varchar`).
    Text(String),
}

impl From<i64> for RowKey {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<i32> for RowKey {
    fn from(v: i32) -> Self {
        Self::Int(v.into())
    }
}

impl From<&str> for RowKey {
    fn from(v: &str) -> Self {
        Self::Text(v.to_owned())
    }
}

impl From<String> for RowKey {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}

impl fmt::Display for RowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Text(v) => write!(f, "{v}"),
        }
    }
}

/// A row lock (`SELECT … FOR UPDATE`) taken inside the caller's transaction: the
/// pessimistic lock, with `NOWAIT`, `SKIP LOCKED` or a bounded wait, and Postgres' lock errors
/// mapped to [`LockError`].
///
/// Created once per table with [`RowLock::new`]; [`lock`](Self::lock) locks one row by key in
/// your transaction, which holds it until commit or rollback. Read and change the row with your
/// own queries afterwards.
///
/// `NOWAIT` and bounded waits run inside a savepoint, so `Busy` and `Timeout` leave your
/// transaction usable.
///
/// # Examples
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> dlock_api::Result<()> {
/// use std::time::Duration;
/// use dlock_api::LockError;
/// use dlock_postgres::{RowLock, RowLockOutcome, RowWait};
/// let sql_err = |e| LockError::backend("postgres", e);
/// let coupons = RowLock::new("coupon")?.with_wait(RowWait::Timeout(Duration::from_secs(3)));
/// let mut tx = pool.begin().await.map_err(sql_err)?;
/// if coupons.lock(&mut tx, 42).await? == RowLockOutcome::Locked {
///     sqlx::query("UPDATE coupon SET stock = stock - 1 WHERE id = 42")
///         .execute(&mut *tx).await.map_err(sql_err)?;
/// }
/// tx.commit().await.map_err(sql_err)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RowLock {
    table: String,
    column: String,
    wait: RowWait,
    lock_sql: String,
    exists_sql: String,
}

impl RowLock {
    /// Row locks on `table` (`name` or `schema.name`), keyed by column `id`, waiting without
    /// limit (see [`with_wait`](Self::with_wait)).
    ///
    /// # Errors
    /// [`LockError::Config`] if `table` is not a plain (optionally schema-qualified) identifier.
    pub fn new(table: &str) -> Result<Self> {
        let mut lock = Self {
            table: quote_qualified(table)?,
            column: "\"id\"".to_owned(),
            wait: RowWait::Forever,
            lock_sql: String::new(),
            exists_sql: String::new(),
        };
        lock.build();
        Ok(lock)
    }

    /// Keys rows by `column` instead of `id`.
    ///
    /// # Errors
    /// [`LockError::Config`] if `column` is not a plain identifier.
    pub fn with_key_column(mut self, column: &str) -> Result<Self> {
        if column.contains('.') {
            return Err(crate::config::config_error(format!(
                "`{column}` is not a column name"
            )));
        }
        self.column = quote_qualified(column)?;
        self.build();
        Ok(self)
    }

    /// How to wait for a row another transaction holds.
    pub fn with_wait(mut self, wait: RowWait) -> Self {
        self.wait = wait;
        self.build();
        self
    }

    fn build(&mut self) {
        let clause = match self.wait {
            RowWait::NoWait => " NOWAIT",
            RowWait::SkipLocked => " SKIP LOCKED",
            RowWait::Timeout(_) | RowWait::Forever => "",
        };
        self.lock_sql = format!(
            "SELECT 1 FROM {} WHERE {} = $1 FOR UPDATE{clause}",
            self.table, self.column
        );
        self.exists_sql = format!("SELECT 1 FROM {} WHERE {} = $1", self.table, self.column);
    }

    fn query<'q>(
        sql: &'q str,
        key: &RowKey,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        match key {
            RowKey::Int(v) => sqlx::query(sql).bind(*v),
            RowKey::Text(v) => sqlx::query(sql).bind(v.clone()),
        }
    }

    /// Locks the row whose key column equals `key`, in `tx`, until `tx` ends.
    ///
    /// # Errors
    /// - [`LockError::Timeout`] when a [`RowWait::Timeout`] passed (the transaction stays
    ///   usable);
    /// - [`LockError::Backend`] for SQL errors (unknown table or column, a deadlock: the
    ///   transaction is then aborted unless the wait ran in a savepoint);
    /// - [`LockError::Unavailable`] when the connection fails.
    ///
    /// # Cancel safety
    /// Nothing outlives the transaction: if dropped midway, the row may or may not be locked,
    /// and is released when `tx` ends. A dropped bounded wait may leave the savepoint open;
    /// roll the transaction back.
    pub async fn lock(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        key: impl Into<RowKey>,
    ) -> Result<RowLockOutcome> {
        let key = key.into();
        let conn: &mut PgConnection = tx;
        let fut: BoxFuture<'_, Result<RowLockOutcome>> = Box::pin(self.lock_on(conn, key));
        fut.await
    }

    async fn lock_on(&self, tx: &mut PgConnection, key: RowKey) -> Result<RowLockOutcome> {
        let started = Instant::now();
        let prev = match self.wait {
            RowWait::NoWait => {
                tx.execute(format!("SAVEPOINT {SAVEPOINT}").as_str())
                    .await
                    .map_err(map_err)?;
                Some(None)
            }
            RowWait::Timeout(wait) => Some(Some(begin_bounded(tx, wait).await?)),
            RowWait::SkipLocked | RowWait::Forever => None,
        };
        let found = Self::query(&self.lock_sql, &key)
            .fetch_optional(&mut *tx)
            .await;
        match (found, prev) {
            (Ok(row), prev) => {
                if let Some(prev) = prev {
                    // A bounded wait restores the old lock_timeout; NOWAIT changed nothing.
                    match prev {
                        Some(prev) => end_bounded(tx, &prev).await?,
                        None => release_savepoint(tx).await?,
                    }
                }
                if row.is_some() {
                    return Ok(RowLockOutcome::Locked);
                }
                if self.wait != RowWait::SkipLocked {
                    return Ok(RowLockOutcome::Missing);
                }
                let exists = Self::query(&self.exists_sql, &key)
                    .fetch_optional(&mut *tx)
                    .await
                    .map_err(map_err)?;
                Ok(if exists.is_some() {
                    RowLockOutcome::Busy
                } else {
                    RowLockOutcome::Missing
                })
            }
            (Err(e), Some(_)) => {
                let busy = sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE);
                abort_bounded(tx).await?;
                match (busy, self.wait) {
                    (true, RowWait::NoWait) => Ok(RowLockOutcome::Busy),
                    (true, _) => Err(LockError::Timeout {
                        name: format!("{}[{}={key}]", self.table, self.column),
                        waited: started.elapsed(),
                    }),
                    _ => Err(map_err(e)),
                }
            }
            (Err(e), None) => Err(map_err(e)),
        }
    }
}

async fn release_savepoint(tx: &mut PgConnection) -> Result<()> {
    tx.execute(format!("RELEASE SAVEPOINT {SAVEPOINT}").as_str())
        .await
        .map_err(map_err)?;
    Ok(())
}
