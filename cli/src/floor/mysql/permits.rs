//! A semaphore's floors on MySQL and MariaDB, with sqlx alone: one of N slot locks, taken by one
//! statement whose `CASE` tries each slot's `GET_LOCK(slot, 0)` from a random one round and draws
//! the token in the branch that granted (MariaDB's sequence; on MySQL a counter row, in a
//! statement of its own after the grant), and let go with `RELEASE_LOCK(slot)`. Waiters line
//! up for the semaphore's room (a blocking `GET_LOCK`), and the first in line tries every slot
//! with one more branch that blocks on its first slot for 5 ms, again until granted, as dlock's
//! does. One permit is a lock, whose wait blocks until granted.

use std::time::Duration;

use dlock_api::{LockError, Result};
use sqlx::mysql::MySqlConnection;
use tokio::time::timeout;

use super::{BACKEND, CounterKind, FencedAcquire, NOW_MICROS, failed, timed_out};
use crate::contend::Contender;
use crate::floor::held_slot;

/// How long the first waiter in line blocks on its one slot before it tries them all again,
/// as dlock's.
const SLOT_WAIT_SECS: f64 = 0.005;

/// How long a lock's waiter blocks (dlock's waits go in 30 s pieces; one is plenty here).
const LOCK_WAIT_SECS: f64 = 30.0;

/// The slots of a semaphore of this run and the statements that take them.
pub(super) struct Slots {
    keys: Vec<String>,
    /// The room the waiters line up for.
    room: String,
    /// Parameters: every slot's key, from the first tried round. Its value: the position
    /// granted in that order (on the sequence, the token times 64 plus the position).
    try_all: String,
    /// As `try_all`, then the first slot's key again and a wait in seconds, whose grant is
    /// position 0.
    wait_all: String,
    /// The counter row's statement where the token needs one (MySQL). Parameter: the
    /// semaphore's name.
    token: Option<String>,
}

impl Slots {
    /// `permits` slots of a random name, the tokens drawn from `fenced`'s counter.
    pub(super) fn new(permits: u32, fenced: &FencedAcquire) -> Self {
        let name = format!(
            "dlock-floor-permits/{:016x} {permits}",
            rand::random::<u64>()
        );
        let value = |position: u32| match fenced.counter.kind {
            CounterKind::Sequence => {
                format!("NEXTVAL({}) * 64 + {position}", fenced.counter.quoted)
            }
            CounterKind::Row => position.to_string(),
        };
        let branches: String = (0..permits)
            .map(|i| format!(" WHEN GET_LOCK(?, 0) = 1 THEN {}", value(i)))
            .collect();
        let token = match fenced.counter.kind {
            CounterKind::Sequence => None,
            CounterKind::Row => Some(format!(
                "INSERT INTO {} (name, token) VALUES (?, LAST_INSERT_ID({NOW_MICROS})) \
                 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, {NOW_MICROS}))",
                fenced.counter.quoted
            )),
        };
        Self {
            keys: (0..permits).map(|i| format!("{name}/{i}")).collect(),
            try_all: format!("SELECT CAST(CASE{branches} END AS SIGNED)"),
            wait_all: format!(
                "SELECT CAST(CASE{branches} WHEN GET_LOCK(?, ?) = 1 THEN {} END AS SIGNED)",
                value(0)
            ),
            room: format!("{name}/w"),
            token,
        }
    }

    /// A random slot.
    pub(super) fn random(&self) -> usize {
        rand::random_range(0..self.keys.len().max(1))
    }

