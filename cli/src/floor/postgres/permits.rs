//! A semaphore's floors on Postgres, with sqlx alone: one of N slot advisory locks taken with
//! its fencing token (`nextval` after the slot, in the same statement), trying the slots from a
//! random one on. A waiter lines up for a waiting room key (`pg_advisory_lock`, the server's
//! queue); the first in line listens on a channel and tries the slots again when a release
//! notifies it or every 500 ms, and a release notifies only while the room is taken. One
//! permit is a lock, taken with the lock's try and blocking wait.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use tokio::time::timeout;

use super::{BACKEND, failed, timed_out};
use crate::contend::Contender;
use crate::floor::held_slot;

/// How long the first waiter in line waits for a notification before it tries the slots
/// again, as dlock's does.
const PERMIT_RESCAN: Duration = Duration::from_millis(500);

/// `lock_not_available`: a blocking advisory lock ran into its `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// How long a wait at the server (one permit's, or for the room) blocks before it asks again,
/// as dlock's `wait_slice`.
const LOCK_WAIT: &str = "10s";

/// The slots of a semaphore of this run, and the sequence its tokens come from. One permit is
/// a lock, which dlock takes with the lock's statements (a try, and a blocking wait that keeps
/// the lock), each with its token: so does the floor.
pub(super) struct Slots {
    pub(super) keys: Vec<i64>,
    /// The waiting room's key and the channel its first waiter listens on.
    room: i64,
    channel: String,
    /// The statement of one attempt: the first slot of `$1` free, then the token.
    take: String,
    /// One permit's wait: `pg_advisory_lock($1)` under `lock_timeout = $2`, then the token.
    wait_lock: String,
}

