//! Holder inspection: `IS_USED_LOCK`, the waiters performance_schema shows, the fence row.

use dlock_api::raw::SessionDriver;
use dlock_api::{FencingToken, Inspection, LockError, Result};
use sqlx::Row;
use sqlx::mysql::MySqlConnection;
use tokio::sync::Mutex;

use std::future::Future;
use std::pin::Pin;

use crate::driver::{COUNT_PERMITS, MySqlDriver};
use crate::error::{error_number, map_err, timed_out};
use crate::sql::Fence;

const ER_NO_SUCH_TABLE: u16 = 1146;

/// The holder's connection id and, where performance_schema instruments metadata locks, the
/// connections waiting in `GET_LOCK` for the key.
const HOLDER_AND_WAITERS: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED), \
     (SELECT CAST(COUNT(*) AS SIGNED) FROM performance_schema.metadata_locks \
      WHERE OBJECT_TYPE = 'USER LEVEL LOCK' AND LOCK_STATUS = 'PENDING' AND OBJECT_NAME = ?), \
     (SELECT CAST(ENABLED = 'YES' AS SIGNED) FROM performance_schema.setup_instruments \
      WHERE NAME = 'wait/lock/metadata/sql/mdl')";

const HOLDER: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)";

/// One connection kept for inspection (opened on first use), so `dlock status --watch` does not
/// connect every second. It is taken out while in use and put back only after a clean answer:
/// an inspection dropped or failed mid-statement closes it.
#[derive(Debug, Default)]
pub(crate) struct Inspector {
    conn: Mutex<Option<MySqlConnection>>,
}

/// What one question on the kept connection runs.
type Question<'c, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'c>>;

impl Inspector {
    /// What the server says about `key`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; a dropped call closes the connection it was using.
    pub(crate) async fn inspect(&self, driver: &MySqlDriver, key: &str) -> Result<Inspection> {
        // A sequence's tokens are not kept per key: the holder's is not known.
        let fenced = (driver.fence() == Fence::Row).then(|| driver.config.quoted_table());
        self.ask(driver, |conn| {
            let (key, fenced) = (key.to_owned(), fenced.clone());
            Box::pin(async move { read(conn, &key, fenced.as_deref()).await })
        })
        .await
    }

    /// The permits held now of every semaphore of the name whose semaphore key is `base`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; a dropped call closes the connection it was using.
    pub(crate) async fn count_permits(&self, driver: &MySqlDriver, base: &str) -> Result<u32> {
        self.ask(driver, |conn| {
            let base = base.to_owned();
            Box::pin(async move {
                let count: i64 = sqlx::query(COUNT_PERMITS)
                    .bind(base)
                    .fetch_one(conn)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(map_err)?;
                Ok(u32::try_from(count).unwrap_or(u32::MAX))
            })
        })
        .await
    }

    /// Runs `question` on the kept connection (opened on first use), within the command
    /// timeout.
    async fn ask<T>(
        &self,
        driver: &MySqlDriver,
        question: impl for<'c> Fn(&'c mut MySqlConnection) -> Question<'c, T>,
    ) -> Result<T> {
        let mut slot = self.conn.lock().await;
        let kept = slot.take();
        let reused = kept.is_some();
        let mut conn = match kept {
            Some(conn) => conn,
            None => driver.open().await?.0,
        };
        let within = driver.config.command_timeout;
        let answer = match tokio::time::timeout(within, question(&mut conn)).await {
            Err(_) => return Err(timed_out(within)),
            // A kept connection the server has closed since (a restart, a `KILL`) fails its next
            // statement at once: ask on a new one rather than fail one inspection after a
            // restart for a connection nobody uses any more.
            Ok(Err(LockError::Unavailable { .. })) if reused => {
                conn = driver.open().await?.0;
                tokio::time::timeout(within, question(&mut conn))
                    .await
                    .map_err(|_| timed_out(within))??
            }
            Ok(answer) => answer?,
        };
        *slot = Some(conn);
        Ok(answer)
    }
}

async fn read(conn: &mut MySqlConnection, key: &str, table: Option<&str>) -> Result<Inspection> {
    let (holder, waiters) = match sqlx::query(HOLDER_AND_WAITERS)
        .bind(key)
        .bind(key)
        .fetch_one(&mut *conn)
        .await
    {
        Ok(row) => {
            let holder: Option<i64> = row.try_get(0).map_err(map_err)?;
            let pending: Option<i64> = row.try_get(1).map_err(map_err)?;
            let instrumented: Option<i64> = row.try_get(2).map_err(map_err)?;
            let waiters = pending
                .filter(|_| instrumented == Some(1))
                .and_then(|n| usize::try_from(n).ok());
            (holder, waiters)
        }
        // No performance_schema access (privileges): holders only.
        Err(sqlx::Error::Database(_)) => {
            let row = sqlx::query(HOLDER)
                .bind(key)
                .fetch_one(&mut *conn)
                .await
                .map_err(map_err)?;
            (row.try_get(0).map_err(map_err)?, None)
        }
        Err(e) => return Err(map_err(e)),
    };
    let Some(holder) = holder else {
        return Ok(Inspection::free(waiters));
    };
    let token = match table {
        Some(table) => fence_token(conn, table, key).await?,
        None => None,
    };
    let held = Inspection::held(token).with_holder(format!("connection {holder}"));
    Ok(match waiters {
        Some(waiters) => held.with_waiters(waiters),
        None => held,
    })
}

/// The fence row of `key`: the token of its last grant, which is the holder's.
async fn fence_token(
    conn: &mut MySqlConnection,
    table: &str,
    key: &str,
) -> Result<Option<FencingToken>> {
    let sql = format!("SELECT token FROM {table} WHERE name = ?");
    match sqlx::query(&sql).bind(key).fetch_optional(&mut *conn).await {
        Ok(row) => Ok(row
            .map(|row| row.try_get::<u64, _>(0))
            .transpose()
            .map_err(map_err)?
            .map(FencingToken::new)),
        // Never acquired with fencing on this server: no token yet.
        Err(e) if error_number(&e) == Some(ER_NO_SUCH_TABLE) => Ok(None),
        Err(e) => Err(map_err(e)),
    }
}
