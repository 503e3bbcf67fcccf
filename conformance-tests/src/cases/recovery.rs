//! Recovery: when a lease, session or connection ends, the same client goes on by itself. Its
//! next acquire opens a new one within the connect timeout, its old guards stay lost and are
//! never revived by the new session, and a waiter in flight, which held nothing, waits on
//! within its own wait rather than failing.

use std::time::Duration;

use dlock_api::{Fencing, LockError, LockGuard, LockOptions, LockStatus};
use tokio::task::JoinHandle;

use super::faults::{acquire_riding_out, own_server, restart};
use super::lost::killable_hold;
use crate::wait_for::spawned_acquire;
use crate::{CaseResult, Ctx, Failure, ensure};

/// **A waiter rides out a server restart** (Curator's `TestInterProcessMutexBase` test of a
/// process waiting through a killed and restarted server, ported): client A holds a lock and
/// client B waits for it; the server of the case's own stops and starts again: cleanly, after a
/// crash (`SIGKILL`), and after a crash that kept it down until A's lease or session ran out on
/// the client (B's own ran out with it). B ends up holding the lock within its one wait: A's
/// guard is either lost (the restart ended its lease or session) or kept and then released by
/// the case. B never fails, with `Lost` least of all: it held nothing (etcd once failed such a
/// waiter with "the session holding the lock expired"). Only a crash may outlast B's connect
/// timeout (the longest outage, or a cluster whose crashed node takes a while to serve its
/// slots again), and then B answers `Unavailable` and its client locks again. Where the
/// backend keeps a counter, B's token is above A's.
pub async fn waiter_rides_out_a_server_restart(ctx: Ctx) -> CaseResult {
    let own = own_server(&ctx).await?;
    let timing = ctx.timing();
    let name = ctx.name("lock");
    let (a, b) = (own.harness.client().await?, own.harness.client().await?);
    let hold = killable_hold(&ctx, &*a);
    let caps = a.capabilities();
    let fenced = caps.fencing != Fencing::None;
    let ttl = timing.short_ttl.max(caps.min_ttl.unwrap_or_default());
    let mut last = 0;
    for outage in [Outage::Clean, Outage::Crash, Outage::PastTheHold] {
        let guard = acquire_riding_out(&ctx, &*a, &name, &hold).await?;
        let held_token = guard.fencing_token().get();
        let waiter = spawned_acquire(timing.bound, &b, &name);
        ctx.until_queued(&*a, &name).await?;
        if outage == Outage::PastTheHold {
            own.process.kill();
            ctx.within("the holder lost while the server is down", guard.lost())
                .await?;
        }
        restart(&own, outage != Outage::Clean)?;
        let next = match holder_lost_or_kept_then_waiter(&ctx, (guard, ttl), waiter, outage).await?
        {
            Ok(next) => next,
            // Down for as long as a TTL lease takes to run out, or a crashed node of a cluster
            // taking its place again (a Redis Cluster reloading its slots and gossip), may
            // outlast the waiter's connect timeout: `Unavailable` is the outage's answer then
            // (contract item 5), and the same client locks again once the server is back.
            Err(LockError::Unavailable { .. }) if outage != Outage::Clean => {
                eprintln!(
                    "{}: the waiter answered Unavailable ({outage:?})",
                    ctx.case()
                );
                acquire_riding_out(&ctx, &*b, &name, &hold).await?
            }
            Err(e) => {
                return Err(Failure(format!(
                    "a waiter that held nothing failed across the restart ({outage:?}): {e:?}"
                )));
            }
        };
        if fenced {
            let token = next.fencing_token().get();
            ensure!(
                token > held_token && token > last,
                "the waiter's token {token} is not above the holder's {held_token} or the last \
                 one {last} ({outage:?})"
            );
            last = token;
        }
        next.release().await?;
    }
    Ok(())
}

/// How the case's server goes away before it starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outage {
    /// Stopped cleanly.
    Clean,
    /// Killed (`SIGKILL`).
    Crash,
    /// Killed, and kept down until the holder's guard is lost (its lease or session ran out
    /// on the client): the waiter's own lease or session ends meanwhile too.
    PastTheHold,
}

