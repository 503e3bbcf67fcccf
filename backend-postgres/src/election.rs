//! Elections: the leaders table next to the fence sequence, and its statements.
//!
//! One row per election name: the term (the leader's fencing token), the value, and who wrote it
//! (`pg_backend_pid()` and that backend's `backend_start`). A row counts only while that backend
//! holds the name's advisory key, as `pg_locks` says at the moment of the read: a leader whose
//! session ended leaves a row that reads as vacant, with nothing to clean up, and a backend
//! that took the pid of a dead one is told apart by its start time.
//!
//! A write and a resignation's delete notify the name's channel (`pg_notify`, delivered at
//! commit), which the client's observers listen on (see `listen.rs`); a dead session notifies
//! nobody, so observers also read on a timer.
//!
//! The statements that write or delete a record commit without waiting for the WAL flush
//! ([`ASYNC_COMMIT`]): a record counts only while its writer's session holds the key, and a
//! crash that could lose the last commits ends every session, so no record read after it
//! counts whether its write or delete survived. On a hand-over the new leader's write waits for
//! the resignation's delete of the same row to commit, and then commits itself: two flushes
//! between a resignation and the new leader's return, on a disk that syncs slowly most of the
//! hand-over.

use std::time::Duration;

use dlock_api::{Leader, MAX_LEADER_VALUE, Result};
use sqlx::postgres::{PgArguments, PgConnection, Postgres};
use sqlx::query::Query;
use tokio::time::timeout;

use crate::config::{PostgresConfig, config_error, quote_qualified_suffixed};
use crate::error::{sqlstate, timed_out};
use crate::listen::leader_channel;
use crate::sql::advisory_is;

/// The suffix of the leaders table's name, after the fence sequence's.
pub(crate) const LEADERS_SUFFIX: &str = "_leaders";

/// Postgres's `undefined_table`: the leaders table is not there (`create_fence=false` and no
/// migration yet).
pub(crate) const UNDEFINED_TABLE: &str = "42P01";

/// `SET LOCAL synchronous_commit = off` as an expression, for a statement's select list: its
/// transaction commits without waiting for the flush. Only for statements whose writes need not
/// survive a crash (the records); never one that draws a token from the durable sequence.
const ASYNC_COMMIT: &str = "set_config('synchronous_commit', 'off', true)";

/// This backend's start time, for a record's `holder_start`: read once per connection, when
/// the connection is prepared, into the session setting [`OWN_START_SETTING`], because
/// `pg_stat_get_activity` copies every backend's status to find one (about 50 µs a call, a
/// tenth of a hand-over); read from there if a connection somehow lacks the setting.
const OWN_START: &str = "coalesce(current_setting('dlock.backend_start', true)::timestamptz, \
     (SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid())))";

/// The session setting that keeps [`OWN_START`], and its value's expression for `prepare`.
pub(crate) const OWN_START_SETTING: &str = "set_config('dlock.backend_start', \
     (SELECT backend_start::text FROM pg_stat_get_activity(pg_backend_pid())), false)";

/// The statements of one client's leaders table.
#[derive(Debug)]
pub(crate) struct LeaderSql {
    table: String,
    create: String,
    proclaim: String,
    leader: String,
    forget: String,
    /// A candidate's wait that writes the record with its grant; see [`with_grant`].
    ///
    /// [`with_grant`]: Self::with_grant
    wait_leading: String,
}

