//! Semaphores on named locks: a permit of `N` is one of `N` slot locks `<key> <N>/<i>`, and
//! waiters line up for the semaphore's room `<key> <N>/w`.
//!
//! `GET_LOCK` has no shared mode, so nothing every holder of a semaphore holds can stand for
//! the name (see the crate docs, *Semaphores*): the number is part of the semaphore's key, and
//! a name's lock and its semaphores of other numbers are other locks on the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{DriverError, Waited, random_below};
use sqlx::Executor;
use sqlx::mysql::MySqlConnection;
use tokio::time::Instant;

use super::{MySqlDriver, failure};
use crate::error::error_number;
use crate::sql::{ER_UNKNOWN_SEQUENCES, Fence, NOW_MICROS};

/// The most permits a semaphore has here: a slot's number fits the six bits a sequence token
/// is shifted by ([`TOKEN_SHIFT`]), and `count_permits` looks at every slot of every number.
pub(crate) const MAX_PERMITS: u32 = 64;

/// The longest suffix a semaphore adds to a name's key: ` 64/63`. Names are mapped to keys
/// this much shorter than a lock's, so that every slot's key and the room's fit the server's
/// 64 characters (with the longest prefix, 34 are left: a digest key's 32 and more).
pub(crate) const SUFFIX_CHARS: usize = 6;

/// How long the first waiter in line blocks on one slot before it tries them all again. The
/// server wakes a waiter only for the slot it waits on, so a release of another slot reaches
/// it within this; the other waiters block in the room's queue and send nothing.
pub(crate) const SLOT_WAIT: Duration = Duration::from_millis(5);

/// The room's suffix (`<key> <N>/w`, where the waiters wait): no longer than a slot's.
const ROOM: &str = "w";

/// A grant's value on the fencing sequence: its token times 64 plus its slot, so that one
/// `CASE` returns both (tokens are µs since 1970, about 2^51: far from overflowing 2^63).
const TOKEN_SHIFT: u32 = 6;

/// The bits of a sequence value that hold the slot.
const SLOT_MASK: u64 = (1 << TOKEN_SHIFT) - 1;

/// The key of the semaphore of `permits` permits on the lock key `base` (a space never occurs
/// in a lock's key, so no lock's key is a semaphore's): the pool's key, and the counter row's.
pub(crate) fn semaphore_key(base: &str, permits: u32) -> Arc<str> {
    format!("{base} {permits}").into()
}

/// What kind of attempt a statement makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Attempt {
    /// Every slot without waiting.
    Try,
    /// Every slot without waiting, then a wait on the first.
    Wait,
}

/// The permit statements of one client, built once per number of permits.
#[derive(Debug, Default)]
pub(crate) struct PermitSql {
    attempts: Mutex<HashMap<(u32, Attempt, Fence), Arc<str>>>,
    undo: Mutex<HashMap<u32, Arc<str>>>,
}

impl PermitSql {
    /// One statement that tries `permits` slots (each a `?`, in the order bound) without
    /// waiting, and (for [`Attempt::Wait`]) then waits for the first of them (bound again,
    /// then the wait in seconds). Its one value is the position granted in that order (`NULL`:
    /// none; -1: the wait was interrupted); on the fencing sequence, the token drawn in the
    /// branch that granted, shifted left by [`TOKEN_SHIFT`], plus the position. `CASE` stops at
    /// the first branch whose `GET_LOCK` grants, so one slot at most is taken.
    fn attempt(&self, permits: u32, attempt: Attempt, fence: Fence, sequence: &str) -> Arc<str> {
        let mut cache = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry((permits, attempt, fence))
            .or_insert_with(|| {
                let value = |position: u32| match fence {
                    Fence::Sequence => format!("NEXTVAL({sequence}) * 64 + {position}"),
                    Fence::Off | Fence::Row => position.to_string(),
                };
                let mut branches: String = (0..permits)
                    .map(|i| format!(" WHEN GET_LOCK(?, 0) = 1 THEN {}", value(i)))
                    .collect();
                // The wait is on the first slot: position 0. An interrupted `GET_LOCK`
                // (`KILL QUERY`) answers NULL, told apart from a wait that ran out by -1.
                if attempt == Attempt::Wait {
                    branches.push_str(&format!(
                        " ELSE CASE GET_LOCK(?, ?) WHEN 1 THEN {} WHEN 0 THEN NULL ELSE -1 END",
                        value(0)
                    ));
                }
                format!("SELECT CAST(CASE{branches} END AS SIGNED)").into()
            })
            .clone()
    }

    /// `RELEASE_LOCK` of every slot of a semaphore (each a `?`): how many this connection held
    /// (the others are left alone: `RELEASE_LOCK` frees only the caller's); and of its room
    /// (one more `?`).
    fn undo(&self, permits: u32) -> Arc<str> {
        let mut cache = self.undo.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(permits)
            .or_insert_with(|| {
                let each =
                    vec!["COALESCE(RELEASE_LOCK(?), 0)"; usize::try_from(permits).unwrap_or(0)];
                format!(
                    "SELECT CAST({} AS SIGNED), RELEASE_LOCK(?)",
                    each.join(" + ")
                )
                .into()
            })
            .clone()
    }
}