impl Slots {
    /// `permits` random slot keys, the tokens drawn from `sequence`.
    pub(super) fn new(permits: u32, sequence: &str) -> Self {
        let slot = if permits == 1 {
            "CASE WHEN pg_try_advisory_lock(($1::bigint[])[1]) THEN ($1::bigint[])[1] END"
        } else {
            "(SELECT k FROM unnest($1::bigint[]) AS u(k) WHERE pg_try_advisory_lock(k) LIMIT 1)"
        };
        let room: i64 = rand::random();
        Self {
            keys: (0..permits).map(|_| rand::random()).collect(),
            room,
            channel: format!("dlock_bench_permit_{room:016x}"),
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
    pub(super) async fn take(
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
    pub(super) fn random(&self) -> usize {
        rand::random_range(0..self.keys.len().max(1))
    }

    /// Releases `slot`, which must have been held; with several permits, then notifies the
    /// room's channel if someone is first in line (the room refuses a share), as dlock's
    /// release does.
    pub(super) async fn release(
        &self,
        conn: &mut PgConnection,
        slot: i64,
        within: Duration,
    ) -> Result<()> {
        // The slot goes first (the columns run in order): a waiter that takes the room after
        // the look finds it free.
        let statement = if self.keys.len() == 1 {
            "SELECT pg_advisory_unlock($1), NULL::bool"
        } else {
            "SELECT pg_advisory_unlock($1), \
             CASE WHEN pg_try_advisory_lock_shared($2) THEN pg_advisory_unlock_shared($2) \
             ELSE (SELECT false FROM pg_notify($3, '') AS told) END"
        };
        let query = sqlx::query_as::<_, (bool, Option<bool>)>(statement)
            .bind(slot)
            .bind(self.room)
            .bind(&self.channel)
            .fetch_one(&mut *conn);
        let (released, _): (bool, Option<bool>) = timeout(within, query)
            .await
            .map_err(|_| timed_out(within))?
            .map_err(failed)?;
        if !released {
            return Err(LockError::unexpected(
                BACKEND,
                "a floor's slot was not held",
            ));
        }
        Ok(())
    }
}

/// The unlogged sequence a run's permit tokens come from (`CREATE UNLOGGED SEQUENCE`, as
/// dlock's fast fence; a plain one before PostgreSQL 15), dropped by [`drop_sequence`].
pub(super) async fn create_sequence(conn: &mut PgConnection, within: Duration) -> Result<String> {
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

pub(super) async fn drop_sequence(
    conn: &mut PgConnection,
    name: &str,
    within: Duration,
) -> Result<()> {
    timeout(
        within,
        sqlx::raw_sql(&format!("DROP SEQUENCE IF EXISTS {name}")).execute(&mut *conn),
    )
    .await
    .map_err(|_| timed_out(within))?
    .map_err(failed)
    .map(drop)
}

/// One connection contending for a slot, and (with several permits) a listening connection of
/// its own, as each dlock client has: an attempt at every slot; while none is free, in line for
/// the room, then as first in line an attempt on each notification or every 500 ms. One permit
/// is a lock: its wait blocks and keeps the lock, with the token.
pub(super) struct PermitContender {
    conn: PgConnection,
    heard: Option<PgListener>,
    slots: Arc<Slots>,
    held: Option<i64>,
    within: Duration,
}

impl PermitContender {
    pub(super) async fn new(
        conn: PgConnection,
        slots: Arc<Slots>,
        options: &PgConnectOptions,
        within: Duration,
    ) -> Result<Self> {
        let heard = if slots.keys.len() > 1 {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(within)
                .connect_lazy_with(options.clone());
            let mut heard = timeout(within, PgListener::connect_with(&pool))
                .await
                .map_err(|_| timed_out(within))?
                .map_err(failed)?;
            timeout(within, heard.listen(&slots.channel))
                .await
                .map_err(|_| timed_out(within))?
                .map_err(failed)?;
            Some(heard)
        } else {
            None
        };
        Ok(Self {
            conn,
            heard,
            slots,
            held: None,
            within,
        })
    }

    /// Blocks at the server on `statement` (`$1` the key, `$2` the timeout): whether it was
    /// granted. A timeout that raced the grant leaves the key held (a session lock outlives the
    /// failed statement): let it go, as dlock does.
    async fn block_on(&mut self, statement: &str, key: i64) -> Result<bool> {
        let waited = sqlx::query(statement)
            .bind(key)
            .bind(LOCK_WAIT)
            .execute(&mut self.conn)
            .await;
        match waited {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut self.conn)
                    .await
                    .map_err(failed)?;
                Ok(false)
            }
            Err(e) => Err(failed(e)),
        }
    }

    /// First in line: attempts until one is granted (true), or the room's time is up.
    async fn first_in_line(&mut self) -> Result<bool> {
        for _ in 0..20 {
            let first = self.slots.random();
            if let Some(slot) = self.slots.take(&mut self.conn, first, self.within).await? {
                self.held = Some(slot);
                return Ok(true);
            }
            if let Some(heard) = self.heard.as_mut() {
                let _ = timeout(PERMIT_RESCAN, heard.recv()).await;
            }
        }
        Ok(false)
    }
}

impl Contender for PermitContender {
    async fn lock(&mut self) -> Result<()> {
        loop {
            let first = self.slots.random();
            if let Some(slot) = self.slots.take(&mut self.conn, first, self.within).await? {
                self.held = Some(slot);
                return Ok(());
            }
            if self.slots.keys.len() == 1 {
                let statement = self.slots.wait_lock.clone();
                let key = self.slots.keys[0];
                if self.block_on(&statement, key).await? {
                    self.held = Some(key);
                    return Ok(());
                }
                continue;
            }
            let enter = "SELECT 1 FROM (SELECT pg_advisory_lock($1) FROM \
                 (SELECT set_config('lock_timeout', $2, false) OFFSET 0) s OFFSET 0) l";
            let room = self.slots.room;
            if !self.block_on(enter, room).await? {
                continue;
            }
            let granted = self.first_in_line().await;
            sqlx::query("SELECT pg_advisory_unlock($1)")
                .bind(room)
                .execute(&mut self.conn)
                .await
                .map_err(failed)?;
            if granted? {
                return Ok(());
            }
        }
    }

    async fn unlock(&mut self) -> Result<()> {
        let slot = held_slot(&mut self.held, BACKEND)?;
        self.slots.release(&mut self.conn, slot, self.within).await
    }
}