/// After a restart, the holder's `guard` is lost within two of its lease's `ttl` (a renewal
/// finds it gone), or it is kept (a session suspended while the server was away, then back) and
/// is released here; a waiter done while the holder still holds fails the case. Then the
/// `waiter`'s outcome, within the bound.
async fn holder_lost_or_kept_then_waiter(
    ctx: &Ctx,
    (guard, ttl): (LockGuard, Duration),
    waiter: JoinHandle<dlock_api::Result<LockGuard>>,
    outage: Outage,
) -> Result<dlock_api::Result<LockGuard>, Failure> {
    let mut lost = tokio::time::timeout(ttl.saturating_mul(2), guard.lost())
        .await
        .ok();
    if lost.is_none() {
        ctx.within("a suspended holder to be held again or lost", async {
            while matches!(guard.status(), LockStatus::Suspended { .. }) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await?;
        lost = guard.lost_reason();
    }
    match lost {
        Some(reason) => {
            eprintln!(
                "{}: the holder was lost after the restart ({outage:?}): {reason:?}",
                ctx.case()
            );
            ensure!(
                guard.release().await.is_err(),
                "the release of a lost guard succeeded ({outage:?})"
            );
        }
        None => {
            eprintln!(
                "{}: the holder kept its lock across the restart ({outage:?})",
                ctx.case()
            );
            ensure!(
                guard.is_held(),
                "the holder's guard is neither held nor lost: {:?}",
                guard.status()
            );
            if waiter.is_finished() {
                let early = waiter
                    .await
                    .map_err(|e| Failure(format!("the waiter's task: {e}")))?;
                return Err(Failure(format!(
                    "the waiter finished while the holder still held ({outage:?}): {:?}",
                    early.map(|g| g.fencing_token())
                )));
            }
            guard.release().await?;
        }
    }
    ctx.within("the waiter after the restart", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task: {e}")))
}

/// **A killed session's client acquires again** (Curator's `testKilledSession`, the client's
/// side): a client holds two names; the server ends its hold on the first (etcd: its lease
/// revoked; ZooKeeper: its session expired; Postgres: `pg_terminate_backend`; MariaDB: `KILL`;
/// Redis: the key deleted). Its guard reports the loss, and **the same client** acquires the
/// name again within the bound (on a new lease, session or connection, as its backend has them).
/// The old guard stays lost after that: its status is still `Lost`, and its release fails
/// without freeing the new holder's lock. The second name is lost with the first where the
/// two shared a session, or still held where they did not; either way the client takes it again.
pub async fn killed_session_client_acquires_again(ctx: Ctx) -> CaseResult {
    let (client, other) = (ctx.client().await?, ctx.client().await?);
    let names = [ctx.name("a"), ctx.name("b")];
    let hold = killable_hold(&ctx, &*client);
    let first = client.acquire(&names[0], &hold).await?;
    let second = client.acquire(&names[1], &hold).await?;
    ctx.require_faults()?
        .kill_holder(&names[0])
        .await
        .map_err(Failure)?;
    let reason = ctx
        .within("lost after the session was killed", first.lost())
        .await?;
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let again = ctx
        .within(
            "the same client to lock again",
            client.acquire(&names[0], &wait),
        )
        .await??;
    ensure!(again.is_held(), "the new guard is not held");
    if client.capabilities().fencing != Fencing::None {
        ensure!(
            again.fencing_token() > first.fencing_token(),
            "the new token {} is not above the killed one's {}",
            again.fencing_token(),
            first.fencing_token()
        );
    }
    ensure!(
        first.status() == LockStatus::Lost(reason),
        "the killed guard's status after the new acquire: {:?}",
        first.status()
    );
    ensure!(!first.is_held(), "the killed guard says it holds again");
    ensure!(
        first.release().await.is_err(),
        "the release of the killed guard succeeded"
    );
    ensure!(
        other
            .try_acquire(&names[0], &LockOptions::new())
            .await?
            .is_none(),
        "the killed guard's release freed the new holder's lock"
    );
    ensure!(
        again.is_held(),
        "the new guard is not held after the stale release"
    );
    again.release().await?;
    // The second name: free on the server only if its hold went with the session.
    match other.try_acquire(&names[1], &LockOptions::new()).await? {
        Some(taken) => {
            ctx.within("the second guard's loss", second.lost()).await?;
            taken.release().await?;
            client.acquire(&names[1], &wait).await?.release().await?;
        }
        None => {
            ensure!(
                second.is_held(),
                "the second name is neither free nor held by its guard: {:?}",
                second.status()
            );
            second.release().await?;
        }
    }
    Ok(())
}

/// **A waiter whose session is killed waits on** (the etcd report, with a killed session for a
/// restart): a client holds one name, which gives it a session (etcd: a lease its waiting keys
/// ride too; ZooKeeper: the session its waiting node belongs to), and waits for a second name
/// held by another client. The server ends the client's hold on the first name. That guard is
/// lost; the waiter held nothing, so it queues again on a new session and takes the second name
/// once its holder releases, within its one wait and with a higher token. An election candidate
/// is the exception (`election::expired_candidate_never_leads`).
pub async fn waiter_whose_session_is_killed_waits_on(ctx: Ctx) -> CaseResult {
    let (holder, client) = (ctx.client().await?, ctx.client().await?);
    let (held, wanted) = (ctx.name("held"), ctx.name("wanted"));
    let busy = holder.acquire(&wanted, &LockOptions::new()).await?;
    let own = client
        .acquire(&held, &killable_hold(&ctx, &*client))
        .await?;
    let waiter = spawned_acquire(ctx.timing().bound, &client, &wanted);
    ctx.until_queued(&*holder, &wanted).await?;
    ctx.require_faults()?
        .kill_holder(&held)
        .await
        .map_err(Failure)?;
    ctx.within("lost after the session was killed", own.lost())
        .await?;
    // Queued again (or never dequeued, where the wait was not on the killed session).
    if let Err(failure) = ctx.until_queued(&*holder, &wanted).await {
        if waiter.is_finished() {
            let outcome = waiter
                .await
                .map_err(|e| Failure(format!("the waiter's task: {e}")))?;
            return Err(Failure(format!(
                "a waiter that held nothing gave up when its session was killed: {:?}",
                outcome.map(|guard| guard.fencing_token())
            )));
        }
        return Err(failure);
    }
    ensure!(
        busy.is_held(),
        "the other client's lock went with the killed session: {:?}",
        busy.status()
    );
    let busy_token = busy.fencing_token();
    busy.release().await?;
    let next = ctx
        .within("the waiter after the holder released", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task: {e}")))?
        .map_err(|e| {
            Failure(format!(
                "a waiter that held nothing failed when its session was killed: {e:?}"
            ))
        })?;
    if client.capabilities().fencing != Fencing::None {
        ensure!(
            next.fencing_token() > busy_token,
            "the waiter's token {} is not above the holder's {busy_token}",
            next.fencing_token()
        );
    }
    ensure!(
        matches!(own.status(), LockStatus::Lost(_)),
        "the killed guard was revived by the waiter's new session: {:?}",
        own.status()
    );
    ensure!(
        own.release().await.is_err(),
        "the release of the killed guard succeeded"
    );
    next.release().await?;
    Ok(())
}