/// The key of slot `slot` of the semaphore `key`.
fn slot_key(key: &str, slot: u32) -> String {
    format!("{key}/{slot}")
}

/// The key of the semaphore `key`'s room, which its waiters line up for.
fn room_key(key: &str) -> String {
    format!("{key}/{ROOM}")
}

/// The permits of a name held now, of every number: each used slot of each semaphore the name
/// can have. Parameter: the name's key (a semaphore's without its number).
pub(crate) const COUNT_PERMITS: &str = "WITH RECURSIVE n (v) AS \
     (SELECT 0 UNION ALL SELECT v + 1 FROM n WHERE v < 63) \
     SELECT CAST(COUNT(*) AS SIGNED) FROM n AS lim JOIN n AS slot ON slot.v <= lim.v \
     WHERE lim.v >= 1 AND IS_USED_LOCK(CONCAT(?, ' ', lim.v + 1, '/', slot.v)) IS NOT NULL";

const ER_NO_SUCH_TABLE: u16 = 1146;

/// What one attempt found.
enum Attempted {
    /// This token, on this slot.
    Granted(u64, u32),
    /// Every slot taken (and the wait, if any, ran out).
    Busy,
    /// The wait was interrupted (`KILL QUERY`): nothing taken.
    Interrupted,
}

impl MySqlDriver {
    /// [`SessionDriver::try_permit`](dlock_api::raw::SessionDriver::try_permit): every slot
    /// of `key` (a [`semaphore_key`]) tried in one statement, from a random one round.
    pub(super) async fn try_permit_now(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        permits: u32,
    ) -> Result<Option<(u64, u32)>, DriverError> {
        Ok(match self.attempt_permit(conn, key, permits, None).await? {
            Attempted::Granted(token, slot) => Some((token, slot)),
            Attempted::Busy | Attempted::Interrupted => None,
        })
    }

