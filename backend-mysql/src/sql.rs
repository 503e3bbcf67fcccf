//! The statements, and the one function that runs a command on a connection.
//!
//! Every statement here is valid on MariaDB 10.3+ and MySQL 5.7/8.

use std::time::Duration;

use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, Row};

use crate::config::MySqlConfig;
use crate::error::error_number;

/// Where this client's fencing tokens come from, decided by the server it meets first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Fence {
    /// `fencing=false`: plain `GET_LOCK`, every token 0.
    Off,
    /// MySQL: a counter row per key, written by the acquire's own statement.
    Row,
    /// MariaDB 10.3+: `NEXTVAL` of one sequence, taken in the acquire's statement after the grant.
    Sequence,
}

impl Fence {
    /// The token source for a server whose `VERSION()` is `version`; `table` asks for the
    /// counter table whatever the server.
    pub(crate) fn for_server(fencing: bool, table: bool, version: &str) -> Self {
        if !fencing {
            return Self::Off;
        }
        if table {
            return Self::Row;
        }
        if mariadb_since(version, (10, 3, 0)) {
            Self::Sequence
        } else {
            Self::Row
        }
    }
}

/// Whether `version` (`VERSION()`) is MariaDB's, at `since` or later.
fn mariadb_since(version: &str, since: (u32, u32, u32)) -> bool {
    let mut numbers = version.split(['.', '-']).map(|n| n.parse::<u32>().ok());
    let mut next = || numbers.next().flatten();
    let (major, minor, patch) = (next(), next(), next());
    version.contains("MariaDB")
        && matches!((major, minor), (Some(_), Some(_)))
        && (major.unwrap_or(0), minor.unwrap_or(0), patch.unwrap_or(0)) >= since
}

/// Whether `GET_LOCK` on the server of `version` waits for fractions of a second: MariaDB's
/// since 10.1.2 does; MySQL's takes the timeout as a whole number of seconds (`val_int`), so a
/// wait of 5 ms is no wait at all there.
pub(crate) fn waits_in_fractions(version: &str) -> bool {
    mariadb_since(version, (10, 1, 2))
}

/// The statements of one client, built once from its config.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Lock and fence in one statement (MySQL). Parameters: key, key, wait seconds.
    ///
    /// `GET_LOCK` sits in the `WHERE` of an `INSERT … SELECT … FROM DUAL`, so it runs once, and the
    /// counter row is written only when the lock was granted. `LAST_INSERT_ID(expr)` makes the new
    /// token come back in the OK packet (no second round trip). The token is at least the server's
    /// clock in microseconds, so it keeps rising even if a crash lost the last counter writes
    /// (`innodb_flush_log_at_trx_commit` other than 1).
    acquire: String,
    /// Lock and fence in one statement (MariaDB). Parameters: key, wait seconds.
    ///
    /// `IF` evaluates `GET_LOCK` first and `NEXTVAL` only when it granted, so each token is taken
    /// after its grant and before its holder can release: tokens rise in grant order. A sequence
    /// keeps its values in memory and writes its table once per `CACHE` values, so there is no
    /// write transaction (and, with `innodb_flush_log_at_trx_commit=1`, no log flush) per acquire.
    acquire_sequence: String,
    /// The fencing sequence, quoted.
    sequence: String,
    /// Without fencing: `GET_LOCK` alone. Parameters: key, wait seconds.
    acquire_plain: &'static str,
    /// Parameter: key. Returns 1, 0 or NULL.
    release: &'static str,
    /// The fencing table.
    create: String,
    /// The next token of a key's counter row, alone (a permit's, after its slot's grant).
    /// Parameter: the key.
    next_token: String,
    /// Deletes up to [`SWEEP_ROWS`] counter rows whose token is older than the server's clock by
    /// more than [`FENCE_RETENTION`]. Parameter: that retention in µs.
    sweep: String,
}

/// How long a counter row outlives the token it holds. Every token is at least the server's
/// clock in µs when it was taken, so once the clock has passed a row's token by this much, a
/// fresh row for the name (the clock again) still gives a higher token: the row can go, and a
/// name used once leaves nothing behind for good. Far beyond any burst that pushes a name's
/// tokens past the clock (one per µs), and any step of the server's clock a lock can live with.
pub(crate) const FENCE_RETENTION: Duration = Duration::from_secs(600);

/// Rows one sweep deletes at most, so that it locks few rows, briefly.
pub(crate) const SWEEP_ROWS: u32 = 1000;

pub(crate) const NOW_MICROS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

/// What a new connection asks first: its id, the server's version and clock (µs).
pub(crate) const HELLO: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED), VERSION(), \
     CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

