//! A set of names' advisory locks tried on one session in one statement.

use dlock_api::raw::{DriverError, TriedAll};
use sqlx::Row;
use sqlx::postgres::PgConnection;

use super::{PgDriver, failure};
use crate::key::RawKey;
use crate::sql;

impl PgDriver {
    /// [`SessionDriver::try_lock_all`](dlock_api::raw::SessionDriver::try_lock_all) in one
    /// round trip ([`sql::try_all_query`]), plus the fence's renewal of a token drawn outside
    /// its window, as a single attempt's. Names map to 64-bit keys; a set with a key pair (which
    /// no name maps to) goes one by one.
    pub(super) async fn try_set(
        &self,
        conn: &mut PgConnection,
        keys: &[RawKey],
    ) -> Result<TriedAll, DriverError> {
        let ints: Option<Vec<i64>> = keys
            .iter()
            .map(|key| match key {
                RawKey::Int(k) => Some(*k),
                RawKey::Pair(..) => None,
            })
            .collect();
        let Some(ints) = ints else {
            return Ok(TriedAll::OneByOne);
        };
        let row = sql::try_all_query(&self.sql, ints)
            .fetch_one(&mut *conn)
            .await
            .map_err(failure)?;
        let drawn: Option<Vec<i64>> = row.try_get(0).map_err(failure)?;
        let Some(drawn) = drawn else {
            let shared: Option<bool> = row.try_get(2).map_err(failure)?;
            return Ok(if shared == Some(true) {
                TriedAll::OneByOne
            } else {
                TriedAll::Busy
            });
        };
        let mut tokens = Vec::with_capacity(drawn.len());
        for drawn in drawn {
            tokens.push(self.settle(conn, drawn).await?);
        }
        Ok(TriedAll::Granted(tokens))
    }
}
