//! Fencing tokens: strictly rising across clients, restarts and crashes, at the cost of one WAL
//! flush per window of tokens rather than one per 32 acquires.
//!
//! A plain sequence (`CACHE 1`) is strict: `nextval` WAL-logs 32 values ahead and makes the
//! transaction that logged flush the WAL at commit, so a crash never hands a value out twice.
//! That flush is what fencing costs per acquire: about one `fsync` every 32 locks, which on a
//! disk that takes a millisecond to sync is most of what a lock costs beyond `pg_try_advisory_lock`.
//!
//! In **window** mode (the default on PostgreSQL 15 and newer) the acquire statement draws its
//! token from an *unlogged* sequence (`NAME_fast`: no WAL at all), and the token is good only
//! while it lies above 0 and below a limit that the durable sequence (`NAME`) has reserved and a
//! one-row table (`NAME_window`) records:
//! - The unlogged sequence starts at the least `bigint` and a crash resets it there, so a token
//!   drawn after a crash is negative until a renewal moves the sequence past every reservation.
//! - Every limit a client has seen was committed, and so flushed, with the reservation behind
//!   it: the durable sequence stands at or above it, and the next reservation starts higher.
//! - A token outside `(0, limit)` is exchanged by `NAME_renew(size)`, one more round trip while
//!   the lock is already held: under the table's row lock it draws again, and if that is still
//!   outside the recorded window, reserves `size` more values from the durable sequence (one
//!   WAL flush), moving the unlogged sequence up first if a crash had reset it.
//!
//! Clients cache the limit, so the acquire statement is `nextval` on the unlogged sequence and
//! nothing else; a renewal happens once per client at start, once per `size` tokens, and after
//! a crash. The durable sequence must be dlock's alone while clients in this mode use it:
//! clients of an older dlock (or with `fence_window=0`) taking `nextval` from it directly at
//! the same time would hand out tokens above the window's. Once they are gone, the next renewal
//! moves the window above whatever they took.
//!
//! With `fence_window=0`, and on servers before PostgreSQL 15 (no unlogged sequences), every
//! acquire takes `nextval` on the durable sequence, as before.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use dlock_api::Result;
use sqlx::Row;
use sqlx::postgres::PgConnection;
use tokio::time::timeout;

use crate::config::{PostgresConfig, config_error, quote_qualified_suffixed};
use crate::error::{map_err, sqlstate, timed_out};

/// Where tokens come from.
#[derive(Debug)]
pub(crate) struct Fence {
    /// The durable sequence, quoted.
    sequence: String,
    window: Option<Window>,
}

/// The objects and cached limit of window mode.
#[derive(Debug)]
struct Window {
    size: i64,
    fast: String,
    renew: String,
    /// The highest limit this client knows to be reserved; tokens below it (and above 0) are good.
    limit: AtomicI64,
}

/// The first server version with unlogged sequences.
const UNLOGGED_SEQUENCES: i32 = 150_000;

impl Fence {
    /// Checks (or, with `create`, creates) the objects `config` asks for on the server `conn` is
    /// connected to, and reads the current limit.
    pub(crate) async fn ensure(
        conn: &mut PgConnection,
        config: &PostgresConfig,
        create: bool,
    ) -> Result<Self> {
        let within = config.command_timeout;
        let sequence = config.quoted_sequence()?;
        let version = ensure_sequence(conn, &sequence, create, within).await?;
        if config.fence_window == 0 || version < UNLOGGED_SEQUENCES {
            if config.fence_window > 0 {
                tracing::debug!(
                    version,
                    "postgres: no unlogged sequences before PostgreSQL 15; fencing takes nextval on {sequence} per acquire"
                );
            }
            return Ok(Self {
                sequence,
                window: None,
            });
        }
        let names = WindowNames::new(config)?;
        ensure_window(conn, &sequence, &names, create, within).await?;
        let limit: i64 = fetch(
            conn,
            // No row yet (another client is creating the table): the first acquire renews.
            sqlx::query(&format!(
                "SELECT coalesce((SELECT below FROM {}), 0)",
                names.table
            )),
            within,
        )
        .await?
        .try_get(0)
        .map_err(map_err)?;
        Ok(Self {
            sequence,
            window: Some(Window {
                size: i64::try_from(config.fence_window).unwrap_or(i64::MAX / 4),
                fast: names.fast,
                renew: names.renew,
                limit: AtomicI64::new(limit),
            }),
        })
    }

    /// The SQL expression the acquire statements take their token with.
    pub(crate) fn draw_sql(&self) -> String {
        let sequence = match &self.window {
            Some(window) => &window.fast,
            None => &self.sequence,
        };
        format!("nextval('{}')", sequence.replace('\'', "''"))
    }