    /// One attempt on `conn` from slot `first` round, and with `wait` a wait on that slot:
    /// the slot taken, if any, its token drawn.
    pub(super) async fn take(
        &self,
        conn: &mut MySqlConnection,
        first: usize,
        wait: Option<f64>,
        within: Duration,
    ) -> Result<Option<usize>> {
        let n = self.keys.len();
        let slot_at = |position: usize| first.saturating_add(position).checked_rem(n);
        let statement = if wait.is_some() {
            &self.wait_all
        } else {
            &self.try_all
        };
        let mut query = sqlx::query_scalar::<_, Option<i64>>(statement);
        for position in 0..n {
            query = query.bind(&self.keys[slot_at(position).unwrap_or(0)]);
        }
        if let Some(wait) = wait {
            query = query.bind(&self.keys[slot_at(0).unwrap_or(0)]).bind(wait);
        }
        let within = within.saturating_add(Duration::from_secs_f64(wait.unwrap_or(0.0)));
        let value = timeout(within, query.fetch_one(&mut *conn))
            .await
            .map_err(|_| timed_out(within))?
            .map_err(failed)?;
        let Some(value) = value else {
            return Ok(None);
        };
        // The position is the value's low six bits (the value itself without a sequence).
        let position = usize::try_from(value.unsigned_abs() & 63).unwrap_or(0);
        let slot = slot_at(position).unwrap_or(0);
        if let Some(token) = &self.token {
            let name = self.keys[0].rsplit_once('/').map_or("", |(name, _)| name);
            timeout(within, sqlx::query(token).bind(name).execute(&mut *conn))
                .await
                .map_err(|_| timed_out(within))?
                .map_err(failed)?;
        }
        Ok(Some(slot))
    }

    /// Releases `slot`, which must have been held.
    pub(super) async fn release(
        &self,
        conn: &mut MySqlConnection,
        slot: usize,
        within: Duration,
    ) -> Result<()> {
        let released: Option<i64> = timeout(
            within,
            sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                .bind(&self.keys[slot])
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)?;
        if released != Some(1) {
            return Err(LockError::unexpected(
                BACKEND,
                format!("a floor's slot was not held: RELEASE_LOCK {released:?}"),
            ));
        }
        Ok(())
    }

    /// Takes (`take`) or lets go of the room, which must then be held.
    async fn room(&self, conn: &mut MySqlConnection, take: bool, within: Duration) -> Result<()> {
        let (statement, within) = if take {
            ("SELECT GET_LOCK(?, 3600)", Duration::from_secs(3600))
        } else {
            ("SELECT RELEASE_LOCK(?)", within)
        };
        let done: Option<i64> = timeout(
            within,
            sqlx::query_scalar(statement)
                .bind(&self.room)
                .fetch_one(&mut *conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(failed)?;
        if done != Some(1) {
            return Err(LockError::unexpected(
                BACKEND,
                format!("the floor's room answered {done:?}"),
            ));
        }
        Ok(())
    }
}

/// One connection contending for a slot: all tried, then a wait on a random one, again until
/// granted.
pub(super) struct PermitContender {
    pub(super) conn: MySqlConnection,
    pub(super) slots: std::sync::Arc<Slots>,
    pub(super) held: Option<usize>,
    pub(super) within: Duration,
}

impl Contender for PermitContender {
    async fn lock(&mut self) -> Result<()> {
        let (slots, within) = (self.slots.clone(), self.within);
        if let Some(slot) = slots
            .take(&mut self.conn, slots.random(), None, within)
            .await?
        {
            self.held = Some(slot);
            return Ok(());
        }
        if slots.keys.len() == 1 {
            // One permit is a lock: its wait blocks until granted.
            loop {
                let wait = Some(LOCK_WAIT_SECS);
                if let Some(slot) = slots.take(&mut self.conn, 0, wait, within).await? {
                    self.held = Some(slot);
                    return Ok(());
                }
            }
        }
        slots.room(&mut self.conn, true, within).await?;
        let slot = loop {
            let wait = Some(SLOT_WAIT_SECS);
            if let Some(slot) = slots
                .take(&mut self.conn, slots.random(), wait, within)
                .await?
            {
                break slot;
            }
        };
        slots.room(&mut self.conn, false, within).await?;
        self.held = Some(slot);
        Ok(())
    }

    async fn unlock(&mut self) -> Result<()> {
        let slot = held_slot(&mut self.held, BACKEND)?;
        self.slots.release(&mut self.conn, slot, self.within).await
    }
}
