//! Holder inspection: the advisory key's rows in `pg_locks`.

use dlock_api::{Inspection, LockError, Result};
use sqlx::Row;
use sqlx::postgres::{PgConnection, PgRow};
use tokio::sync::Mutex;

use crate::config::PostgresConfig;
use crate::driver::open_connection;
use crate::error::{map_err, timed_out};
use crate::key::AdvisoryKey;

/// A granted row's backend pid, the number of rows waiting, and of those granted and waiting
/// in shared mode (readers), for one advisory key in this database (advisory locks of other
/// databases are other locks).
const HOLDER_AND_WAITERS: &str = "SELECT \
     min(pid) FILTER (WHERE granted), \
     count(*) FILTER (WHERE NOT granted), \
     count(*) FILTER (WHERE granted AND mode = 'ShareLock'), \
     count(*) FILTER (WHERE NOT granted AND mode = 'ShareLock') \
     FROM pg_locks WHERE locktype = 'advisory' \
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = $3";

/// One connection kept for inspection (opened on first use), so `dlock status --watch` does not
/// connect every second. It is taken out while in use and put back only after a clean answer:
/// an inspection dropped or failed mid-statement closes it.
#[derive(Debug, Default)]
pub(crate) struct Inspector {
    conn: Mutex<Option<PgConnection>>,
}

impl Inspector {
    /// What `pg_locks` says about `key`.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads; a dropped call closes the connection it was using.
    pub(crate) async fn inspect(
        &self,
        config: &PostgresConfig,
        key: &AdvisoryKey,
    ) -> Result<Inspection> {
        let (classid, objid, objsubid) = key.pg_locks_ids();
        let row = self
            .fetch(config, || {
                sqlx::query(HOLDER_AND_WAITERS)
                    .bind(i64::from(classid))
                    .bind(i64::from(objid))
                    .bind(objsubid)
            })
            .await?;
        let holder: Option<i32> = row.try_get(0).map_err(map_err)?;
        let count = |column: usize| -> Result<usize> {
            let counted: i64 = row.try_get(column).map_err(map_err)?;
            Ok(usize::try_from(counted).unwrap_or(0))
        };
        let (waiters, readers, waiting_readers) = (count(1)?, count(2)?, count(3)?);
        // The fence sequence is shared by every name: the holder's token is not on the server.
        let inspection = match holder {
            Some(pid) => Inspection::held(None)
                .with_waiters(waiters)
                .with_holder(format!("pid {pid}")),
            None => Inspection::free(Some(waiters)),
        };
        Ok(inspection.with_readers(readers, waiting_readers))
    }

    /// How many permits of the name of key `key` are held now, as `pg_locks` says: its slots
    /// `slots` held, or 1 for a lock.
    ///
    /// # Cancel safety
    /// As [`inspect`](Self::inspect).
    pub(crate) async fn count_held(
        &self,
        config: &PostgresConfig,
        slots: Vec<i64>,
        key: i64,
    ) -> Result<u32> {
        let row = self
            .fetch(config, || crate::sql::count_held(slots.clone(), key))
            .await?;
        let held: i64 = row.try_get(0).map_err(map_err)?;
        Ok(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// Runs `query` on the kept connection (opened if need be), within the command timeout. A
    /// kept connection the server has closed since (a restart, a terminated backend) fails its
    /// next statement at once: the query then runs on a new connection, so one inspection
    /// after a restart does not fail for a connection nobody uses any more.
    async fn fetch<'q>(
        &self,
        config: &PostgresConfig,
        query: impl Fn() -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<PgRow> {
        let mut slot = self.conn.lock().await;
        let within = config.command_timeout;
        let kept = slot.take();
        let reused = kept.is_some();
        let mut conn = match kept {
            Some(conn) => conn,
            None => open_connection(config).await?,
        };
        let row = match tokio::time::timeout(within, query().fetch_one(&mut conn)).await {
            Err(_) => return Err(timed_out(within)),
            Ok(Ok(row)) => row,
            Ok(Err(e)) => match map_err(e) {
                LockError::Unavailable { .. } if reused => {
                    conn = open_connection(config).await?;
                    tokio::time::timeout(within, query().fetch_one(&mut conn))
                        .await
                        .map_err(|_| timed_out(within))?
                        .map_err(map_err)?
                }
                e => return Err(e),
            },
        };
        *slot = Some(conn);
        Ok(row)
    }
}
