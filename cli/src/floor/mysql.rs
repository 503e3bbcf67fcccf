//! MySQL's and MariaDB's raw floors, with sqlx alone: prepared `GET_LOCK(n, 0)` +
//! `RELEASE_LOCK(n)` on a held connection, the same pair taking a fencing token as dlock does
//! (from a private counter of the kind dlock uses on the server), and the server's own lock
//! queue handing a blocking `GET_LOCK` on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_mysql::MySqlConfig;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{Connection, Executor};
use tokio::time::timeout;

use crate::contend::{Contender, contend};
use crate::floor::{
    FreeList, Measured, Ops, Pairs, Protocol, Throughput, WarmUp, all_slots_taken,
    contend_for_last_permit, many, sample,
};

mod permits;

use permits::{PermitContender, Slots};

const BACKEND: &str = "mysql";

fn failed(error: sqlx::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

fn timed_out(after: Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}

/// The server a `mysql://` or `mariadb://` URL names.
#[derive(Debug)]
pub(crate) struct MySql {
    config: MySqlConfig,
    /// Set once the fenced floor could not create its counter (no `CREATE` privilege, say):
    /// the bench then goes on without it, and says so once.
    no_fenced_floor: AtomicBool,
}

impl MySql {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: MySqlConfig::from_url(url)?,
            no_fenced_floor: AtomicBool::new(false),
        })
    }

    /// A connection as dlock opens one (TLS as the URL asks, no statement logging), with
    /// nothing of dlock's session settings.
    async fn connect(&self) -> Result<MySqlConnection> {
        connect(&self.config.connect_options()?, self.config.connect_timeout).await
    }

    /// A lock name of this run.
    fn name(what: &str) -> String {
        format!("dlock-floor{what}/{:016x}", rand::random::<u64>())
    }
}

async fn connect(options: &MySqlConnectOptions, within: Duration) -> Result<MySqlConnection> {
    timeout(within, MySqlConnection::connect_with(options))
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)
}

/// One pair on `conn`: `GET_LOCK(name, 0)`, or `fenced`'s statement, then
/// `RELEASE_LOCK(name)`, both granted.
async fn pair(
    conn: &mut MySqlConnection,
    name: &str,
    within: Duration,
    fenced: Option<&FencedAcquire>,
) -> Result<()> {
    let statements = async {
        let got = match fenced {
            None => {
                sqlx::query_scalar::<_, Option<i64>>("SELECT GET_LOCK(?, 0)")
                    .bind(name)
                    .fetch_one(&mut *conn)
                    .await?
                    == Some(1)
            }
            Some(fenced) => fenced.acquire(&mut *conn, name).await?,
        };
        let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(name)
            .fetch_one(&mut *conn)
            .await?;
        Ok::<_, sqlx::Error>((got, released))
    };
    let (got, released) = timeout(within, statements)
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)?;
    if !got || released != Some(1) {
        return Err(LockError::unexpected(
            BACKEND,
            format!("floor lock {name} was not free: granted {got}, RELEASE_LOCK {released:?}"),
        ));
    }
    Ok(())
}

/// The server's clock in microseconds, as dlock's counter rows floor their tokens at it.
const NOW_MICROS: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)";

/// The fenced floor's acquire: `GET_LOCK(name, 0)` taking a fencing token in the same
/// statement as dlock does, from a counter of this measurement's own, dropped after it.
#[derive(Clone)]
struct FencedAcquire {
    /// Parameters: the name (twice for a counter row).
    sql: String,
    counter: Counter,
}

/// A counter the fenced floor created: its quoted name and kind.
#[derive(Clone)]
struct Counter {
    quoted: String,
    kind: CounterKind,
}

#[derive(Clone, Copy)]
enum CounterKind {
    /// MariaDB 10.3+: `NEXTVAL` of a sequence with dlock's `CACHE 1000`.
    Sequence,
    /// MySQL (and older MariaDB): a counter row per name, written when the lock was granted.
    Row,
}

impl FencedAcquire {
    /// Creates the counter next to dlock's fencing table (same database), trying the sequence
    /// first: MySQL has none, and where `CREATE SEQUENCE` fails dlock uses counter rows too.
    async fn create(conn: &mut MySqlConnection, config: &MySqlConfig) -> sqlx::Result<Self> {
        let mut private = config.clone();
        private.table = format!("{}_floor{:08x}", config.table, rand::random::<u32>());
        let sequence = private.quoted_sequence();
        let created = conn
            .execute(sqlx::raw_sql(&format!(
                "CREATE SEQUENCE {sequence} CACHE 1000"
            )))
            .await;
        if created.is_ok() {
            return Ok(Self {
                sql: format!("SELECT IF(GET_LOCK(?, 0) = 1, NEXTVAL({sequence}), NULL)"),
                counter: Counter {
                    quoted: sequence,
                    kind: CounterKind::Sequence,
                },
            });
        }
        let table = private.quoted_table();
        conn.execute(sqlx::raw_sql(&format!(
            "CREATE TABLE {table} (name VARBINARY(255) NOT NULL PRIMARY KEY, \
             token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
        )))
        .await?;
        Ok(Self {
            sql: format!(
                "INSERT INTO {table} (name, token) \
                 SELECT ?, LAST_INSERT_ID({NOW_MICROS}) FROM DUAL WHERE GET_LOCK(?, 0) = 1 \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {NOW_MICROS}))"
            ),
            counter: Counter {
                quoted: table,
                kind: CounterKind::Row,
            },
        })
    }