    /// Whether [`draw_sql`](Self::draw_sql) draws from the unlogged sequence (below a committed
    /// reservation), not the durable one.
    pub(crate) fn draws_unlogged(&self) -> bool {
        self.window.is_some()
    }

    /// Tokens below this (and above 0) are [`settle`](Self::settle)d as drawn, as far as this
    /// client knows now: a statement that writes its token elsewhere writes only such a one.
    pub(crate) fn kept_below(&self) -> i64 {
        self.window
            .as_ref()
            .map_or(i64::MAX, |window| window.limit.load(Ordering::Relaxed))
    }

    /// The token for a lock the statement just granted with `drawn`: `drawn` itself when it is
    /// good, else a renewed one (the caller holds the lock meanwhile; an error leaves it to the
    /// caller to unlock).
    pub(crate) async fn settle(
        &self,
        conn: &mut PgConnection,
        drawn: i64,
    ) -> std::result::Result<i64, sqlx::Error> {
        let Some(window) = &self.window else {
            return Ok(drawn);
        };
        if drawn > 0 && drawn < window.limit.load(Ordering::Relaxed) {
            return Ok(drawn);
        }
        let row = sqlx::query(&format!("SELECT token, lim FROM {}($1)", window.renew))
            .bind(window.size)
            .fetch_one(&mut *conn)
            .await?;
        let (token, limit): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        // Stored, not raised: after a failover the new primary's reservation is what counts.
        window.limit.store(limit, Ordering::Relaxed);
        Ok(token)
    }
}

/// The quoted names of window mode's objects, next to the durable sequence.
struct WindowNames {
    fast: String,
    table: String,
    renew: String,
}

impl WindowNames {
    fn new(config: &PostgresConfig) -> Result<Self> {
        let name = &config.fence_sequence;
        Ok(Self {
            fast: quote_qualified_suffixed(name, "_fast")?,
            table: quote_qualified_suffixed(name, "_window")?,
            renew: quote_qualified_suffixed(name, "_renew")?,
        })
    }

    /// The renewal function's body (`prosrc`): compared on connect, so that a newer dlock
    /// replaces an older body.
    fn renew_body(&self, sequence: &str) -> String {
        let Self { fast, table, .. } = self;
        let lit = |name: &str| name.replace('\'', "''");
        let (fast_lit, sequence_lit) = (lit(fast), lit(sequence));
        format!(
            r"
DECLARE
  reserved bigint;
  start bigint;
BEGIN
  SELECT w.below INTO reserved FROM {table} w FOR UPDATE;
  IF NOT FOUND THEN
    -- created, and its row not yet inserted (or deleted): start it empty
    INSERT INTO {table} (below) VALUES (0) ON CONFLICT DO NOTHING;
    SELECT w.below INTO STRICT reserved FROM {table} w FOR UPDATE;
  END IF;
  token := nextval('{fast_lit}');
  IF token > 0 AND token < reserved THEN
    lim := reserved;
    RETURN;
  END IF;
  start := nextval('{sequence_lit}');
  IF token < start THEN
    -- Reset by a crash, never used, or the durable sequence moved by something else: every
    -- token handed out lies below a committed reservation, so below start.
    PERFORM setval('{fast_lit}', start, false);
    token := nextval('{fast_lit}');
  END IF;
  lim := token + size;
  PERFORM setval('{sequence_lit}', lim - 1);
  UPDATE {table} SET below = lim;
END
"
        )
    }

    /// The statements that create what is missing or out of date (each idempotent).
    fn ddl(&self, sequence: &str) -> Vec<String> {
        let Self { fast, table, renew } = self;
        vec![
            format!(
                "CREATE UNLOGGED SEQUENCE IF NOT EXISTS {fast} AS bigint \
                 MINVALUE -9223372036854775808 START WITH -9223372036854775808 CACHE 1"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {table} \
                 (one boolean PRIMARY KEY DEFAULT true CHECK (one), below bigint NOT NULL)"
            ),
            format!("INSERT INTO {table} (below) VALUES (0) ON CONFLICT DO NOTHING"),
            format!(
                "CREATE OR REPLACE FUNCTION {renew}(size bigint, OUT token bigint, OUT lim bigint) \
                 LANGUAGE plpgsql AS $fn${}$fn$",
                self.renew_body(sequence)
            ),
        ]
    }
}

async fn fetch<'q>(
    conn: &mut PgConnection,
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    within: Duration,
) -> Result<sqlx::postgres::PgRow> {
    timeout(within, query.fetch_one(&mut *conn))
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)
}

