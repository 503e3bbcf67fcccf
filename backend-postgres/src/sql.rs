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
        let wait = |args: &str, timeout: &str| {
            format!(
                "SELECT {token} AS token FROM (SELECT pg_advisory_lock({args}) FROM \
                 (SELECT set_config('lock_timeout', {timeout}, false) OFFSET 0) s OFFSET 0) l"
            )
        };
        Self {
            try_int: try_lock("$1"),
            try_pair: try_lock("$1, $2"),
            wait_int: wait("$1", "$2"),
            wait_pair: wait("$1, $2", "$3"),
        }
    }

    /// `pg_try_advisory_lock` and, if granted, the token: one row, `NULL` when busy.
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

/// `pg_advisory_unlock`: true if this session held the key (once; we never stack).
pub(crate) fn unlock(key: RawKey) -> Query<'static, Postgres, PgArguments> {
    match key {
        RawKey::Int(k) => sqlx::query("SELECT pg_advisory_unlock($1)").bind(k),
        RawKey::Pair(a, b) => sqlx::query("SELECT pg_advisory_unlock($1, $2)")
            .bind(a)
            .bind(b),
    }
}