    /// Takes `name` with a token: whether the lock was granted.
    async fn acquire(&self, conn: &mut MySqlConnection, name: &str) -> sqlx::Result<bool> {
        Ok(match self.counter.kind {
            CounterKind::Sequence => sqlx::query_scalar::<_, Option<i64>>(&self.sql)
                .bind(name)
                .fetch_one(conn)
                .await?
                .is_some(),
            CounterKind::Row => {
                let done = sqlx::query(&self.sql)
                    .bind(name)
                    .bind(name)
                    .execute(conn)
                    .await?;
                done.rows_affected() > 0
            }
        })
    }
}

impl Counter {
    /// Drops the counter.
    async fn drop_on(&self, conn: &mut MySqlConnection) {
        let what = match self.kind {
            CounterKind::Sequence => "SEQUENCE",
            CounterKind::Row => "TABLE",
        };
        let drop = format!("DROP {what} IF EXISTS {}", self.quoted);
        let _ = conn.execute(sqlx::raw_sql(&drop)).await;
    }
}

/// Pairs through a pool as large as dlock's: each takes a connection, runs its pair (fenced,
/// with `fenced`) and gives it back.
struct PooledPairs {
    pool: FreeList<MySqlConnection>,
    options: MySqlConnectOptions,
    names: Vec<String>,
    connect_timeout: Duration,
    within: Duration,
    fenced: Option<FencedAcquire>,
}

impl Pairs for PooledPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let name = &self.names[task];
        self.pool
            .with(
                || connect(&self.options, self.connect_timeout),
                async |conn| pair(conn, name, self.within, self.fenced.as_ref()).await,
            )
            .await
    }
}

