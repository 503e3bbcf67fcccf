//! The statements, built once per client (the fence sequence's name is configurable).
//!
//! Every statement is one round trip and is prepared once per connection (sqlx caches it).

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use crate::key::RawKey;

/// The statements of one client, for both advisory key spaces.
#[derive(Debug)]
pub(crate) struct Sql {
    try_int: String,
    try_permit: String,
    try_read: String,
    wait_read: String,
    try_pair: String,
    wait_int: String,
    wait_pair: String,
    try_all: String,
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
            try_read: try_read(token),
            wait_read: wait_read(token),
            try_pair: try_lock("$1, $2"),
            wait_int: wait("$1", "$2"),
            wait_pair: wait("$1, $2", "$3"),
            try_all: try_all(token),
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

/// One attempt at every 64-bit key of `keys` on this session: see [`try_all`].
pub(crate) fn try_all_query(sql: &Sql, keys: Vec<i64>) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(&sql.try_all).bind(keys)
}

/// The statement of a set's attempt; `$1` the 64-bit keys. One row: `tokens`, a token per key
/// when every `pg_try_advisory_lock` granted (each drawn after every grant, as a single
/// attempt draws its own after its grant); else `NULL`, the keys this statement took are
/// unlocked again before it ends (`undone` counts them), and `shared` says whether a refused
/// key is held in share mode only, by a semaphore's permits (a shared attempt of its own,
/// given back at once), which a single attempt refuses as a mismatch rather than busy. The
/// answers are subqueries over the first step's row, so they run after it and only when
/// their `CASE` reaches them.
fn try_all(token: &str) -> String {
    format!(
        "SELECT CASE WHEN every THEN ARRAY(SELECT {token} FROM unnest(taken) OFFSET 0) END AS tokens, \
         CASE WHEN NOT every THEN (SELECT count(*) FROM unnest(taken) AS t(k) \
         WHERE pg_advisory_unlock(k)) END AS undone, \
         CASE WHEN NOT every THEN (SELECT coalesce(bool_or(CASE WHEN pg_try_advisory_lock_shared(k) \
         THEN pg_advisory_unlock_shared(k) ELSE false END), false) FROM unnest(refused) AS r(k)) \
         END AS shared \
         FROM (SELECT bool_and(got) AS every, coalesce(array_agg(k) FILTER (WHERE got), '{{}}') AS taken, \
         array_agg(k) FILTER (WHERE NOT got) AS refused \
         FROM (SELECT k, pg_try_advisory_lock(k) AS got FROM unnest($1::bigint[]) AS u(k) \
         OFFSET 0) a) g"
    )
}

/// The keys a semaphore's or a reader's attempt binds besides the name's own (see
/// [`crate::key::slot_key`]): the name's gate and the limit key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gated {
    pub(crate) gate: i64,
    pub(crate) limit: i64,
}

/// One attempt at a permit of the 64-bit key `key` of a semaphore with the limit key in
/// `gated`, trying the slots in the order of `slots` (the keys of every slot, rotated to a
/// random start), waiting for the gate up to `gate_timeout` (`lock_timeout`'s text):
/// `(status, slot key, token)`; see [`try_permit`].
pub(crate) fn try_permit_query<'q>(
    sql: &'q Sql,
    key: i64,
    gated: Gated,
    slots: Vec<i64>,
    gate_timeout: &'q str,
) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(&sql.try_permit)
        .bind(gated.gate)
        .bind(key)
        .bind(gated.limit)
        .bind(slots)
        .bind(gate_timeout)
}

/// A reader's attempt on the 64-bit key `key`, its mark the limit key of one in `gated`:
/// `(status, token)`; see [`try_read`].
pub(crate) fn try_read_query<'q>(
    sql: &'q Sql,
    key: i64,
    gated: Gated,
    gate_timeout: &'q str,
) -> Query<'q, Postgres, PgArguments> {
    read_query(&sql.try_read, key, gated).bind(gate_timeout)
}

/// A reader's server-side wait on the 64-bit key `key` under `lock_timeout = timeout_ms`:
/// `(status, token)`; see [`wait_read`]. `permit_limits` are the limit keys of every semaphore
/// the name could be (2 permits and up).
pub(crate) fn wait_read_query(
    sql: &Sql,
    key: i64,
    gated: Gated,
    timeout_ms: u64,
    permit_limits: Vec<i64>,
) -> Query<'_, Postgres, PgArguments> {
    read_query(&sql.wait_read, key, gated)
        .bind(format!("{timeout_ms}ms"))
        .bind(permit_limits)
}

