//! The statements, and the one function that runs a command on a connection.
//!
//! Every statement here is valid on MariaDB 10.3+ and MySQL 5.7/8.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, Row};

use crate::config::MySqlConfig;
use crate::error::error_number;

/// The statements of one client, built once from its config.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Lock and fence in one statement. Parameters: key, key, wait seconds.
    ///
    /// `GET_LOCK` sits in the `WHERE` of an `INSERT … SELECT … FROM DUAL`, so it runs once, and the
    /// counter row is written only when the lock was granted. `LAST_INSERT_ID(expr)` makes the new
    /// token come back in the OK packet (no second round trip). The token is at least the server's
    /// clock in microseconds, so it keeps rising even if a crash lost the last counter writes
    /// (`innodb_flush_log_at_trx_commit` other than 1).
    acquire: String,
    /// Without fencing: `GET_LOCK` alone. Parameters: key, wait seconds.
    acquire_plain: Option<&'static str>,
    /// Parameter: key. Returns 1, 0 or NULL.
    release: &'static str,
    /// The fencing table.
    create: String,
}

const NOW_MICROS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

impl Sql {
    pub(crate) fn new(config: &MySqlConfig) -> Self {
        let table = config.quoted_table();
        Self {
            acquire: format!(
                "INSERT INTO {table} (name, token) \
                 SELECT ?, LAST_INSERT_ID({NOW_MICROS}) FROM DUAL WHERE GET_LOCK(?, ?) = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {NOW_MICROS}))"
            ),
            acquire_plain: (!config.fencing).then_some("SELECT GET_LOCK(?, ?)"),
            release: "SELECT RELEASE_LOCK(?)",
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 token BIGINT UNSIGNED NOT NULL\
                 ) ENGINE=InnoDB"
            ),
        }
    }

    /// The session settings every connection starts with.
    pub(crate) fn init(config: &MySqlConfig) -> String {
        let wait = config.session_timeout.as_secs().max(1);
        let row_wait = config.command_timeout.as_secs().max(1);
        format!(
            "SET SESSION wait_timeout = {wait}, innodb_lock_wait_timeout = {row_wait}, time_zone = '+00:00'"
        )
    }
}

/// One command on a connection.
#[derive(Clone, Debug)]
pub(crate) enum Cmd {
    /// `GET_LOCK(key, wait)` and, when granted, the fencing increment.
    Acquire {
        key: std::sync::Arc<str>,
        wait: Duration,
        create_table: bool,
    },
    /// `RELEASE_LOCK(key)`.
    Release { key: std::sync::Arc<str> },
    /// `COM_PING`.
    Ping,
    /// `KILL QUERY id`: interrupts another connection's statement.
    KillQuery(u64),
    /// Creates the fencing table if missing.
    CreateTable,
}

/// What a command returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `Some(token)`: granted; `None`: not granted within the wait (or interrupted).
    Acquired(Option<u64>),
    /// `RELEASE_LOCK`'s value: `Some(1)` released, `Some(0)` another connection's, `None` no such lock.
    Released(Option<i64>),
    /// Done.
    Done,
}

const ER_NO_SUCH_TABLE: u16 = 1146;

async fn acquire_once(
    conn: &mut MySqlConnection,
    sql: &Sql,
    key: &str,
    wait: Duration,
) -> sqlx::Result<sqlx::mysql::MySqlQueryResult> {
    sqlx::query(&sql.acquire)
        .bind(key)
        .bind(key)
        .bind(wait.as_secs_f64())
        .execute(conn)
        .await
}

/// Runs `cmd` on `conn`.
pub(crate) async fn exec(conn: &mut MySqlConnection, sql: &Sql, cmd: &Cmd) -> sqlx::Result<Reply> {
    match cmd {
        Cmd::Acquire {
            key,
            wait,
            create_table,
        } => {
            if let Some(plain) = sql.acquire_plain {
                let row = sqlx::query(plain)
                    .bind(&**key)
                    .bind(wait.as_secs_f64())
                    .fetch_one(&mut *conn)
                    .await?;
                let granted = row.try_get::<Option<i64>, _>(0)? == Some(1);
                return Ok(Reply::Acquired(granted.then_some(0)));
            }
            let done = match acquire_once(conn, sql, key, *wait).await {
                // The table is opened before `GET_LOCK` runs, so a missing table never leaves a
                // lock behind: create it and try again.
                Err(e) if *create_table && error_number(&e) == Some(ER_NO_SUCH_TABLE) => {
                    conn.execute(sqlx::raw_sql(&sql.create)).await?;
                    acquire_once(conn, sql, key, *wait).await?
                }
                other => other?,
            };
            Ok(Reply::Acquired(
                (done.rows_affected() > 0).then(|| done.last_insert_id()),
            ))
        }
        Cmd::Release { key } => {
            let row = sqlx::query(sql.release)
                .bind(&**key)
                .fetch_one(&mut *conn)
                .await?;
            Ok(Reply::Released(row.try_get::<Option<i64>, _>(0)?))
        }
        Cmd::Ping => {
            conn.ping().await?;
            Ok(Reply::Done)
        }
        Cmd::KillQuery(id) => {
            conn.execute(sqlx::raw_sql(&format!("KILL QUERY {id}")))
                .await?;
            Ok(Reply::Done)
        }
        Cmd::CreateTable => {
            conn.execute(sqlx::raw_sql(&sql.create)).await?;
            Ok(Reply::Done)
        }
    }
}