impl LeaderSql {
    /// The statements for the table `fence_sequence` + `_leaders`.
    pub(crate) fn new(config: &PostgresConfig) -> Result<Self> {
        let table = quote_qualified_suffixed(&config.fence_sequence, LEADERS_SUFFIX)?;
        let held_by = |pid: &str, key: &str| {
            format!(
                "EXISTS (SELECT 1 FROM pg_locks l WHERE {} AND l.pid = {pid} \
                 AND l.mode = 'ExclusiveLock' AND l.granted)",
                advisory_is(key)
            )
        };
        Ok(Self {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 name text PRIMARY KEY, \
                 key bigint NOT NULL, \
                 term bigint NOT NULL, \
                 value bytea NOT NULL CHECK (octet_length(value) <= {MAX_LEADER_VALUE}), \
                 holder integer NOT NULL, \
                 holder_start timestamptz)"
            ),
            // Written only while this backend holds the key, and never over a higher term; the
            // row comes back only when it was written, and only then are observers told
            // (channel `$5`, at commit).
            proclaim: format!(
                "WITH w AS (INSERT INTO {table} AS r (name, key, term, value, holder, holder_start) \
                 SELECT $1, $2, $3, $4, pg_backend_pid(), \
                 {OWN_START} \
                 WHERE {} \
                 ON CONFLICT (name) DO UPDATE SET key = EXCLUDED.key, term = EXCLUDED.term, \
                 value = EXCLUDED.value, holder = EXCLUDED.holder, \
                 holder_start = EXCLUDED.holder_start WHERE r.term <= EXCLUDED.term \
                 RETURNING r.term) \
                 SELECT true FROM w, pg_notify($5, w.term::text) AS told, {ASYNC_COMMIT} AS a",
                held_by("pg_backend_pid()", "$2")
            ),
            // A start time the reader may not see (another role's session, without
            // `pg_read_all_stats`) does not count against the row.
            leader: format!(
                "SELECT r.term, r.value FROM {table} r WHERE r.name = $1 AND {} \
                 AND coalesce((SELECT s.backend_start = r.holder_start \
                 FROM pg_stat_get_activity(r.holder) s), true)",
                held_by("r.holder", "$2")
            ),
            forget: format!(
                "WITH gone AS (DELETE FROM {table} WHERE key = $1 AND holder = pg_backend_pid() \
                 RETURNING term) \
                 SELECT count(*) FROM gone, pg_notify($2, gone.term::text) AS told, \
                 {ASYNC_COMMIT} AS a"
            ),
            wait_leading: String::new(),
            table,
        })
    }

    /// These statements, with a candidate's wait whose grant draws its token with `draw` (the
    /// fence's SQL) and writes the record in the same statement: `pg_advisory_lock($1)` under
    /// `lock_timeout = $2`, the token, then name `$3`'s record of value `$4` with that token as
    /// the term (if it is above 0 and below `$6`, the tokens the client keeps as drawn, and no
    /// higher term is there), and the notification on channel `$5`. One row: the token, and
    /// whether the record was written. `unlogged_draw`: the token comes from the unlogged
    /// sequence, below a reservation already committed, so the statement may commit
    /// asynchronously as the other record writes do; a token from the durable sequence must be
    /// flushed before it is returned.
    pub(crate) fn with_grant(mut self, draw: &str, unlogged_draw: bool) -> Self {
        let table = &self.table;
        let commit = if unlogged_draw { ASYNC_COMMIT } else { "true" };
        self.wait_leading = format!(
            "WITH g AS (SELECT {draw} AS token FROM (SELECT pg_advisory_lock($1) FROM \
             (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l), \
             w AS (INSERT INTO {table} AS r (name, key, term, value, holder, holder_start) \
             SELECT $3, $1, g.token, $4, pg_backend_pid(), \
             {OWN_START} \
             FROM g WHERE g.token > 0 AND g.token < $6 \
             ON CONFLICT (name) DO UPDATE SET key = EXCLUDED.key, term = EXCLUDED.term, \
             value = EXCLUDED.value, holder = EXCLUDED.holder, \
             holder_start = EXCLUDED.holder_start WHERE r.term <= EXCLUDED.term \
             RETURNING r.term) \
             SELECT g.token, (SELECT count(*) FROM w, pg_notify($5, w.term::text) AS told) > 0, \
             {commit} FROM g"
        );
        self
    }

    /// The candidate's wait of [`with_grant`](Self::with_grant) on key `key` for `name`.
    pub(crate) fn wait_leading<'q>(
        &'q self,
        (name, key): (&'q str, i64),
        timeout_ms: u64,
        value: &'q [u8],
        kept_below: i64,
    ) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(&self.wait_leading)
            .bind(key)
            .bind(format!("{timeout_ms}ms"))
            .bind(name)
            .bind(value)
            .bind(leader_channel(key))
            .bind(kept_below)
    }

    /// The leaders table's name, quoted.
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table if it is missing.
    pub(crate) async fn create(&self, conn: &mut PgConnection, within: Duration) -> Result<()> {
        let ran = timeout(within, sqlx::query(&self.create).execute(&mut *conn))
            .await
            .map_err(|_| timed_out(within))?;
        match ran {
            Ok(_) => Ok(()),
            // Another client creating it at the same moment: the relation (`42P07`), its row
            // type (`42710`) or a catalog key (`23505`) is already there, as for the fence.
            Err(e)
                if sqlstate(&e)
                    .is_some_and(|c| ["42P07", "42710", "23505"].contains(&c.as_str())) =>
            {
                Ok(())
            }
            Err(e) if sqlstate(&e).is_some() => Err(config_error(format!(
                "cannot create the leaders table {} ({}): call PostgresLock::migrate() as a privileged user",
                self.table,
                e.as_database_error().map(|d| d.message()).unwrap_or("")
            ))),
            Err(e) => Err(crate::error::map_err(e)),
        }
    }

    /// The owner-checked write of `name`'s record (key `key`): one row back if written.
    pub(crate) fn proclaim<'q>(
        &'q self,
        name: &'q str,
        key: i64,
        term: i64,
        value: &'q [u8],
    ) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(&self.proclaim)
            .bind(name)
            .bind(key)
            .bind(term)
            .bind(value)
            .bind(leader_channel(key))
    }

    /// `name`'s record (key `key`), if its writer holds the key now: `(term, value)`.
    pub(crate) fn leader<'q>(
        &'q self,
        name: &'q str,
        key: i64,
    ) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(&self.leader).bind(name).bind(key)
    }

    /// Deletes the record this backend wrote for the 64-bit key `key` (only if it wrote it: a
    /// successor's stays), telling observers when a row went. A resignation runs it right after
    /// the key's unlock (`unlock_leader`).
    pub(crate) fn forget(&self, key: i64) -> Query<'_, Postgres, PgArguments> {
        sqlx::query(&self.forget)
            .bind(key)
            .bind(leader_channel(key))
    }
}

/// A record read back: the term is the token the leader was granted.
pub(crate) fn leader_from(term: i64, value: Vec<u8>) -> Leader {
    Leader::new(dlock_api::FencingToken::new(term.unsigned_abs()), value)
}
