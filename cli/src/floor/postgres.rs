//! Postgres's raw floors, with sqlx alone: prepared `pg_try_advisory_lock` +
//! `pg_advisory_unlock` on a held connection, and a blocking `pg_advisory_lock` handed on by
//! the server. A semaphore's floors are in [`permits`].

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_postgres::PostgresConfig;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use tokio::time::timeout;

use crate::contend::{Contender, contend};
use crate::floor::{
    FreeList, Measured, Ops, Pairs, Protocol, Throughput, WarmUp, all_slots_taken,
    contend_for_last_permit, many, sample,
};

mod permits;

use permits::{PermitContender, Slots, create_sequence, drop_sequence};

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
                .ok_or_else(|| all_slots_taken(BACKEND))?;
            slots.release(&mut conn, slot, within).await
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
        let options = self.config.connect_options()?;
        // Slot i from slot i on: advisory locks stack per session, so an attempt from slot 0
        // each time would take slot 0 again and again.
        for i in 0..slots.keys.len().saturating_sub(1) {
            if slots.take(&mut parked, i, within).await? != Some(slots.keys[i]) {
                return Err(LockError::unexpected(BACKEND, "a parked slot was taken"));
            }
        }
        let samples = contend_for_last_permit(waiters, duration, hold, async || {
            PermitContender::new(self.connect().await?, slots.clone(), &options, within).await
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
