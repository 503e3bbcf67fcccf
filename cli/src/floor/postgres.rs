//! Postgres's raw floors, with sqlx alone: prepared `pg_try_advisory_lock` +
//! `pg_advisory_unlock` on a held connection, and a blocking `pg_advisory_lock` handed on by
//! the server. A semaphore's floors take one of N slot advisory locks with its fencing token
//! (`nextval` after the slot, in the same statement), trying the slots from a random one on,
//! and a waiter blocks on one slot for at most 500 ms before it tries them all again.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_postgres::PostgresConfig;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::time::timeout;

use crate::contend::{Contender, contend};
use crate::floor::{
    FreeList, Measured, Ops, Pairs, Protocol, Throughput, WarmUp, contend_for_last_permit, many,
    sample,
};

const BACKEND: &str = "postgres";

fn failed(error: sqlx::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

fn timed_out(after: Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}

/// The server a `postgres://` URL names.
#[derive(Debug)]
pub(crate) struct Postgres {
    config: PostgresConfig,
}

impl Postgres {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: PostgresConfig::from_url(url)?,
        })
    }

    /// A connection as dlock opens one (TLS as the URL asks, no start-up parameters a pooler
    /// would refuse, no statement logging), without any session settings.
    async fn connect(&self) -> Result<PgConnection> {
        connect(&self.config.connect_options()?, self.config.connect_timeout).await
    }
}

async fn connect(options: &PgConnectOptions, within: Duration) -> Result<PgConnection> {
    timeout(within, PgConnection::connect_with(options))
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)
}

/// `sql` (one boolean answer) with `key` bound, on `conn`, within `within`.
async fn ask(
    conn: &mut PgConnection,
    sql: &'static str,
    key: i64,
    within: Duration,
) -> Result<bool> {
    timeout(
        within,
        sqlx::query_scalar(sql).bind(key).fetch_one(&mut *conn),
    )
    .await
    .map_err(|_| timed_out(within))?
    .map_err(failed)
}

/// One pair on `conn`: `pg_try_advisory_lock(key)` then `pg_advisory_unlock(key)`, both true.
async fn pair(conn: &mut PgConnection, key: i64, within: Duration) -> Result<()> {
    let got = ask(conn, "SELECT pg_try_advisory_lock($1)", key, within).await?;
    let released = ask(conn, "SELECT pg_advisory_unlock($1)", key, within).await?;
    if !(got && released) {
        return Err(LockError::unexpected(
            BACKEND,
            "the raw floor's random key was held by someone else",
        ));
    }
    Ok(())
}

/// How long a waiting permit attempt blocks on one slot before it tries them all again, as
/// dlock's waiter does.
const PERMIT_RESCAN: &str = "500ms";

/// `lock_not_available`: a blocking advisory lock ran into its `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// How long a lock's wait (one permit) blocks before it asks again, as dlock's `wait_slice`.
const LOCK_WAIT: &str = "10s";

/// The slots of a semaphore of this run, and the sequence its tokens come from. One permit is
/// a lock, which dlock takes with the lock's statements (a try, and a blocking wait that keeps
/// the lock), each with its token: so does the floor.
struct Slots {
    keys: Vec<i64>,
    /// The statement of one attempt: the first slot of `$1` free, then the token.
    take: String,
    /// One permit's wait: `pg_advisory_lock($1)` under `lock_timeout = $2`, then the token.
    wait_lock: String,
}

impl Slots {
    /// `permits` random slot keys, the tokens drawn from `sequence`.
    fn new(permits: u32, sequence: &str) -> Self {
        let slot = if permits == 1 {
            "CASE WHEN pg_try_advisory_lock(($1::bigint[])[1]) THEN ($1::bigint[])[1] END"
        } else {
            "(SELECT k FROM unnest($1::bigint[]) AS u(k) WHERE pg_try_advisory_lock(k) LIMIT 1)"
        };
        Self {
            keys: (0..permits).map(|_| rand::random()).collect(),
            // The token is drawn after the slot is taken, and only then: `OFFSET 0` keeps the
            // planner from flattening the subquery, `LIMIT 1` stops at the first slot taken.
            take: format!(
                "SELECT slot, CASE WHEN slot IS NOT NULL THEN nextval('{sequence}') END AS token \
                 FROM (SELECT {slot} AS slot OFFSET 0) t"
            ),
            wait_lock: format!(
                "SELECT nextval('{sequence}') AS token FROM (SELECT pg_advisory_lock($1) FROM \
                 (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l"
            ),
        }
    }