/// Whether every object of window mode exists, the function with this version's body.
async fn window_exists(
    conn: &mut PgConnection,
    sequence: &str,
    names: &WindowNames,
    within: Duration,
) -> Result<bool> {
    let row = fetch(
        conn,
        sqlx::query(
            "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
             AND coalesce((SELECT prosrc = $4 FROM pg_proc WHERE oid = to_regprocedure($3)), false)",
        )
        .bind(&names.fast)
        .bind(&names.table)
        .bind(format!("{}(bigint)", names.renew))
        .bind(names.renew_body(sequence)),
        within,
    )
    .await?;
    row.try_get(0).map_err(map_err)
}

async fn ensure_window(
    conn: &mut PgConnection,
    sequence: &str,
    names: &WindowNames,
    create: bool,
    within: Duration,
) -> Result<()> {
    if window_exists(conn, sequence, names, within).await? {
        return Ok(());
    }
    let ddl = names.ddl(sequence);
    if !create {
        return Err(config_error(format!(
            "the fence window {} is missing or out of date: call PostgresLock::migrate(), or set fence_window=0 for a nextval per acquire (or fencing=false)",
            names.table
        )));
    }
    for statement in &ddl {
        // `XX000`: another client replacing the function at the same moment (the check below
        // tells whether what is there now is right).
        run_create(conn, statement, &["XX000"], "the fence window", within).await?;
    }
    if window_exists(conn, sequence, names, within).await? {
        Ok(())
    } else {
        Err(config_error(format!(
            "the fence window {} could not be created",
            names.table
        )))
    }
}

/// The durable sequence's cache size (`None` if it does not exist), and the server's version
/// number, in one round trip.
async fn sequence_cache_and_version(
    conn: &mut PgConnection,
    sequence: &str,
    within: Duration,
) -> Result<(Option<i64>, i32)> {
    let row = fetch(
        conn,
        sqlx::query(
            "SELECT (SELECT seqcache FROM pg_sequence WHERE seqrelid = to_regclass($1)), \
             current_setting('server_version_num')::int",
        )
        .bind(sequence),
        within,
    )
    .await?;
    Ok((
        row.try_get(0).map_err(map_err)?,
        row.try_get(1).map_err(map_err)?,
    ))
}

/// Runs one idempotent `CREATE …`. Another client creating the same object at the same moment
/// can still make it fail with a duplicate (`42P07` relation, `42710` its row type, `23505` a
/// catalog key) or one of `also_tolerated`: those count as done. Any other refusal is a
/// configuration error about `what`.
async fn run_create(
    conn: &mut PgConnection,
    statement: &str,
    also_tolerated: &[&str],
    what: &str,
    within: Duration,
) -> Result<()> {
    let ran = timeout(within, sqlx::query(statement).execute(&mut *conn))
        .await
        .map_err(|_| timed_out(within))?;
    match ran {
        Ok(_) => Ok(()),
        Err(e)
            if sqlstate(&e).is_some_and(|code| {
                ["42P07", "42710", "23505"].contains(&code.as_str())
                    || also_tolerated.contains(&code.as_str())
            }) =>
        {
            Ok(())
        }
        Err(e) => Err(refused(what, e)),
    }
}

/// The durable sequence's DDL. `CACHE 1` matters: a cached sequence hands each session its own
/// block of values, so tokens would not rise in lock order across clients.
fn create_sequence(sequence: &str) -> String {
    format!("CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint CACHE 1")
}

/// Checks the durable sequence: present with `CACHE 1`, or created when `allow_create`
/// allows. Returns the server's version number.
async fn ensure_sequence(
    conn: &mut PgConnection,
    sequence: &str,
    allow_create: bool,
    within: Duration,
) -> Result<i32> {
    let ddl = create_sequence(sequence);
    let (cache, version) = sequence_cache_and_version(conn, sequence, within).await?;
    match cache {
        Some(1) => return Ok(version),
        Some(n) => {
            return Err(config_error(format!(
                "fence sequence {sequence} has CACHE {n}: tokens would not rise in lock order across clients; run ALTER SEQUENCE {sequence} CACHE 1"
            )));
        }
        None if !allow_create => {
            return Err(config_error(format!(
                "fence sequence {sequence} does not exist: call PostgresLock::migrate() or run `{ddl}` (or set fencing=false)"
            )));
        }
        None => {}
    }
    let what = format!("fence sequence {sequence}");
    run_create(conn, &ddl, &[], &what, within).await?;
    Ok(version)
}

/// A failed `CREATE`: the server's refusal (privileges, say) as a configuration error.
fn refused(what: &str, e: sqlx::Error) -> dlock_api::LockError {
    if sqlstate(&e).is_none() {
        return map_err(e);
    }
    config_error(format!(
        "cannot create {what} ({}): call PostgresLock::migrate() as a privileged user, or set fencing=false",
        e.as_database_error().map(|d| d.message()).unwrap_or("")
    ))
}
