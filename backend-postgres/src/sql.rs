//! The statements, built once per client (the fence sequence's name is configurable).
//!
//! Every statement is one round trip and is prepared once per connection (sqlx caches it).

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use crate::key::{self, RawKey};

/// The statements of one client, for both advisory key spaces.
#[derive(Debug)]
pub(crate) struct Sql {
    try_int: String,
    try_permit: String,
    try_pair: String,
    wait_int: String,
    wait_pair: String,
}

impl Sql {
    /// `draw` is the token's SQL expression ([`Fence::draw_sql`](crate::fence::Fence::draw_sql));
    /// `None` means fencing is off (tokens are 0).
    pub(crate) fn new(draw: Option<&str>) -> Self {
        // The token is taken *after* the lock is granted, in the same statement: CASE evaluates
        // THEN only when WHEN is true; the nested subqueries (OFFSET 0 keeps the planner from
        // flattening them) run set_config, then the lock, then nextval, in that order.
        let token = draw.unwrap_or("0::bigint");
        let try_lock = |args: &str| {
            format!("SELECT CASE WHEN pg_try_advisory_lock({args}) THEN {token} END AS token")
        };
        // A busy name key held *shared* is held by a semaphore's permits: the second column
        // says so, only when the lock was refused, by a shared attempt of its own (given back at
        // once), so that the lock is refused as a mismatch rather than called busy. A shared
        // attempt is free of catalog reads: the granted lock costs what it did before.
        let try_int = format!(
            "SELECT token, CASE WHEN token IS NULL THEN \
             CASE WHEN pg_try_advisory_lock_shared($1) THEN pg_advisory_unlock_shared($1) \
             ELSE false END END AS shared FROM ({} OFFSET 0) t",
            try_lock("$1")
        );
        let wait = |args: &str, timeout: &str| {
            format!(
                "SELECT {token} AS token FROM (SELECT pg_advisory_lock({args}) FROM \
                 (SELECT set_config('lock_timeout', {timeout}, false) OFFSET 0) s OFFSET 0) l"
            )
        };
        Self {
            try_int,
            try_permit: try_permit(token),
            try_pair: try_lock("$1, $2"),
            wait_int: wait("$1", "$2"),
            wait_pair: wait("$1, $2", "$3"),
        }
    }

    /// `pg_try_advisory_lock` and, if granted, the token: one row, `NULL` when busy (with, for
    /// a 64-bit key, whether the key is held by a semaphore's permits).
    pub(crate) fn try_lock(&self, key: RawKey) -> Query<'_, Postgres, PgArguments> {
        match key {
            RawKey::Int(k) => sqlx::query(&self.try_int).bind(k),
            RawKey::Pair(a, b) => sqlx::query(&self.try_pair).bind(a).bind(b),
        }
    }

    /// `pg_advisory_lock` under `lock_timeout = timeout_ms`, then the token.
    pub(crate) fn wait_lock(
        &self,
        key: RawKey,
        timeout_ms: u64,
    ) -> Query<'_, Postgres, PgArguments> {
        let timeout = format!("{timeout_ms}ms");
        match key {
            RawKey::Int(k) => sqlx::query(&self.wait_int).bind(k).bind(timeout),
            RawKey::Pair(a, b) => sqlx::query(&self.wait_pair).bind(a).bind(b).bind(timeout),
        }
    }
}

/// One attempt at a permit of the 64-bit key `key` of a semaphore of `permits`, trying the
/// slots in the order of `slots` (the keys of every slot, rotated to a random start):
/// `(status, slot key, token)`; see [`try_permit`].
pub(crate) fn try_permit_query(
    sql: &Sql,
    key: i64,
    permits: u32,
    slots: Vec<i64>,
    gate_timeout_ms: u64,
) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(&sql.try_permit)
        .bind(key::gate_key(key))
        .bind(key)
        .bind(key::limit_key(key, permits))
        .bind(slots)
        .bind(format!("{gate_timeout_ms}ms"))
}

/// An attempt that found the name free: it now holds the name's limit.
pub(crate) const PERMIT_FREE: i32 = 0;
/// An attempt that found holders of the same limit.
pub(crate) const PERMIT_JOINED: i32 = 1;
/// An attempt that found the name in use as a lock or with another limit: nothing taken.
pub(crate) const PERMIT_MISMATCH: i32 = 2;