impl Sql {
    pub(crate) fn new(config: &MySqlConfig) -> Self {
        let table = config.quoted_table();
        let sequence = config.quoted_sequence();
        Self {
            acquire: format!(
                "INSERT INTO {table} (name, token) \
                 SELECT ?, LAST_INSERT_ID({NOW_MICROS}) FROM DUAL WHERE GET_LOCK(?, ?) = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {NOW_MICROS}))"
            ),
            acquire_sequence: format!("SELECT IF(GET_LOCK(?, ?) = 1, NEXTVAL({sequence}), NULL)"),
            sequence,
            acquire_plain: "SELECT GET_LOCK(?, ?)",
            release: "SELECT RELEASE_LOCK(?)",
            next_token: format!(
                "INSERT INTO {table} (name, token) VALUES (?, LAST_INSERT_ID({NOW_MICROS})) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {NOW_MICROS}))"
            ),
            sweep: format!("DELETE FROM {table} WHERE token < {NOW_MICROS} - ? LIMIT {SWEEP_ROWS}"),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 name VARBINARY(255) NOT NULL PRIMARY KEY, \
                 token BIGINT UNSIGNED NOT NULL\
                 ) ENGINE=InnoDB"
            ),
        }
    }

    /// One statement that tries `count` keys (each a `?`) without waiting and draws a token
    /// for each granted one, as a single attempt's statement does: `GET_LOCK` alone without
    /// fencing, `IF(GET_LOCK, NEXTVAL, NULL)` on the MariaDB sequence; `None` for the counter
    /// rows, which one statement cannot return a token per row of.
    pub(crate) fn try_all(&self, fence: Fence, count: usize) -> Option<String> {
        let one = match fence {
            Fence::Off => "GET_LOCK(?, 0)".to_owned(),
            Fence::Sequence => format!("IF(GET_LOCK(?, 0) = 1, NEXTVAL({}), NULL)", self.sequence),
            Fence::Row => return None,
        };
        Some(format!("SELECT {}", vec![one; count].join(", ")))
    }

    /// The fencing sequence, quoted.
    pub(crate) fn sequence(&self) -> &str {
        &self.sequence
    }

    /// See the field.
    pub(crate) fn next_token(&self) -> &str {
        &self.next_token
    }

    /// The fencing table's `CREATE TABLE IF NOT EXISTS`.
    pub(crate) fn create_table(&self) -> &str {
        &self.create
    }

    /// `RELEASE_LOCK` of `count` keys (each a `?`) in one statement.
    pub(crate) fn release_all(count: usize) -> String {
        format!("SELECT {}", vec!["RELEASE_LOCK(?)"; count].join(", "))
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

/// Raises the fencing sequence to at least `now_micros`, the server's clock when `conn` opened
/// (`SETVAL` never lowers it); creates it, starting there, if it is missing and `create` allows.
///
/// Every connection does this before its first acquire. Within one server run the sequence only
/// rises; after a restart every connection is new, so the first token is at least the clock
/// then, above every token of the run before even if a crash lost the sequence's last
/// reservation (`innodb_flush_log_at_trx_commit` other than 1) and as long as the server's clock
/// did not go back. Starting at the clock also keeps tokens above those of a counter table.
pub(crate) async fn raise_sequence(
    conn: &mut MySqlConnection,
    sql: &Sql,
    now_micros: u64,
    create: bool,
) -> sqlx::Result<()> {
    // `SETVAL` takes a literal, not a parameter.
    let raise = format!("SELECT SETVAL({}, {now_micros})", sql.sequence);
    match conn.execute(sqlx::raw_sql(&raise)).await {
        Err(e) if create && error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) => {
            conn.execute(sqlx::raw_sql(&format!(
                "CREATE SEQUENCE IF NOT EXISTS {} START WITH {now_micros} CACHE 1000",
                sql.sequence
            )))
            .await?;
            // Someone may have created it a moment earlier, starting lower.
            conn.execute(sqlx::raw_sql(&raise)).await.map(drop)
        }
        other => other.map(drop),
    }
}

/// The server's clock in microseconds.
async fn now_micros(conn: &mut MySqlConnection) -> sqlx::Result<u64> {
    sqlx::query(&format!("SELECT {NOW_MICROS}"))
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)
}

/// One command on a connection.
#[derive(Clone, Debug)]
pub(crate) enum Cmd {
    /// `GET_LOCK(key, wait)` and, when granted, the fencing increment.
    Acquire {
        key: std::sync::Arc<str>,
        wait: Duration,
        fence: Fence,
        create_table: bool,
    },
    /// `RELEASE_LOCK(key)`.
    Release { key: std::sync::Arc<str> },
    /// `COM_PING`.
    Ping,
    /// `KILL QUERY id`: interrupts another connection's statement.
    KillQuery(u64),
    /// Creates the fencing table (or sequence) if missing.
    CreateTable(Fence),
    /// Deletes counter rows past [`FENCE_RETENTION`].
    SweepFence,
}