    /// One attempt on `conn`, the slots tried from slot `first` on: the slot taken, if any.
    async fn take(
        &self,
        conn: &mut PgConnection,
        first: usize,
        within: Duration,
    ) -> Result<Option<i64>> {
        let mut order = self.keys.clone();
        let start = first.checked_rem(order.len()).unwrap_or(0);
        order.rotate_left(start);
        let (slot, _token): (Option<i64>, Option<i64>) = timeout(
            within,
            sqlx::query_as(&self.take).bind(order).fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)?;
        Ok(slot)
    }

    /// A random slot's index.
    fn random(&self) -> usize {
        rand::random_range(0..self.keys.len().max(1))
    }
}

/// `pg_advisory_unlock(slot)`, which must have been held.
async fn unlock_slot(conn: &mut PgConnection, slot: i64, within: Duration) -> Result<()> {
    if !ask(conn, "SELECT pg_advisory_unlock($1)", slot, within).await? {
        return Err(LockError::unexpected(
            BACKEND,
            "a floor's slot was not held",
        ));
    }
    Ok(())
}

/// The unlogged sequence a run's permit tokens come from (`CREATE UNLOGGED SEQUENCE`, as
/// dlock's fast fence; a plain one before PostgreSQL 15), dropped by [`drop_sequence`].
async fn create_sequence(conn: &mut PgConnection, within: Duration) -> Result<String> {
    let name = format!("dlock_bench_fence_{}", std::process::id());
    for create in ["CREATE UNLOGGED SEQUENCE", "CREATE SEQUENCE"] {
        let created = timeout(
            within,
            sqlx::raw_sql(&format!("{create} IF NOT EXISTS {name}")).execute(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?;
        if created.is_ok() {
            return Ok(name);
        }
    }
    Err(LockError::unexpected(
        BACKEND,
        "the floor's fence sequence could not be made",
    ))
}

async fn drop_sequence(conn: &mut PgConnection, name: &str, within: Duration) -> Result<()> {
    timeout(
        within,
        sqlx::raw_sql(&format!("DROP SEQUENCE IF EXISTS {name}")).execute(&mut *conn),
    )
    .await
    .map_err(|_| timed_out(within))?
    .map_err(failed)
    .map(drop)
}

/// One connection contending for a slot: an attempt at every slot; while none is free,
/// `pg_advisory_lock` on a random one under a 500 ms `lock_timeout` (the server wakes it when
/// that slot is released), let go at once, and an attempt from that slot on. One permit is
/// a lock: its wait blocks and keeps the lock, with the token.
struct PermitContender {
    conn: PgConnection,
    slots: Arc<Slots>,
    held: Option<i64>,
    within: Duration,
}

impl Contender for PermitContender {
    async fn lock(&mut self) -> Result<()> {
        let mut first = self.slots.random();
        loop {
            if let Some(slot) = self.slots.take(&mut self.conn, first, self.within).await? {
                self.held = Some(slot);
                return Ok(());
            }
            first = self.slots.random();
            let key = self.slots.keys[first];
            let one = self.slots.keys.len() == 1;
            let (statement, timeout) = match one {
                true => (self.slots.wait_lock.as_str(), LOCK_WAIT),
                false => (
                    "SELECT pg_advisory_unlock($1) FROM (SELECT pg_advisory_lock($1) FROM \
                     (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l",
                    PERMIT_RESCAN,
                ),
            };
            let waited = sqlx::query(statement)
                .bind(key)
                .bind(timeout)
                .execute(&mut self.conn)
                .await;
            if one && waited.is_ok() {
                self.held = Some(key);
                return Ok(());
            }
            match waited {
                Ok(_) => {}
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                {
                    // The timeout may have raced the grant (a session lock outlives the failed
                    // statement): let it go, as dlock does, before the slots are tried.
                    sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(key)
                        .execute(&mut self.conn)
                        .await
                        .map_err(failed)?;
                }
                Err(e) => return Err(failed(e)),
            }
        }
    }

    async fn unlock(&mut self) -> Result<()> {
        let slot = self
            .held
            .take()
            .ok_or_else(|| LockError::unexpected(BACKEND, "released a slot it never took"))?;
        unlock_slot(&mut self.conn, slot, self.within).await
    }
}

/// Pairs through a pool as large as dlock's: each takes a connection, runs its pair and gives
/// it back.
struct PooledPairs {
    pool: FreeList<PgConnection>,
    options: PgConnectOptions,
    keys: Vec<i64>,
    connect_timeout: Duration,
    within: Duration,
}

impl Pairs for PooledPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let key = self.keys[task];
        self.pool
            .with(
                || connect(&self.options, self.connect_timeout),
                async |conn| pair(conn, key, self.within).await,
            )
            .await
    }
}

impl Protocol for Postgres {
    fn ops(&self) -> Ops {
        Ops {
            pair: "pg_try_advisory_lock + pg_advisory_unlock, prepared",
            fenced_pair: None,
            handoff: "pg_advisory_unlock, then the next blocking pg_advisory_lock answers (raw connections contending as dlock's clients do)",
            client: format!(
                "a pool of {} connections (max_connections, as dlock's own pool)",
                self.config.max_connections
            ),
            peer_pair: None,
        }
    }

