//! A set of names' `GET_LOCK`s tried on one connection in one statement.

use std::sync::Arc;

use dlock_api::LockName;
use dlock_api::raw::{DriverError, TriedAll, try_lock_each};
use sqlx::Row;
use sqlx::mysql::MySqlConnection;

use super::{MySqlDriver, failure};
use crate::error::error_number;
use crate::sql::{ER_UNKNOWN_SEQUENCES, Fence, Sql};

impl MySqlDriver {
    /// [`SessionDriver::try_lock_all`](dlock_api::raw::SessionDriver::try_lock_all): every
    /// key's `GET_LOCK(key, 0)` and token in one statement ([`Sql::try_all`]; a connection holds
    /// several user locks since MySQL 5.7 and MariaDB 10.0.2), and when one is busy a second
    /// that releases the ones taken. The counter-row fence writes a row per grant, whose token
    /// only a statement of its own returns: there the keys go one after another on this
    /// connection ([`try_lock_each`]).
    pub(super) async fn try_set(
        &self,
        conn: &mut MySqlConnection,
        names: &[LockName],
        keys: &[Arc<str>],
    ) -> Result<TriedAll, DriverError> {
        let fence = self.fence();
        let Some(statement) = self.sql.try_all(fence, keys.len()) else {
            return try_lock_each(self, conn, names, keys).await;
        };
        let mut query = sqlx::query(&statement);
        for key in keys {
            query = query.bind(&**key);
        }
        let row = match query.fetch_one(&mut *conn).await {
            Ok(row) => row,
            // The sequence is opened before any `GET_LOCK` runs: nothing is taken, and a
            // single attempt creates it.
            Err(e) if error_number(&e) == Some(ER_UNKNOWN_SEQUENCES) => {
                return Ok(TriedAll::OneByOne);
            }
            Err(e) => return Err(failure(e)),
        };
        let mut taken = Vec::with_capacity(keys.len());
        let mut tokens = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let value: Option<i64> = row.try_get(i).map_err(failure)?;
            let token = match (fence, value) {
                (_, None) | (Fence::Off, Some(0)) => None,
                (Fence::Off, Some(_)) => Some(0),
                (_, Some(token)) => Some(token.unsigned_abs()),
            };
            if let Some(token) = token {
                taken.push(key);
                tokens.push(token);
            }
        }
        if tokens.len() == keys.len() {
            return Ok(TriedAll::Granted(tokens));
        }
        if !taken.is_empty() {
            let statement = Sql::release_all(taken.len());
            let mut query = sqlx::query(&statement);
            for key in taken {
                query = query.bind(&**key);
            }
            query.fetch_one(&mut *conn).await.map_err(failure)?;
        }
        Ok(TriedAll::Busy)
    }
}