/// A reader's statement `sql` with its first arguments: the gate, the name's key and the
/// readers' mark.
fn read_query(sql: &str, key: i64, gated: Gated) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql)
        .bind(gated.gate)
        .bind(key)
        .bind(gated.limit)
}

/// An attempt that found the name free: it now holds the name's limit.
pub(crate) const PERMIT_FREE: i32 = 0;
/// An attempt that found holders of the same limit.
pub(crate) const PERMIT_JOINED: i32 = 1;
/// An attempt that found the name in use as a lock or with another limit: nothing taken.
pub(crate) const PERMIT_MISMATCH: i32 = 2;

/// The statement of one permit attempt; `$1` the name's gate key, `$2` its own key, `$3` its
/// limit key, `$4` the slot keys in the order to try them, `$5` the longest wait for the gate
/// (`lock_timeout` for this statement only: a session keeps the one its last wait set). Its
/// checks are [`gated_join`]'s.
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
         FROM ({}) e OFFSET 0) f",
        gated_join("$5")
    )
}

/// The checks of a permit's or a reader's attempt, under the name's gate (`$1`, waited for up
/// to the `lock_timeout` in `timeout`, for this statement only): `st`, whether the name's key
/// `$2` was free ([`PERMIT_FREE`]), held by holders of the limit key `$3` ([`PERMIT_JOINED`]) or
/// held otherwise ([`PERMIT_MISMATCH`]); unless a mismatch, `sk`, whether `$2` was taken shared
/// for the session, and if so `sl`, whether `$3` was too. See [`try_permit`].
fn gated_join(timeout: &str) -> String {
    format!(
        "SELECT st, sk, CASE WHEN sk THEN pg_try_advisory_lock_shared($3) END AS sl \
         FROM (SELECT st, CASE WHEN st <> {PERMIT_MISMATCH} THEN pg_try_advisory_lock_shared($2) END AS sk \
         FROM (SELECT CASE WHEN pg_try_advisory_xact_lock($2) THEN {PERMIT_FREE} \
         WHEN pg_try_advisory_xact_lock($3) THEN {PERMIT_MISMATCH} ELSE {PERMIT_JOINED} END AS st \
         FROM (SELECT pg_advisory_xact_lock($1) FROM (SELECT set_config('lock_timeout', {timeout}, true) \
         OFFSET 0) s OFFSET 0) g OFFSET 0) c OFFSET 0) d"
    )
}

/// The statement of a reader's attempt; `$1` the name's gate key, `$2` its own key, `$3` the
/// limit key of one (the readers' mark), `$4` the longest wait for the gate.
///
/// A reader holds the name's key shared (so a lock, which takes it exclusively, and readers
/// exclude each other, and the server queues a reader behind a waiting lock) and the limit key
/// of one shared: the mark that tells readers from a semaphore's permits, which hold the
/// name's key shared too, with their own limit key. The checks are a permit's
/// ([`gated_join`]) with that limit: a free name is taken; a name whose readers' mark is held
/// is joined, unless a lock waits for it (the server refuses a shared attempt behind a waiting
/// exclusive one: writer preference); a name held otherwise is refused (status
/// [`PERMIT_MISMATCH`], nothing taken: held by a lock, or by permits, which `pg_locks` tells).
/// The token is drawn after both keys are taken, in the same statement; without both, the
/// name's key is given back before the statement ends.
fn try_read(token: &str) -> String {
    format!(
        "SELECT st, CASE WHEN sl THEN {token} END AS token, \
         CASE WHEN sk AND sl IS NOT TRUE THEN pg_advisory_unlock_shared($2) END AS uk \
         FROM ({}) e",
        gated_join("$4")
    )
}