    /// On **one connection held throughout**, a random key (concurrent runs do not contend),
    /// after a warm-up of 300 ms (at most `duration`).
    async fn pairs(&self, duration: Duration) -> Result<Measured> {
        let mut conn = self.connect().await?;
        let key: i64 = rand::random();
        let within = self.config.command_timeout;
        let warm_up = WarmUp::For(Duration::from_millis(300).min(duration));
        let samples = sample(warm_up, duration, async || {
            pair(&mut conn, key, within).await
        })
        .await?;
        let _ = timeout(within, conn.close()).await;
        Ok(samples)
    }

    /// `waiters` connections, each waiting in a blocking `pg_advisory_lock($1)` and holding the
    /// lock `hold` once the server grants it, run through the same contention loop as dlock's
    /// own phase: a sample is the time from a holder sending `pg_advisory_unlock($1)` to the
    /// next holder's `pg_advisory_lock` answered.
    async fn handoffs(
        &self,
        duration: Duration,
        waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let key: i64 = rand::random();
        let mut contenders = Vec::with_capacity(waiters);
        for _ in 0..waiters.max(2) {
            contenders.push(RawContender {
                conn: self.connect().await?,
                key,
            });
        }
        let (samples, _) = contend(contenders, duration, hold).await?;
        Ok(samples)
    }

    /// On one connection held throughout: a slot of `permits` taken from a random one on with
    /// its token, and let go.
    async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
        let within = self.config.command_timeout;
        let mut conn = self.connect().await?;
        let sequence = create_sequence(&mut conn, within).await?;
        let slots = Slots::new(permits, &sequence);
        let warm_up = WarmUp::For(Duration::from_millis(300).min(duration));
        let measured = sample(warm_up, duration, async || {
            let slot = slots
                .take(&mut conn, slots.random(), within)
                .await?
                .ok_or_else(|| {
                    LockError::unexpected(BACKEND, "the floor's random slots were all taken")
                })?;
            unlock_slot(&mut conn, slot, within).await
        })
        .await;
        drop_sequence(&mut conn, &sequence, within).await?;
        let _ = timeout(within, conn.close()).await;
        measured.map(Some)
    }

    /// `permits - 1` slots held by one more connection throughout; `waiters` connections
    /// contend for the last one.
    async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        (waiters, hold): (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        let within = self.config.command_timeout;
        let mut parked = self.connect().await?;
        let sequence = create_sequence(&mut parked, within).await?;
        let slots = Arc::new(Slots::new(permits, &sequence));
        // Slot i from slot i on: advisory locks stack per session, so an attempt from slot 0
        // each time would take slot 0 again and again.
        for i in 0..slots.keys.len().saturating_sub(1) {
            if slots.take(&mut parked, i, within).await? != Some(slots.keys[i]) {
                return Err(LockError::unexpected(BACKEND, "a parked slot was taken"));
            }
        }
        let samples = contend_for_last_permit(waiters, duration, hold, async || {
            Ok(PermitContender {
                conn: self.connect().await?,
                slots: slots.clone(),
                held: None,
                within,
            })
        })
        .await;
        drop_sequence(&mut parked, &sequence, within).await?;
        // Closing the connection lets the parked slots go.
        let _ = timeout(within, parked.close()).await;
        samples.map(Some)
    }

    /// A pool as large as dlock's own (`max_connections`), shared by the tasks: the least a
    /// pool does (no ping or reset of a connection between two pairs).
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
        let pairs = Arc::new(PooledPairs {
            pool: FreeList::new(self.config.max_connections),
            options: self.config.connect_options()?,
            keys: (0..tasks).map(|_| rand::random()).collect(),
            connect_timeout: self.config.connect_timeout,
            within: self.config.command_timeout,
        });
        let result = many(pairs.clone(), tasks, duration).await;
        if let Some(pairs) = Arc::into_inner(pairs) {
            for conn in pairs.pool.into_connections() {
                let _ = timeout(self.config.command_timeout, conn.close()).await;
            }
        }
        result
    }
}

/// One connection contending for a key with `pg_advisory_lock` and `pg_advisory_unlock`.
struct RawContender {
    conn: PgConnection,
    key: i64,
}

impl Contender for RawContender {
    async fn lock(&mut self) -> Result<()> {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(self.key)
            .execute(&mut self.conn)
            .await
            .map_err(failed)
            .map(drop)
    }

    async fn unlock(&mut self) -> Result<()> {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(&mut self.conn)
            .await
            .map_err(failed)
            .map(drop)
    }
}
