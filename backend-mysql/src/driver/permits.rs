//! Semaphores on named locks: a permit of `N` is one of `N` slot locks `<key> <N>/<i>`.
//!
//! `GET_LOCK` has no shared mode, so nothing every holder of a semaphore holds can stand for
//! the name (see the crate docs, *Semaphores*): the number is part of the semaphore's key, and
//! a name's lock and its semaphores of other numbers are other locks on the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::{DriverError, random_below};
use sqlx::mysql::MySqlConnection;
use sqlx::{Executor, Row};

use super::{MySqlDriver, failure};
use crate::error::error_number;
use crate::sql::{ER_UNKNOWN_SEQUENCES, Fence, NOW_MICROS};

/// The most permits a semaphore has here: a slot's number fits the six bits a sequence token
/// is shifted by ([`TOKEN_SHIFT`]), and `count_permits` looks at every slot of every number.
pub(crate) const MAX_PERMITS: u32 = 64;

/// The longest suffix a semaphore adds to a name's key: ` 64/63`. Names are mapped to keys
/// this much shorter than a lock's, so that every slot's key fits the server's 64 characters.
pub(crate) const SUFFIX_CHARS: usize = 6;

/// How long a waiter blocks on one slot before it tries them all again. The server wakes a
/// waiter only for the slot it waits on, so a release of another slot reaches it within this.
pub(crate) const SLOT_WAIT: Duration = Duration::from_millis(100);

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
    /// One statement that tries the `permits` slots of a semaphore from a given one round,
    /// without waiting, and (for [`Attempt::Wait`]) then waits for the first of them. Its one
    /// value is the slot granted (`NULL`: none); on the fencing sequence, the token drawn after
    /// the grant shifted left by [`TOKEN_SHIFT`], plus the slot. `CASE` stops at the first
    /// branch whose `GET_LOCK` grants, so one slot at most is taken. Parameters: the
    /// semaphore's key, the first slot and, to wait, the wait in seconds.
    fn attempt(&self, permits: u32, attempt: Attempt, fence: Fence, sequence: &str) -> Arc<str> {
        let mut cache = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry((permits, attempt, fence))
            .or_insert_with(|| {
                let value = |slot: &str| match fence {
                    Fence::Sequence => format!("NEXTVAL({sequence}) * 64 + {slot}"),
                    Fence::Off | Fence::Row => slot.to_owned(),
                };
                let mut branches = String::new();
                for i in 0..permits {
                    let slot = format!("MOD(p.first + {i}, {permits})");
                    branches.push_str(&format!(
                        " WHEN GET_LOCK(CONCAT(p.k, '/', {slot}), 0) = 1 THEN {}",
                        value(&slot)
                    ));
                }
                let params = match attempt {
                    Attempt::Try => "SELECT ? AS k, ? AS first",
                    Attempt::Wait => {
                        branches.push_str(&format!(
                            " WHEN GET_LOCK(CONCAT(p.k, '/', p.first), p.wait) = 1 THEN {}",
                            value("p.first")
                        ));
                        "SELECT ? AS k, ? AS first, ? AS wait"
                    }
                };
                format!("SELECT CAST(CASE{branches} END AS SIGNED) FROM ({params}) AS p").into()
            })
            .clone()
    }

    /// `RELEASE_LOCK` of every slot of a semaphore: how many this connection held (the others
    /// are left alone: `RELEASE_LOCK` frees only the caller's). Parameter: its key.
    fn undo(&self, permits: u32) -> Arc<str> {
        let mut cache = self.undo.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(permits)
            .or_insert_with(|| {
                let each: Vec<_> = (0..permits)
                    .map(|i| format!("COALESCE(RELEASE_LOCK(CONCAT(p.k, '/{i}')), 0)"))
                    .collect();
                format!(
                    "SELECT CAST({} AS SIGNED) FROM (SELECT ? AS k) AS p",
                    each.join(" + ")
                )
                .into()
            })
            .clone()
    }
}

/// The permits of a name held now, of every number: each used slot of each semaphore the name
/// can have. Parameter: the name's key (a semaphore's without its number).
pub(crate) const COUNT_PERMITS: &str = "WITH RECURSIVE n (v) AS \
     (SELECT 0 UNION ALL SELECT v + 1 FROM n WHERE v < 63) \
     SELECT CAST(COUNT(*) AS SIGNED) FROM n AS lim JOIN n AS slot ON slot.v <= lim.v \
     WHERE lim.v >= 1 AND IS_USED_LOCK(CONCAT(?, ' ', lim.v + 1, '/', slot.v)) IS NOT NULL";

const RELEASE_SLOT: &str = "SELECT RELEASE_LOCK(CONCAT(?, '/', ?))";

const ER_NO_SUCH_TABLE: u16 = 1146;