/// What a command returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `Some(token)`: granted; `None`: not granted within the wait (or interrupted).
    Acquired(Option<u64>),
    /// `RELEASE_LOCK`'s value: `Some(1)` released, `Some(0)` another connection's, `None` no such lock.
    Released(Option<i64>),
    /// Rows deleted.
    Swept(u64),
    /// Done.
    Done,
}

const ER_NO_SUCH_TABLE: u16 = 1146;
/// MariaDB's "Unknown SEQUENCE".
pub(crate) const ER_UNKNOWN_SEQUENCES: u16 = 4091;

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

/// `GET_LOCK` alone (`statement` without fencing) or with `NEXTVAL`: the one value it returns.
async fn select_once(
    conn: &mut MySqlConnection,
    statement: &str,
    key: &str,
    wait: Duration,
) -> sqlx::Result<Option<i64>> {
    sqlx::query(statement)
        .bind(key)
        .bind(wait.as_secs_f64())
        .fetch_one(conn)
        .await?
        .try_get(0)
}

/// Runs `cmd` on `conn`.
pub(crate) async fn exec(conn: &mut MySqlConnection, sql: &Sql, cmd: &Cmd) -> sqlx::Result<Reply> {
    match cmd {
        Cmd::Acquire {
            key,
            wait,
            fence: Fence::Off,
            ..
        } => {
            let granted = select_once(conn, sql.acquire_plain, key, *wait).await? == Some(1);
            Ok(Reply::Acquired(granted.then_some(0)))
        }
        Cmd::Acquire {
            key,
            wait,
            fence: Fence::Sequence,
            create_table,
        } => {
            let token = match select_once(conn, &sql.acquire_sequence, key, *wait).await {
                // The sequence is opened before `GET_LOCK` runs, so a missing one never leaves a
                // lock behind: create it and try again.
                Err(e) if *create_table && error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) => {
                    let now = now_micros(conn).await?;
                    raise_sequence(conn, sql, now, true).await?;
                    select_once(conn, &sql.acquire_sequence, key, *wait).await?
                }
                other => other?,
            };
            Ok(Reply::Acquired(token.map(i64::unsigned_abs)))
        }
        Cmd::Acquire {
            key,
            wait,
            fence: Fence::Row,
            create_table,
        } => {
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
        Cmd::CreateTable(Fence::Sequence) => {
            let now = now_micros(conn).await?;
            raise_sequence(conn, sql, now, true).await?;
            Ok(Reply::Done)
        }
        Cmd::SweepFence => {
            let retention = u64::try_from(FENCE_RETENTION.as_micros()).unwrap_or(u64::MAX);
            let done = sqlx::query(&sql.sweep)
                .bind(retention)
                .execute(&mut *conn)
                .await?;
            Ok(Reply::Swept(done.rows_affected()))
        }
        Cmd::CreateTable(_) => {
            conn.execute(sqlx::raw_sql(&sql.create)).await?;
            Ok(Reply::Done)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Fence;

    #[test]
    fn mariadb_since_10_3_fences_with_a_sequence() {
        assert_eq!(
            Fence::for_server(true, false, "10.11.6-MariaDB-0+deb12u1"),
            Fence::Sequence
        );
        assert_eq!(
            Fence::for_server(true, false, "11.4.2-MariaDB"),
            Fence::Sequence
        );
        assert_eq!(
            Fence::for_server(true, false, "10.3.39-MariaDB-log"),
            Fence::Sequence
        );
        assert_eq!(
            Fence::for_server(true, false, "10.2.44-MariaDB"),
            Fence::Row
        );
        assert_eq!(Fence::for_server(true, false, "8.0.36"), Fence::Row);
        assert_eq!(
            Fence::for_server(false, false, "10.11.6-MariaDB"),
            Fence::Off
        );
        assert_eq!(Fence::for_server(true, true, "10.11.6-MariaDB"), Fence::Row);
    }

    #[test]
    fn only_mariadb_since_10_1_2_waits_in_fractions_of_a_second() {
        use super::waits_in_fractions;
        assert!(waits_in_fractions("10.11.19-MariaDB-0+deb12u1"));
        assert!(waits_in_fractions("10.1.2-MariaDB"));
        assert!(!waits_in_fractions("10.1.1-MariaDB"));
        assert!(!waits_in_fractions("10.0.38-MariaDB"));
        assert!(!waits_in_fractions("8.0.36"));
        assert!(!waits_in_fractions("8.4.0-commercial"));
    }
}
