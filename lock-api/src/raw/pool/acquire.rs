//! The acquire paths over a pool: one attempt on a shared connection, and the server-side wait
//! on a connection of its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout, timeout_at};

use super::attempt::Attempt;
use super::core::{Conn, Hold, PoolCore};
use super::driver::{SessionDriver, Waited};
use super::lease::PoolLease;
use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::options::LockOptions;
use crate::raw::Claim;
use crate::raw::detach::Detach;
use crate::raw::engine::Grant;
use crate::raw::lease::RenewedBy;
use crate::raw::pending::PendingAcquire;
use crate::raw::recovery::WaitRecovery;
use crate::raw::state::LeaseState;
use crate::raw::time::after;
use crate::status::LostReason;
use crate::token::FencingToken;

/// Waits shorter than this are not worth a server round trip.
const SHORTEST_WAIT: Duration = Duration::from_millis(1);

/// The grant of `key` on `conn` (what `hold` says): the connection is the lease, nothing to
/// renew.
pub(super) fn granted<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    conn: Conn<D>,
    name: LockName,
    key: D::Key,
    token: u64,
    hold: Hold,
    record: Option<Arc<[u8]>>,
) -> Grant {
    let state = Arc::new(LeaseState::on_session(None, conn.guards.clone()));
    let lease = PoolLease::new(core.clone(), conn, key, hold, name.clone(), state.clone());
    let lease = Arc::new(match record {
        Some(value) => lease.with_record(token, value),
        None => lease,
    });
    Grant::new(
        name,
        FencingToken::new(token),
        lease,
        state,
        RenewedBy::Session,
    )
}

/// One non-blocking attempt on a shared connection for `claim`; `Ok(None)` when busy.
pub(super) async fn try_grant<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    name: &LockName,
    key: &D::Key,
    claim: Claim,
    patient: bool,
) -> Result<Option<Grant>> {
    // A connection reused from the idle set may have died unnoticed (server restart): a
    // connection error there is retried once on another. Safe, because a lock taken on a
    // connection that then broke dies with that connection.
    let mut retried = false;
    loop {
        let Some((conn, fresh)) = core.pick_shared(name, key, claim, patient).await? else {
            return Ok(None);
        };
        let result = Detach::new(try_on(
            core.clone(),
            conn.clone(),
            name.clone(),
            key.clone(),
            claim,
        ))
        .await;
        match result {
            Err(error) if !retried && !fresh && conn.is_dead() => {
                tracing::debug!(%error, "dlock: a pooled connection was dead; retrying on another");
                retried = true;
            }
            result => return result,
        }
    }
}

/// An attempt on `conn`, where `key` is reserved. Runs to completion even if the caller is gone
/// (in a `Detach`): then the grant it returns is dropped, which releases the lock.
async fn try_on<D: SessionDriver>(
    core: Arc<PoolCore<D>>,
    conn: Conn<D>,
    name: LockName,
    key: D::Key,
    claim: Claim,
) -> Result<Option<Grant>> {
    let limit = core.config.command_timeout;
    let mut guard = conn.conn.lock().await;
    let reply = match core.conn_mut(&mut guard) {
        Ok(c) => {
            let outcome = timeout(limit, core.try_on_conn(c, &name, &key, claim)).await;
            core.settle(&conn, &mut guard, limit, outcome)
        }
        Err(closed) => Err(closed),
    };
    match reply {
        Ok(Some((token, slot))) => {
            drop(guard);
            if !core.attempt_done(&conn, &key, true) {
                return Err(core.unavailable("the connection closed right after the grant"));
            }
            let hold = Hold::granted(claim, slot);
            Ok(Some(granted(&core, conn, name, key, token, hold, None)))
        }
        Ok(None) => {
            drop(guard);
            core.attempt_done(&conn, &key, false);
            Ok(None)
        }
        Err(failure) => {
            if !failure.broken {
                // The statement may have taken the lock before it failed (a fencing counter
                // refused, say).
                core.undo(&conn, &mut guard, &key, claim).await;
            }
            drop(guard);
            core.attempt_done(&conn, &key, false);
            Err(failure.error)
        }
    }
}

