//! A set of locks tried together on one pooled connection, in the driver's one attempt
//! ([`SessionDriver::try_lock_all`]): every member a lock of its own on that connection, as a
//! single attempt's grant is, or none.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::time::timeout;

use super::acquire::granted;
use super::core::{Conn, Hold, PoolCore};
use super::driver::{DriverError, SessionDriver, TriedAll};
use super::registry::SetPick;
use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::raw::Claim;
use crate::raw::GrantedAtOnce;
use crate::raw::detach::Detach;

/// The most names one attempt takes; a larger set goes one by one. Each member holds a lock
/// in the server's shared lock table on one session (Postgres sizes it for
/// `max_locks_per_transaction`, 64 by default, per connection).
const MOST_AT_ONCE: usize = 64;

/// Every key of `keys` (of `names`, the same order) on one connection, or none: see
/// [`SessionPool::try_grant_all`](super::SessionPool::try_grant_all).
pub(super) async fn try_grant_all<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    names: &[LockName],
    keys: &[D::Key],
) -> Result<GrantedAtOnce> {
    // Two names on one key (a server that folds case, say) would stack the key on one
    // connection: the single path keeps them apart.
    let distinct: HashSet<&D::Key> = keys.iter().collect();
    if names.len() > MOST_AT_ONCE || names.len() != keys.len() || distinct.len() != keys.len() {
        return Ok(GrantedAtOnce::OneByOne);
    }
    // As a single attempt: a connection reused from the idle set may have died unnoticed.
    let mut retried = false;
    loop {
        let (conn, fresh) = match pick_all(core, keys).await? {
            Picked::Conn(conn, fresh) => (conn, fresh),
            Picked::Answer(answer) => return Ok(answer),
        };
        let result = Detach::new(try_all_on(
            core.clone(),
            conn.clone(),
            names.to_vec(),
            keys.to_vec(),
        ))
        .await;
        match result {
            Err(error) if !retried && !fresh && conn.is_dead() => {
                tracing::debug!(%error, "dlock: a pooled connection was dead; retrying the set on another");
                retried = true;
            }
            result => return result,
        }
    }
}

/// The connection a set's attempt runs on (with every key reserved there, and whether it is
/// new), or the answer without the server.
enum Picked<D: SessionDriver> {
    Conn(Conn<D>, bool),
    Answer(GrantedAtOnce),
}

async fn pick_all<D: SessionDriver>(core: &Arc<PoolCore<D>>, keys: &[D::Key]) -> Result<Picked<D>> {
    let max = core.config.max_connections;
    let pick = core.registry().pick_all(keys, Claim::LOCK, max);
    Ok(match pick {
        SetPick::Busy => Picked::Answer(GrantedAtOnce::Busy),
        SetPick::OneByOne => Picked::Answer(GrantedAtOnce::OneByOne),
        SetPick::Use(conn) => Picked::Conn(conn, false),
        SetPick::Open => {
            let conn = core.open_counted(false).await?;
            if core.adopt_for_all(&conn, keys) {
                Picked::Conn(conn, true)
            } else {
                // Someone of ours started on a key while it opened: the key's own attempt
                // decides.
                Picked::Answer(GrantedAtOnce::OneByOne)
            }
        }
    })
}

/// The attempt on `conn`, where every key is reserved. Runs to completion even if the caller
/// is gone (in a `Detach`): then the grants it returns are dropped, which releases each lock.
async fn try_all_on<D: SessionDriver>(
    core: Arc<PoolCore<D>>,
    conn: Conn<D>,
    names: Vec<LockName>,
    keys: Vec<D::Key>,
) -> Result<GrantedAtOnce> {
    let limit = core.config.command_timeout;
    let mut guard = conn.conn.lock().await;
    let reply = match core.conn_mut(&mut guard) {
        Ok(c) => {
            let outcome = timeout(limit, core.driver.try_lock_all(c, &names, &keys)).await;
            core.settle(&conn, &mut guard, limit, outcome)
        }
        Err(closed) => Err(closed),
    };
    let reply = match reply {
        Ok(TriedAll::Granted(tokens)) if tokens.len() != keys.len() => {
            Err(DriverError::statement(LockError::unexpected(
                core.driver.backend(),
                format!("{} tokens for a set of {}", tokens.len(), keys.len()),
            )))
        }
        reply => reply,
    };
    match reply {
        Ok(TriedAll::Granted(tokens)) => {
            drop(guard);
            let mut alive = true;
            for key in &keys {
                alive &= core.attempt_done(&conn, key, true);
            }
            if !alive {
                return Err(core.unavailable("the connection closed right after the grant"));
            }
            let hold = Hold::granted(Claim::LOCK, None);
            let grants = names
                .into_iter()
                .zip(keys)
                .zip(tokens)
                .map(|((name, key), token)| {
                    granted(&core, conn.clone(), name, key, token, hold, None)
                })
                .collect();
            Ok(GrantedAtOnce::Taken(grants))
        }
        Ok(answer) => {
            drop(guard);
            for key in &keys {
                core.attempt_done(&conn, key, false);
            }
            Ok(match answer {
                TriedAll::Busy => GrantedAtOnce::Busy,
                _ => GrantedAtOnce::OneByOne,
            })
        }
        Err(failure) => {
            if !failure.broken {
                // The statement may have taken some keys before it failed; the connection held
                // none of them before, so each unlock undoes only this attempt's.
                for key in &keys {
                    core.undo(&conn, &mut guard, key, Claim::LOCK).await;
                }
            }
            drop(guard);
            for key in &keys {
                core.attempt_done(&conn, key, false);
            }
            Err(failure.error)
        }
    }
}
