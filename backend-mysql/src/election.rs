//! Elections: the leaders table next to the fencing table, and its statements.
//!
//! One row per election key: the term (the leader's fencing token), the value, and the
//! `CONNECTION_ID()` that wrote it. A row counts only while `IS_USED_LOCK(key)` names that
//! connection at the moment of the read: a leader whose connection closed leaves a row that
//! reads as vacant, with nothing to clean up.

use dlock_api::{FencingToken, Leader, MAX_LEADER_VALUE};
use sqlx::mysql::MySqlConnection;
use sqlx::{Executor, Row};

use crate::config::MySqlConfig;
use crate::error::error_number;

/// MySQL's `ER_NO_SUCH_TABLE`.
const ER_NO_SUCH_TABLE: u16 = 1146;

/// The statements of one client's leaders table (`table` + `_leaders`).
#[derive(Debug)]
pub(crate) struct LeaderSql {
    create: String,
    proclaim: String,
    /// A waiting candidate's lock, token and record in one statement (MariaDB's sequence).
    grant: String,
    leader: String,
    forget: String,
    /// Create the table when a write finds it missing.
    create_table: bool,
}

impl LeaderSql {
    pub(crate) fn new(config: &MySqlConfig) -> Self {
        let table = config.quoted_leaders();
        Self {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 term BIGINT UNSIGNED NOT NULL, \
                 value VARBINARY({MAX_LEADER_VALUE}) NOT NULL, \
                 holder BIGINT UNSIGNED NOT NULL\
                 ) ENGINE=InnoDB"
            ),
            // Written only while this connection holds the key and no row of a higher term is
            // there. Parameters: key, term, value, key, key, term.
            proclaim: format!(
                "INSERT INTO {table} (name, term, value, holder) \
                 SELECT ?, ?, ?, CONNECTION_ID() FROM DUAL \
                 WHERE IS_USED_LOCK(?) = CONNECTION_ID() \
                 AND NOT EXISTS (SELECT 1 FROM {table} AS newer WHERE newer.name = ? AND newer.term > ?) \
                 ON DUPLICATE KEY UPDATE value = VALUES(value), holder = VALUES(holder), \
                 term = VALUES(term)"
            ),
            // `GET_LOCK` sits in the `WHERE` of an `INSERT … SELECT … FROM DUAL` (as the counter
            // row's acquire, `sql.rs`): the select list, and so `NEXTVAL`, is evaluated only once
            // granted, so terms rise in grant order, and `LAST_INSERT_ID(expr)` brings the token
            // back in the OK packet. A token drawn after the grant is above every term written
            // before, so, unlike a proclaim, no newer row can be there. Parameters: key, value,
            // key, wait seconds.
            grant: format!(
                "INSERT INTO {table} (name, term, value, holder) \
                 SELECT ?, LAST_INSERT_ID(NEXTVAL({sequence})), ?, CONNECTION_ID() FROM DUAL \
                 WHERE GET_LOCK(?, ?) = 1 \
                 ON DUPLICATE KEY UPDATE value = VALUES(value), holder = VALUES(holder), \
                 term = VALUES(term)",
                sequence = config.quoted_sequence()
            ),
            // Parameters: key, key.
            leader: format!(
                "SELECT term, value FROM {table} WHERE name = ? AND holder = IS_USED_LOCK(?)"
            ),
            // Only the row this connection wrote: a successor's stays. Parameter: key.
            forget: format!("DELETE FROM {table} WHERE name = ? AND holder = CONNECTION_ID()"),
            create_table: config.create_table,
        }
    }

    /// Creates the table if it is missing.
    pub(crate) async fn create(&self, conn: &mut MySqlConnection) -> sqlx::Result<()> {
        conn.execute(sqlx::raw_sql(&self.create)).await.map(drop)
    }

    /// The owner-checked write of `key`'s record: whether it was written. Creates a missing
    /// table first when `create_table` allows.
    pub(crate) async fn proclaim(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        term: u64,
        value: &[u8],
    ) -> sqlx::Result<bool> {
        let done = match self.write(&mut *conn, key, term, value).await {
            Err(e) if self.create_table && error_number(&e) == Some(ER_NO_SUCH_TABLE) => {
                self.create(&mut *conn).await?;
                self.write(&mut *conn, key, term, value).await?
            }
            other => other?,
        };
        // With `CLIENT_FOUND_ROWS` (sqlx sets it) a row rewritten with its own values counts
        // too: nothing is affected only when a check refused the write.
        Ok(done.rows_affected() > 0)
    }

    async fn write(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        term: u64,
        value: &[u8],
    ) -> sqlx::Result<sqlx::mysql::MySqlQueryResult> {
        sqlx::query(&self.proclaim)
            .bind(key)
            .bind(term)
            .bind(value)
            .bind(key)
            .bind(key)
            .bind(term)
            .execute(conn)
            .await
    }

    /// Waits up to `wait` for `key` and, once granted, draws its token from the fencing sequence
    /// `NEXTVAL` and writes `value` as the record under it, in one statement: the token, or
    /// `None` if the wait ran out (or was interrupted). Creates a missing table first when
    /// `create_table` allows (the table is opened before `GET_LOCK` runs, so a missing one
    /// never leaves a lock behind).
    pub(crate) async fn wait_leading(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        wait: std::time::Duration,
        value: &[u8],
    ) -> sqlx::Result<Option<u64>> {
        let done = match self.grant_once(&mut *conn, key, wait, value).await {
            Err(e) if self.create_table && error_number(&e) == Some(ER_NO_SUCH_TABLE) => {
                self.create(&mut *conn).await?;
                self.grant_once(&mut *conn, key, wait, value).await?
            }
            other => other?,
        };
        Ok((done.rows_affected() > 0).then(|| done.last_insert_id()))
    }

    async fn grant_once(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        wait: std::time::Duration,
        value: &[u8],
    ) -> sqlx::Result<sqlx::mysql::MySqlQueryResult> {
        sqlx::query(&self.grant)
            .bind(key)
            .bind(value)
            .bind(key)
            .bind(wait.as_secs_f64())
            .execute(conn)
            .await
    }

    /// `key`'s record, if its writer holds the key now; a missing table has none.
    pub(crate) async fn leader(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
    ) -> sqlx::Result<Option<Leader>> {
        let row = match sqlx::query(&self.leader)
            .bind(key)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
        {
            Ok(row) => row,
            Err(e) if error_number(&e) == Some(ER_NO_SUCH_TABLE) => None,
            Err(e) => return Err(e),
        };
        row.map(|row| {
            let term: u64 = row.try_get(0)?;
            let value: Vec<u8> = row.try_get(1)?;
            Ok(Leader::new(FencingToken::new(term), value))
        })
        .transpose()
    }

    /// Deletes the record this connection wrote for `key`, before its lock is released; a
    /// missing table has none.
    pub(crate) async fn forget(&self, conn: &mut MySqlConnection, key: &str) -> sqlx::Result<()> {
        match sqlx::query(&self.forget)
            .bind(key)
            .execute(&mut *conn)
            .await
        {
            Err(e) if error_number(&e) == Some(ER_NO_SUCH_TABLE) => Ok(()),
            other => other.map(drop),
        }
    }
}