impl MySqlDriver {
    /// One attempt at a permit of `key` (a [`semaphore_key`]), from slot `first` round: the
    /// token and slot, or `None` when every slot is taken (and the wait, if any, ran out).
    pub(super) async fn attempt_permit(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
        permits: u32,
        wait: Option<Duration>,
    ) -> Result<Option<(u64, u32)>, DriverError> {
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
        let value = match run_attempt(conn, &statement, key, first, wait).await {
            // The sequence is opened before any `GET_LOCK` runs, so nothing is taken: create
            // it, as a lock's acquire does, and try again.
            Err(e)
                if self.config.create_table && error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) =>
            {
                let now = sqlx::query(&format!("SELECT {NOW_MICROS}"))
                    .fetch_one(&mut *conn)
                    .await
                    .and_then(|row| row.try_get::<u64, _>(0))
                    .map_err(failure)?;
                crate::sql::raise_sequence(conn, &self.sql, now, true)
                    .await
                    .map_err(failure)?;
                run_attempt(conn, &statement, key, first, wait)
                    .await
                    .map_err(failure)?
            }
            other => other.map_err(failure)?,
        };
        let Some(value) = value.map(i64::unsigned_abs) else {
            return Ok(None);
        };
        match fence {
            Fence::Off => Ok(Some((0, slot_of(value)))),
            Fence::Sequence => Ok(Some((
                value.checked_shr(TOKEN_SHIFT).unwrap_or(0),
                slot_of(value),
            ))),
            // A counter row's token comes back only from a statement of its own; if it fails,
            // the pool undoes the slot (`unlock_permit(.., None)`).
            Fence::Row => Ok(Some((self.permit_token(conn, key).await?, slot_of(value)))),
        }
    }

    /// The next token of the semaphore `key`'s counter row, as a lock's acquire draws its
    /// own: `max(previous + 1, server clock in µs)`.
    async fn permit_token(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
    ) -> Result<u64, DriverError> {
        let draw = || sqlx::query(self.sql.next_token()).bind(&**key);
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

    /// Releases slot `slot` of `key` if this connection holds it, or with `None` every slot of
    /// `key` this connection holds (what a failed attempt may have left).
    pub(super) async fn release_permit(
        &self,
        conn: &mut MySqlConnection,
        key: &Arc<str>,
        permits: u32,
        slot: Option<u32>,
    ) -> Result<bool, DriverError> {
        let released = match slot {
            Some(slot) => sqlx::query(RELEASE_SLOT)
                .bind(&**key)
                .bind(slot)
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.try_get::<Option<i64>, _>(0))
                .map_err(failure)?,
            None => sqlx::query(&self.permit_sql.undo(permits))
                .bind(&**key)
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.try_get::<Option<i64>, _>(0))
                .map_err(failure)?,
        };
        Ok(released.is_some_and(|n| n > 0))
    }
}

/// Runs an attempt's `statement`: its one value.
async fn run_attempt(
    conn: &mut MySqlConnection,
    statement: &str,
    key: &str,
    first: u32,
    wait: Option<Duration>,
) -> sqlx::Result<Option<i64>> {
    let mut query = sqlx::query(statement).bind(key).bind(first);
    if let Some(wait) = wait {
        query = query.bind(wait.as_secs_f64());
    }
    query.fetch_one(conn).await?.try_get(0)
}

/// The slot of an attempt's value (on the sequence, its low six bits; else the value itself).
fn slot_of(value: u64) -> u32 {
    u32::try_from(value & SLOT_MASK).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_try_statement_tries_every_slot_from_the_first_round() {
        let sql = PermitSql::default();
        let s = sql.attempt(3, Attempt::Try, Fence::Off, "`s`");
        assert_eq!(
            &*s,
            "SELECT CAST(CASE \
             WHEN GET_LOCK(CONCAT(p.k, '/', MOD(p.first + 0, 3)), 0) = 1 THEN MOD(p.first + 0, 3) \
             WHEN GET_LOCK(CONCAT(p.k, '/', MOD(p.first + 1, 3)), 0) = 1 THEN MOD(p.first + 1, 3) \
             WHEN GET_LOCK(CONCAT(p.k, '/', MOD(p.first + 2, 3)), 0) = 1 THEN MOD(p.first + 2, 3) \
             END AS SIGNED) FROM (SELECT ? AS k, ? AS first) AS p"
        );
        let waits = sql.attempt(2, Attempt::Wait, Fence::Sequence, "`s`");
        assert!(waits.ends_with(
            "WHEN GET_LOCK(CONCAT(p.k, '/', p.first), p.wait) = 1 THEN NEXTVAL(`s`) * 64 + p.first \
             END AS SIGNED) FROM (SELECT ? AS k, ? AS first, ? AS wait) AS p"
        ));
    }

    #[test]
    fn a_sequence_value_holds_the_token_and_the_slot() {
        let token = 1_733_000_000_000_000u64;
        let value = token.checked_shl(TOKEN_SHIFT).unwrap() | 63;
        assert_eq!(
            (value.checked_shr(TOKEN_SHIFT).unwrap(), slot_of(value)),
            (token, 63)
        );
        assert!(value < i64::MAX.unsigned_abs());
    }

    #[test]
    fn slot_keys_fit_the_server_and_never_meet_a_lock_key() {
        let last = MAX_PERMITS.saturating_sub(1);
        let longest = format!("{}/{last}", semaphore_key("k", MAX_PERMITS));
        assert_eq!(longest.len(), SUFFIX_CHARS.saturating_add(1));
        assert!(semaphore_key("backups", 3).contains(' '));
    }
}