/// The statement of a reader's server-side wait; `$1` the name's gate key, `$2` its own key,
/// `$3` the readers' mark (the limit key of one), `$4` the `lock_timeout` of the wait (kept
/// by the session, as a lock's wait keeps it), `$5` the limit keys of every semaphore of the
/// name.
///
/// It waits for the name's key shared in the server's queue, behind the locks waiting ahead
/// (readers waiting together are let in together), then takes the gate and checks what
/// shares the key with it: readers (their mark is held), nobody (the key taken exclusively
/// for the statement, by a session that holds it shared already), or a semaphore's permits
/// (one of their limit keys held, in `pg_locks`; only looked up when neither answered, as
/// when readers let in together have not all reached the gate yet). Permits start on a name
/// only when its key is free, and join only under the gate, so the answer holds while the
/// reader holds the key. Then it takes the mark and draws the token; refused, it gives the
/// name's key back (status [`PERMIT_MISMATCH`]).
fn wait_read(token: &str) -> String {
    format!(
        "SELECT st, CASE WHEN sl THEN {token} END AS token, \
         CASE WHEN sl IS NOT TRUE THEN pg_advisory_unlock_shared($2) END AS uk \
         FROM (SELECT st, CASE WHEN st <> {PERMIT_MISMATCH} THEN pg_try_advisory_lock_shared($3) END AS sl \
         FROM (SELECT CASE WHEN NOT pg_try_advisory_xact_lock($3) THEN {PERMIT_JOINED} \
         WHEN pg_try_advisory_xact_lock($2) THEN {PERMIT_FREE} \
         WHEN EXISTS (SELECT 1 FROM unnest($5::bigint[]) AS c(k) JOIN pg_locks l ON {} \
         AND l.mode = 'ShareLock' AND l.granted) THEN {PERMIT_MISMATCH} ELSE {PERMIT_JOINED} END AS st \
         FROM (SELECT pg_advisory_xact_lock($1) FROM (SELECT pg_advisory_lock_shared($2) FROM \
         (SELECT set_config('lock_timeout', $4, false) OFFSET 0) s OFFSET 0) w OFFSET 0) g \
         OFFSET 0) c OFFSET 0) d",
        advisory_is("c.k")
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

/// Waits (under `lock_timeout`) for the waiting room `$1` of a semaphore and takes it; the
/// session's backend pid comes back, for the client to interrupt its own wait by.
pub(crate) fn enter_room(room: i64, timeout_ms: u64) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1) FROM \
         (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l",
    )
    .bind(room)
    .bind(format!("{timeout_ms}ms"))
}

/// Releases a permit: its slot `$1`, and the limit key `$3` and the name's key `$2` (shared,
/// one level: a session holds at most one permit of a name). The first column says whether the
/// slot was held. The limit key goes before the name's key: a session holding the limit key
/// without the name's would let a permit join while a reader or another limit takes the
/// name (both see the name's key free), and one holding the name's key without the limit
/// key only makes an attempt in that instant busy.
///
/// Then, with the slot free, the first waiter in line is told: if the waiting room `$4` is
/// taken (a share of it refused), `pg_notify` on its channel `$5`; a free room is taken shared
/// and given back at once, and nobody is notified. The columns run in order, so a waiter that
/// takes the room after the look finds the slot free on its next attempt.
pub(crate) fn unlock_permit(
    slot: i64,
    key: i64,
    limit: i64,
    (room, channel): (i64, String),
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT pg_advisory_unlock($1), pg_advisory_unlock_shared($3), \
         pg_advisory_unlock_shared($2), \
         CASE WHEN pg_try_advisory_lock_shared($4) THEN pg_advisory_unlock_shared($4) \
         ELSE (SELECT false FROM pg_notify($5, '') AS told) END",
    )
    .bind(slot)
    .bind(key)
    .bind(limit)
    .bind(room)
    .bind(channel)
}

/// Undoes whatever a failed or unwanted permit attempt left on its session: any of the slots
/// `$1`, and the shared limit and name keys (in that order, as [`unlock_permit`]).
pub(crate) fn undo_permit(
    slots: Vec<i64>,
    key: i64,
    limit: i64,
) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT (SELECT coalesce(bool_or(pg_advisory_unlock(k)), false) FROM unnest($1::bigint[]) \
         AS u(k)), pg_advisory_unlock_shared($3), pg_advisory_unlock_shared($2)",
    )
    .bind(slots)
    .bind(key)
    .bind(limit)
}

/// Releases a reader's share of the 64-bit key `$2` with its mark `$1` (the limit key of one),
/// the mark first: while a session holds the mark, readers may join without looking further,
/// so the mark never outlives the share. The first column says whether the share was held;
/// it is also the undo of a reader's attempt.
pub(crate) fn unlock_read(key: i64, mark: i64) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(
        "SELECT pg_advisory_unlock_shared($2), ul FROM \
         (SELECT pg_advisory_unlock_shared($1) AS ul OFFSET 0) m",
    )
    .bind(mark)
    .bind(key)
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