impl MySql {
    /// The fenced floor's counter, created on `conn`; `None`, said once, where it cannot be.
    async fn fenced_acquire(&self, conn: &mut MySqlConnection) -> Result<Option<FencedAcquire>> {
        if self.no_fenced_floor.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let within = self.config.command_timeout;
        match timeout(within, FencedAcquire::create(conn, &self.config)).await {
            Ok(Ok(fenced)) => Ok(Some(fenced)),
            Ok(Err(error)) => {
                if !self.no_fenced_floor.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "dlock bench: no fenced floor: cannot create its counter next to `{}`: {error}",
                        self.config.table
                    );
                }
                Ok(None)
            }
            Err(_) => Err(timed_out(within)),
        }
    }

    /// Runs `measure` with a counter created for it on a connection of its own, and drops the
    /// counter afterwards; `None` where no counter can be created.
    async fn with_counter<T>(
        &self,
        measure: impl AsyncFnOnce(&FencedAcquire) -> Result<T>,
    ) -> Result<Option<T>> {
        let within = self.config.command_timeout;
        let mut setup = self.connect().await?;
        let measured = match self.fenced_acquire(&mut setup).await {
            Ok(Some(fenced)) => {
                let measured = measure(&fenced).await;
                let _ = timeout(within, fenced.counter.drop_on(&mut setup)).await;
                measured.map(Some)
            }
            other => other.map(|_| None),
        };
        let _ = timeout(within, setup.close()).await;
        measured
    }

    /// Pairs on **one connection held throughout**, fenced with `fenced`, after a warm-up of
    /// 200 ms (at most a fifth of `duration`).
    async fn held_pairs(
        &self,
        duration: Duration,
        fenced: Option<&FencedAcquire>,
    ) -> Result<Measured> {
        let mut conn = self.connect().await?;
        let name = Self::name(if fenced.is_some() { "-fenced" } else { "" });
        let within = self.config.command_timeout;
        let warm_up = WarmUp::For(
            Duration::from_millis(200).min(duration.checked_div(5).unwrap_or_default()),
        );
        let samples = sample(warm_up, duration, async || {
            pair(&mut conn, &name, within, fenced).await
        })
        .await;
        let _ = timeout(within, conn.close()).await;
        samples
    }

    /// The many-names pairs of `tasks` tasks on a pool as large as dlock's, fenced with
    /// `fenced`.
    async fn parallel_pairs(
        &self,
        tasks: usize,
        duration: Duration,
        fenced: Option<&FencedAcquire>,
    ) -> Result<Throughput> {
        let run = Self::name("-parallel");
        let pairs = Arc::new(PooledPairs {
            pool: FreeList::new(self.config.max_connections),
            options: self.config.connect_options()?,
            names: (0..tasks).map(|i| format!("{run}/{i}")).collect(),
            connect_timeout: self.config.connect_timeout,
            within: self.config.command_timeout,
            fenced: fenced.cloned(),
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

impl Protocol for MySql {
    fn ops(&self) -> Ops {
        Ops {
            pair: "GET_LOCK(n,0) + RELEASE_LOCK(n), prepared",
            fenced_pair: self.config.fencing.then_some(
                "GET_LOCK(n,0) and NEXTVAL(seq) in one SELECT (MySQL: a counter row) + RELEASE_LOCK(n)",
            ),
            handoff: "RELEASE_LOCK, then the next blocking GET_LOCK answers (raw connections contending as dlock's clients do)",
            client: format!(
                "a pool of {} connections (max_connections, as dlock's own pool)",
                self.config.max_connections
            ),
            peer_pair: None,
        }
    }

    /// On **one connection held throughout**, after a warm-up of 200 ms (at most a fifth of
    /// `duration`).
    async fn pairs(&self, duration: Duration) -> Result<Measured> {
        self.held_pairs(duration, None).await
    }

    /// As [`pairs`](Self::pairs), each `GET_LOCK` taking a token in its statement as dlock's
    /// does, from a counter created for the measurement.
    async fn fenced_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        self.with_counter(async |fenced| self.held_pairs(duration, Some(fenced)).await)
            .await
    }

    /// `waiters` connections, each waiting in a blocking `GET_LOCK(name, 3600)` and holding the
    /// lock `hold` once the server grants it, run through the same contention loop as dlock's
    /// own phase: a sample is the time from a holder sending `RELEASE_LOCK` to the next
    /// holder's `GET_LOCK` answered.
    async fn handoffs(
        &self,
        duration: Duration,
        waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let name = Self::name("-handoff");
        let mut contenders = Vec::with_capacity(waiters);
        for _ in 0..waiters.max(2) {
            contenders.push(RawContender {
                conn: self.connect().await?,
                name: name.clone(),
            });
        }
        let (samples, _) = contend(contenders, duration, hold).await?;
        Ok(samples)
    }

    /// On one connection held throughout: a slot of `permits` taken from a random one round
    /// with its token, and let go; one permit is the fenced lock's pair.
    async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
        if permits == 1 {
            return self.fenced_pairs(duration).await;
        }
        self.with_counter(async |fenced| {
            let within = self.config.command_timeout;
            let mut conn = self.connect().await?;
            let slots = Slots::new(permits, fenced);
            let warm_up = WarmUp::For(Duration::from_millis(300).min(duration));
            let measured = sample(warm_up, duration, async || {
                let slot = slots
                    .take(&mut conn, slots.random(), None, within)
                    .await?
                    .ok_or_else(|| all_slots_taken(BACKEND))?;
                slots.release(&mut conn, slot, within).await
            })
            .await;
            let _ = timeout(within, conn.close()).await;
            measured
        })
        .await
    }

    /// `permits - 1` slots held by one more connection throughout; `waiters` connections
    /// contend for the last one.
    async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        (waiters, hold): (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        self.with_counter(async |fenced| {
            let within = self.config.command_timeout;
            let mut parked = self.connect().await?;
            let slots = Arc::new(Slots::new(permits, fenced));
            // Slot i from slot i round: a connection's second `GET_LOCK` of a slot it holds
            // would stack rather than move on.
            for i in 0..usize::try_from(permits.saturating_sub(1)).unwrap_or(0) {
                if slots.take(&mut parked, i, None, within).await? != Some(i) {
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
            // Closing the connection lets the parked slots go.
            let _ = timeout(within, parked.close()).await;
            samples
        })
        .await
    }

    /// A pool as large as dlock's own (`max_connections`), shared by the tasks: the least a
    /// pool does (no ping or reset of a connection between two pairs).
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
        self.parallel_pairs(tasks, duration, None).await
    }

    /// As [`parallel`](Self::parallel), with the fenced pairs of
    /// [`fenced_pairs`](Self::fenced_pairs), the tasks sharing one counter.
    async fn fenced_parallel(
        &self,
        tasks: usize,
        duration: Duration,
    ) -> Result<Option<Throughput>> {
        self.with_counter(async |fenced| self.parallel_pairs(tasks, duration, Some(fenced)).await)
            .await
    }
}

/// One connection contending for a name with `GET_LOCK` and `RELEASE_LOCK`.
struct RawContender {
    conn: MySqlConnection,
    name: String,
}

impl Contender for RawContender {
    async fn lock(&mut self) -> Result<()> {
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 3600)")
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .map_err(failed)?;
        if got == Some(1) {
            Ok(())
        } else {
            Err(LockError::unexpected(
                BACKEND,
                format!("GET_LOCK({}) answered {got:?}", self.name),
            ))
        }
    }

    async fn unlock(&mut self) -> Result<()> {
        let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
            .bind(&self.name)
            .fetch_one(&mut self.conn)
            .await
            .map_err(failed)?;
        Ok(())
    }
}