/// The statement of one permit attempt; `$1` the name's gate key, `$2` its own key, `$3` its
/// limit key, `$4` the slot keys in the order to try them, `$5` the longest wait for the gate
/// (`lock_timeout` for this statement only: a session keeps the one its last wait set).
///
/// Under the gate (a transaction-scoped lock, so it ends with the statement whatever happens),
/// no other permit attempt on the name runs its checks, and permit holders only ever leave, so
/// what the checks see stays true until the statement takes its locks:
/// 1. the name's key taken exclusively, for this statement only: nobody holds the name (no
///    lock, no permit, no lock waiting): the name is free, and this attempt sets its limit
///    (status 0);
/// 2. else the limit key taken exclusively, for this statement only: nobody holds this limit,
///    so the name is held by a lock or by permits of another limit: a mismatch, nothing taken
///    (status 2);
/// 3. else permits of this limit are held: join them (status 1).
///
/// Unless a mismatch, the attempt then takes the name's key and the limit key shared for the
/// session (a lock's exclusive attempt on the name's key is busy while any permit is held, and
/// a permit's shared one while a lock holds it or waits), then the first free slot in `$4`,
/// and the token after the slot, in the same statement. Without a slot, the shared locks are
/// given back before the statement ends. The nested subqueries (`OFFSET 0` keeps the planner
/// from flattening them) run the steps in this order; `LIMIT 1` stops the slot scan at the
/// first slot taken.
fn try_permit(token: &str) -> String {
    format!(
        "SELECT st, slot, CASE WHEN slot IS NOT NULL THEN {token} END AS token, \
         CASE WHEN sk AND slot IS NULL THEN pg_advisory_unlock_shared($2) END AS uk, \
         CASE WHEN sl AND slot IS NULL THEN pg_advisory_unlock_shared($3) END AS ul \
         FROM (SELECT st, sk, sl, CASE WHEN sl THEN (SELECT k FROM unnest($4::bigint[]) AS u(k) \
         WHERE pg_try_advisory_lock(k) LIMIT 1) END AS slot \
         FROM (SELECT st, sk, CASE WHEN sk THEN pg_try_advisory_lock_shared($3) END AS sl \
         FROM (SELECT st, CASE WHEN st <> {PERMIT_MISMATCH} THEN pg_try_advisory_lock_shared($2) END AS sk \
         FROM (SELECT CASE WHEN pg_try_advisory_xact_lock($2) THEN {PERMIT_FREE} \
         WHEN pg_try_advisory_xact_lock($3) THEN {PERMIT_MISMATCH} ELSE {PERMIT_JOINED} END AS st \
         FROM (SELECT pg_advisory_xact_lock($1) FROM (SELECT set_config('lock_timeout', $5, true) \
         OFFSET 0) s OFFSET 0) g OFFSET 0) c OFFSET 0) d OFFSET 0) e OFFSET 0) f"
    )
}

/// `SQL` that is true for a `pg_locks` row `l` of the 64-bit advisory key `key` (an SQL
/// expression) in this database.
pub(crate) fn advisory_is(key: &str) -> String {
    format!(
        "l.locktype = 'advisory' \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND l.classid = (({key} >> 32) & 4294967295)::oid \
         AND l.objid = ({key} & 4294967295)::oid AND l.objsubid = 1"
    )
}

/// What a name is in use as, for a refusal: whether its key is held exclusively (a lock), and
/// the least `n` whose limit key (`$2[n]`, the limit keys of 1, 2, …) is held shared.
pub(crate) fn in_use(key: i64, limits: Vec<i64>) -> Query<'static, Postgres, PgArguments> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE {} AND l.mode = 'ExclusiveLock' \
             AND l.granted), (SELECT min(c.n) FROM unnest($2::bigint[]) WITH ORDINALITY AS c(k, n) \
             JOIN pg_locks l ON {} AND l.mode = 'ShareLock' AND l.granted)",
            advisory_is("$1"),
            advisory_is("c.k")
        )
    });
    sqlx::query(sql).bind(key).bind(limits)
}

/// How many permits of the name whose key is `$2` are held, as `pg_locks` says: its slot keys
/// `$1` held, or 1 if none is and the name's key is held exclusively (a lock).
pub(crate) fn count_held(slots: Vec<i64>, key: i64) -> Query<'static, Postgres, PgArguments> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "SELECT greatest((SELECT count(*) FROM unnest($1::bigint[]) AS c(k) JOIN pg_locks l \
             ON {} AND l.granted), (SELECT count(*) FROM pg_locks l WHERE {} \
             AND l.mode = 'ExclusiveLock' AND l.granted))",
            advisory_is("c.k"),
            advisory_is("$2")
        )
    });
    sqlx::query(sql).bind(slots).bind(key)
}

/// Waits (under `lock_timeout`) until the slot key `$1` is free, and leaves it free: a wake-up
/// for the attempt that follows, which takes whichever slot is free then.
pub(crate) fn wait_slot(slot: i64, timeout_ms: u64) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT pg_advisory_unlock($1) FROM (SELECT pg_advisory_lock($1) FROM \
         (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l",
    )
    .bind(slot)
    .bind(format!("{timeout_ms}ms"))
}

/// Releases a permit: its slot `$1`, and the name's key `$2` and limit key `$3` (shared, one
/// level: a session holds at most one permit of a name). The first column says whether the
/// slot was held.
pub(crate) fn unlock_permit(
    slot: i64,
    key: i64,
    limit: i64,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT pg_advisory_unlock($1), pg_advisory_unlock_shared($2), \
         pg_advisory_unlock_shared($3)",
    )
    .bind(slot)
    .bind(key)
    .bind(limit)
}

/// Undoes whatever a failed or unwanted permit attempt left on its session: any of the slots
/// `$1`, and the shared name and limit keys.
pub(crate) fn undo_permit(
    slots: Vec<i64>,
    key: i64,
    limit: i64,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT (SELECT coalesce(bool_or(pg_advisory_unlock(k)), false) FROM unnest($1::bigint[]) \
         AS u(k)), pg_advisory_unlock_shared($2), pg_advisory_unlock_shared($3)",
    )
    .bind(slots)
    .bind(key)
    .bind(limit)
}

/// `pg_advisory_unlock`: true if this session held the key (once; we never stack).
pub(crate) fn unlock(key: RawKey) -> Query<'static, Postgres, PgArguments> {
    match key {
        RawKey::Int(k) => sqlx::query("SELECT pg_advisory_unlock($1)").bind(k),
        RawKey::Pair(a, b) => sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(a)
            .bind(b),
    }
}
