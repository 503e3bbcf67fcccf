//! What a semaphore's and a reader's statements found on the server: the slot and token of a
//! permit, a share's token, and a name in use with another limit (which `pg_locks` tells).

use dlock_api::raw::{DriverError, permits_mismatch};
use dlock_api::{LockError, LockName};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::{MAX_PERMITS, PgDriver, failure};
use crate::error::{LOCK_NOT_AVAILABLE, sqlstate};
use crate::key::{RawKey, limit_key, slot_key};
use crate::sql;

impl PgDriver {
    /// The outcome of a reader's statement (`(status, token)`): the token of a share taken, or
    /// `None` when busy; a name held by a semaphore's permits is a mismatch (`pg_locks` says
    /// which; a lock, or permits gone meanwhile, is busy).
    pub(super) async fn read_granted(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        k: i64,
        row: &sqlx::postgres::PgRow,
    ) -> std::result::Result<Option<u64>, DriverError> {
        let status: i32 = row.try_get(0).map_err(failure)?;
        let drawn: Option<i64> = row.try_get(1).map_err(failure)?;
        if let Some(drawn) = drawn {
            // An error here leaves the share held: the pool undoes it.
            return self.settle(conn, drawn).await.map(Some);
        }
        if status == sql::PERMIT_MISMATCH {
            if let Some(in_use) = self.in_use(conn, k).await? {
                if in_use != 1 {
                    return Err(DriverError::statement(permits_mismatch(name, 1, in_use)));
                }
            }
        }
        Ok(None)
    }

    /// One permit attempt, trying the slots from `first` on; see [`sql::try_permit_query`].
    pub(super) async fn try_permit_from(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        permits: u32,
        first: u32,
    ) -> std::result::Result<Option<(u64, u32)>, DriverError> {
        let k = int_key(key)?;
        let keys = self.derived.of(k, permits);
        let slots = keys.slots_from(first);
        let gated = keys.gated();
        let row =
            match sql::try_permit_query(&self.sql, k, gated, slots.clone(), &self.gate_timeout)
                .fetch_one(&mut *conn)
                .await
            {
                Ok(row) => row,
                // The gate stayed taken for the whole timeout (the statement's only wait, and its
                // first lock: nothing was taken): busy.
                Err(e) if sqlstate(&e).as_deref() == Some(LOCK_NOT_AVAILABLE) => return Ok(None),
                Err(e) => return Err(failure(e)),
            };
        let status: i32 = row.try_get(0).map_err(failure)?;
        let slot: Option<i64> = row.try_get(1).map_err(failure)?;
        let drawn: Option<i64> = row.try_get(2).map_err(failure)?;
        if let (Some(slot), Some(drawn)) = (slot, drawn) {
            let index = slots
                .iter()
                .position(|s| *s == slot)
                .and_then(|at| u32::try_from(at).ok())
                .map(|at| at.saturating_add(first).checked_rem(permits).unwrap_or(0))
                .ok_or_else(|| {
                    DriverError::statement(LockError::unexpected(
                        crate::BACKEND,
                        "the server granted a slot it was not asked for",
                    ))
                })?;
            // An error here leaves the permit held: the pool undoes it.
            let token = self.settle(conn, drawn).await?;
            return Ok(Some((token, index)));
        }
        if status == sql::PERMIT_MISMATCH {
            return match self.in_use(conn, k).await? {
                Some(in_use) if in_use != permits => Err(DriverError::statement(permits_mismatch(
                    name, permits, in_use,
                ))),
                // Gone meanwhile: busy when asked.
                _ => Ok(None),
            };
        }
        Ok(None)
    }

    /// What the 64-bit key `k` is in use as, as `pg_locks` says now: 1 (a lock), the limit of
    /// its permits, or `None` if nothing holds it.
    pub(super) async fn in_use(
        &self,
        conn: &mut PgConnection,
        k: i64,
    ) -> std::result::Result<Option<u32>, DriverError> {
        let limits = (1..=MAX_PERMITS).map(|n| limit_key(k, n)).collect();
        let row = sql::in_use(k, limits)
            .fetch_one(&mut *conn)
            .await
            .map_err(failure)?;
        let exclusive: bool = row.try_get(0).map_err(failure)?;
        let limit: Option<i64> = row.try_get(1).map_err(failure)?;
        Ok(if exclusive {
            Some(1)
        } else {
            limit.and_then(|n| u32::try_from(n).ok())
        })
    }
}

/// The 64-bit key of a semaphore (names map there; integer pairs have no semaphores).
pub(super) fn int_key(key: &RawKey) -> std::result::Result<i64, DriverError> {
    match key {
        RawKey::Int(k) => Ok(*k),
        RawKey::Pair(..) => Err(DriverError::statement(LockError::Unsupported {
            backend: crate::BACKEND,
            operation: "semaphores on a pair of 32-bit keys",
        })),
    }
}

/// The keys of slots `0..permits` of `k`, from slot `first` round.
pub(crate) fn slot_keys(k: i64, permits: u32, first: u32) -> Vec<i64> {
    (0..permits)
        .map(|i| slot_key(k, i.saturating_add(first).checked_rem(permits).unwrap_or(0)))
        .collect()
}