    /// [`SessionDriver::wait_permit`](dlock_api::raw::SessionDriver::wait_permit): a try, then
    /// in line for the semaphore's room (`GET_LOCK(room, wait)`: the server's queue, nothing
    /// sent while waiting), and as the first in line, attempts that try every slot and block
    /// on one for [`SLOT_WAIT`], until one is granted or `wait` is over; then out of the room.
    /// Interrupted, or failed, the pool's undo ([`release_permit`](Self::release_permit) with
    /// no slot) lets the room go with any slot.
    pub(super) async fn wait_permit_in_line(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        permits: u32,
        wait: Duration,
    ) -> Result<Waited, DriverError> {
        if let Attempted::Granted(token, slot) =
            self.attempt_permit(conn, key, permits, None).await?
        {
            return Ok(Waited::GrantedSlot(token, slot));
        }
        let mut until = after(Instant::now(), wait);
        let room = room_key(key);
        let entered: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(&room)
            .bind(wait.as_secs_f64())
            .fetch_one(&mut *conn)
            .await
            .map_err(failure)?;
        if entered != Some(1) {
            // 0: the wait ran out; NULL: interrupted. Either way the room is not held.
            return Ok(Waited::NotGranted);
        }
        // Where `GET_LOCK` waits only whole seconds (MySQL), the first in line tries the slots
        // every 5 ms without a wait at the server, for a second at most, so that a cancelled
        // wait (which nothing interrupts between statements) ends soon; then it lines up again.
        let fractional = self.fractional_waits.get().copied().unwrap_or(false);
        if !fractional {
            until = until.min(after(Instant::now(), Duration::from_secs(1)));
        }
        let granted = loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break None;
            }
            let wait = fractional.then(|| left.min(SLOT_WAIT));
            match self.attempt_permit(conn, key, permits, wait).await? {
                Attempted::Granted(token, slot) => break Some((token, slot)),
                Attempted::Busy if !fractional => {
                    tokio::time::sleep(left.min(SLOT_WAIT)).await;
                }
                Attempted::Busy => {}
                Attempted::Interrupted => break None,
            }
        };
        sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&room)
            .execute(&mut *conn)
            .await
            .map_err(failure)?;
        Ok(match granted {
            Some((token, slot)) => Waited::GrantedSlot(token, slot),
            None => Waited::NotGranted,
        })
    }

    /// One attempt at a permit of `key`, from a random slot round, and with `wait` a wait on
    /// that slot.
    async fn attempt_permit(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        permits: u32,
        wait: Option<Duration>,
    ) -> Result<Attempted, DriverError> {
        let fence = self.fence();
        let attempt = if wait.is_some() {
            Attempt::Wait
        } else {
            Attempt::Try
        };
        let statement = self
            .permit_sql
            .attempt(permits, attempt, fence, self.sql.sequence());
        let first = random_below(permits);
        let slot_at = |position: u32| {
            first
                .saturating_add(position.checked_rem(permits).unwrap_or(0))
                .checked_rem(permits)
                .unwrap_or(0)
        };
        let keys: Vec<String> = (0..permits).map(|i| slot_key(key, slot_at(i))).collect();
        let run = async |conn: &mut MySqlConnection| {
            let mut query = sqlx::query_scalar::<_, Option<i64>>(&statement);
            for slot in &keys {
                query = query.bind(slot);
            }
            if let Some(wait) = wait {
                query = query.bind(&keys[0]).bind(wait.as_secs_f64());
            }
            query.fetch_one(conn).await
        };
        let value = match run(&mut *conn).await {
            // The sequence is opened before any `GET_LOCK` runs, so nothing is taken: create
            // it, as a lock's acquire does, and try again.
            Err(e)
                if self.config.create_table && error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) =>
            {
                let now = sqlx::query_scalar::<_, u64>(&format!("SELECT {NOW_MICROS}"))
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failure)?;
                crate::sql::raise_sequence(conn, &self.sql, now, true)
                    .await
                    .map_err(failure)?;
                run(&mut *conn).await.map_err(failure)?
            }
            other => other.map_err(failure)?,
        };
        let value = match value {
            None => return Ok(Attempted::Busy),
            Some(value) if value < 0 => return Ok(Attempted::Interrupted),
            Some(value) => value.unsigned_abs(),
        };
        let (token, position) = match fence {
            Fence::Off => (0, value),
            Fence::Sequence => (
                value.checked_shr(TOKEN_SHIFT).unwrap_or(0),
                value & SLOT_MASK,
            ),
            // A counter row's token comes back only from a statement of its own; if it fails,
            // the pool undoes the slot (`unlock_permit(.., None)`).
            Fence::Row => (self.permit_token(conn, key).await?, value),
        };
        Ok(Attempted::Granted(
            token,
            slot_at(u32::try_from(position).unwrap_or(0)),
        ))
    }

    /// The next token of the semaphore `key`'s counter row, as a lock's acquire draws its
    /// own: `max(previous + 1, server clock in µs)`.
    async fn permit_token(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
    ) -> Result<u64, DriverError> {
        let draw = || sqlx::query(self.sql.next_token()).bind(key);
        let done = match draw().execute(&mut *conn).await {
            Err(e) if self.config.create_table && error_number(&e) == Some(ER_NO_SUCH_TABLE) => {
                conn.execute(sqlx::raw_sql(self.sql.create_table()))
                    .await
                    .map_err(failure)?;
                draw().execute(&mut *conn).await.map_err(failure)?
            }
            other => other.map_err(failure)?,
        };
        Ok(done.last_insert_id())
    }

    /// Releases slot `slot` of `key` if this connection holds it; with `None`, every slot of
    /// `key` this connection holds and its room (what a failed or cut-short attempt may have
    /// left).
    pub(super) async fn release_permit(
        &self,
        conn: &mut MySqlConnection,
        key: &str,
        permits: u32,
        slot: Option<u32>,
    ) -> Result<bool, DriverError> {
        let released: Option<i64> = match slot {
            Some(slot) => sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                .bind(slot_key(key, slot))
                .fetch_one(&mut *conn)
                .await
                .map_err(failure)?,
            None => {
                let statement = self.permit_sql.undo(permits);
                let mut query = sqlx::query_as::<_, (Option<i64>, Option<i64>)>(&statement);
                for i in 0..permits {
                    query = query.bind(slot_key(key, i));
                }
                query
                    .bind(room_key(key))
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failure)?
                    .0
            }
        };
        Ok(released.is_some_and(|n| n > 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_tries_every_slot_bound_and_a_wait_blocks_on_the_first() {
        let sql = PermitSql::default();
        let s = sql.attempt(2, Attempt::Try, Fence::Off, "`s`");
        assert_eq!(
            &*s,
            "SELECT CAST(CASE WHEN GET_LOCK(?, 0) = 1 THEN 0 WHEN GET_LOCK(?, 0) = 1 THEN 1 \
             END AS SIGNED)"
        );
        let waits = sql.attempt(2, Attempt::Wait, Fence::Sequence, "`s`");
        assert!(
            waits.ends_with(
            "THEN NEXTVAL(`s`) * 64 + 1 ELSE CASE GET_LOCK(?, ?) WHEN 1 THEN NEXTVAL(`s`) * 64 + 0 \
             WHEN 0 THEN NULL ELSE -1 END END AS SIGNED)"
            ),
            "{waits}"
        );
    }

    #[test]
    fn a_sequence_value_holds_the_token_and_the_slot() {
        let token = 1_733_000_000_000_000u64;
        let value = token.checked_shl(TOKEN_SHIFT).unwrap() | 63;
        assert_eq!(
            (value.checked_shr(TOKEN_SHIFT).unwrap(), value & SLOT_MASK),
            (token, 63)
        );
        assert!(value < i64::MAX.unsigned_abs());
    }

    #[test]
    fn slot_keys_fit_the_server_and_never_meet_a_lock_key() {
        let key = semaphore_key("k", MAX_PERMITS);
        let last = slot_key(&key, MAX_PERMITS.saturating_sub(1));
        assert_eq!(last.len(), SUFFIX_CHARS.saturating_add(1));
        assert!(room_key(&key).len() <= last.len());
        assert!(semaphore_key("backups", 3).contains(' '));
    }
}