/// Waits for `key` (as `claim` asks) until `deadline`: one attempt on a shared connection,
/// then this client's waiters for the name queue in the client and one at a time waits at the
/// server, on a connection of its own (polling with back-off only while every connection is
/// busy). Readers next to each other in the client's line wait at the server together, each
/// on a connection of its own, since the server lets in together only the readers in its
/// queue.
pub(super) async fn wait_grant<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    name: &LockName,
    key: &D::Key,
    claim: Claim,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Option<Grant>> {
    let holds = || core.registry().full(key, claim);
    if !holds() {
        if let Some(grant) = try_grant(core, name, key, claim, false).await? {
            return Ok(Some(grant));
        }
    }
    let turn = if claim.shared {
        core.waiters.shared_turn(name, deadline).await
    } else {
        core.waiters.turn(name, deadline).await
    };
    let Some(_turn) = turn else {
        return Ok(None);
    };
    let retry = options.retry();
    let mut polls = 0u32;
    let mut next_poll = after(Instant::now(), retry.delay(0));
    // A wait whose connection is killed waits again on a new one (only a server that stays
    // unreachable for the connect timeout ends it).
    let mut recovery = WaitRecovery::new(core.config.connect_timeout);
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        let wake_at = deadline.map_or(next_poll, |d| d.min(next_poll));
        let conn = match core.take_waiting(wake_at).await {
            Ok(Some(conn)) => conn,
            Ok(None) => {
                // Every connection holds locks or waits: poll on a shared one until one frees up.
                if Instant::now() >= next_poll {
                    if !holds() {
                        if let Some(grant) = try_grant(core, name, key, claim, false).await? {
                            return Ok(Some(grant));
                        }
                    }
                    polls = polls.saturating_add(1);
                    next_poll = after(Instant::now(), retry.delay(polls));
                }
                continue;
            }
            Err(error) => {
                recovery.pause_or_give_up(error, retry, deadline).await?;
                continue;
            }
        };
        let chunk = core.config.wait_chunk;
        let wait = deadline
            .map_or(chunk, |d| d.saturating_duration_since(Instant::now()))
            .min(chunk);
        if wait < SHORTEST_WAIT {
            core.wait_done(&conn, None);
            return Ok(None);
        }
        let waited_on = conn.clone();
        let attempt = Arc::new(Attempt::default());
        let pending = {
            let (attempt, core, target) = (attempt.clone(), core.clone(), conn.server_id);
            PendingAcquire::arm(move || attempt.cancel(&core, target))
        };
        let task = Detach::new(wait_on(
            core.clone(),
            conn,
            (name.clone(), key.clone()),
            (claim, options.campaign_value().map(Arc::from)),
            wait,
            attempt,
        ));
        let result = match deadline {
            // The server ends its wait on time (or rounds it); either way the client gives up
            // shortly after the deadline and interrupts the server's wait.
            Some(deadline) => match timeout_at(after(deadline, core.config.wait_slack), task).await
            {
                Ok(result) => result,
                Err(_) => {
                    drop(pending);
                    return Ok(None);
                }
            },
            None => task.await,
        };
        pending.disarm();
        match result {
            Ok(Some(grant)) => return Ok(Some(grant)),
            Ok(None) => recovery.reached_server(),
            // A candidate whose waiting session ended never waits again on another: told it
            // leads on a session it did not wait on, it could be a second leader
            // (etcd-io/etcd #19597). Its campaign fails, and its caller decides whether to
            // stand again; a lock's waiter waits again.
            Err(_) if options.is_campaign() && waited_on.is_dead() => {
                return Err(LockError::Lost {
                    name: name.to_string(),
                    reason: LostReason::SessionExpired,
                });
            }
            Err(error) => recovery.pause_or_give_up(error, retry, deadline).await?,
        }
    }
}

/// One server-side wait on `conn`, lent to it; in a task of its own. A candidate's wait
/// (`leading`: the value it publishes) may write the leader's record with its grant, and is
/// undone with it.
async fn wait_on<D: SessionDriver>(
    core: Arc<PoolCore<D>>,
    conn: Conn<D>,
    (name, key): (LockName, D::Key),
    (claim, leading): (Claim, Option<Arc<[u8]>>),
    wait: Duration,
    attempt: Arc<Attempt>,
) -> Result<Option<Grant>> {
    let undone = Hold {
        leader: leading.is_some(),
        ..Hold::any(claim)
    };
    let command_timeout = core.config.command_timeout;
    let limit = wait.saturating_add(command_timeout);
    let mut guard = conn.conn.lock().await;
    if !attempt.start() {
        drop(guard);
        core.wait_done(&conn, None);
        return Ok(None);
    }
    let outcome = match core.conn_mut(&mut guard) {
        Ok(c) => {
            let waiting = core.wait_on_conn(c, (&name, &key), claim, wait, leading.as_deref());
            Ok(timeout(limit, waiting).await)
        }
        Err(closed) => Err(closed),
    };
    let (cancelled, interrupting) = attempt.finish();
    let reply = outcome.and_then(|outcome| core.settle(&conn, &mut guard, limit, outcome));
    if interrupting
        && !attempt
            .wait_interrupts_finished(command_timeout.saturating_mul(3))
            .await
    {
        // An interrupt may still arrive: this connection cannot be trusted with another
        // statement. Closing it frees whatever it holds.
        core.close(
            &conn,
            &mut guard,
            "a cancelled wait could not be interrupted",
        );
    }
    let reply = reply.map(|(waited, wrote)| match waited {
        Waited::Granted(token) => Ok((token, None, wrote)),
        Waited::GrantedSlot(token, slot) => Ok((token, Some(slot), false)),
        not_granted => Err(not_granted),
    });
    match reply {
        Ok(Ok((token, slot, wrote))) if !cancelled && !conn.is_dead() => {
            drop(guard);
            if !core.wait_done(&conn, Some((&key, claim))) {
                return Err(core.unavailable("the connection closed right after the grant"));
            }
            let hold = Hold::granted(claim, slot);
            let record = leading.filter(|_| wrote);
            Ok(Some(granted(&core, conn, name, key, token, hold, record)))
        }
        Ok(Err(Waited::NotGranted)) => {
            drop(guard);
            core.wait_done(&conn, None);
            Ok(None)
        }
        Ok(_) => {
            // Granted to nobody who wants it, or maybe granted as the wait failed.
            core.undo_hold(&conn, &mut guard, &key, undone).await;
            drop(guard);
            core.wait_done(&conn, None);
            Ok(None)
        }
        Err(failure) => {
            if !failure.broken {
                // The lock may have been granted before the statement failed.
                core.undo_hold(&conn, &mut guard, &key, undone).await;
            }
            drop(guard);
            core.wait_done(&conn, None);
            if cancelled {
                Ok(None)
            } else {
                Err(failure.error)
            }
        }
    }
}
