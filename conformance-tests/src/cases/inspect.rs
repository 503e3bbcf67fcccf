//! Holder inspection ([`DistributedLock::inspect`]): what the server says about a name follows
//! a hold, its waiters and the hand-off, field by field where the backend reports it; on a
//! reader-writer lock, the readers that share it and the modes its waiters wait in.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{
    DistributedLock, DistributedLockExt, Inspection, LeaseKind, LockName, LockOptions,
};

use super::reader_writer::{granted, spawn_read, spawn_write, waiting};
use crate::{CaseResult, Ctx, Failure, ensure};

/// The lease the case asks for: long enough to see time left, short of any backend's maximum.
const TTL: Duration = Duration::from_secs(10);

/// Asks until `done` holds of the answer, within the case's bound.
pub(crate) async fn until(
    ctx: &Ctx,
    locks: &dyn DistributedLock,
    name: &LockName,
    what: &str,
    done: impl Fn(&Inspection) -> bool + Send + Sync,
) -> Result<Inspection, Failure> {
    ctx.within(what, async {
        loop {
            let seen = locks.inspect(name).await?;
            if done(&seen) {
                return Ok::<_, Failure>(seen);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await?
}

/// Free, then held (the guard's token where the backend reports one, time left within the TTL
/// for a TTL lease, no waiters), then two waiters on clients of their own (counted where the
/// backend counts them); released, the lock goes to a waiter (a higher token, another holder);
/// and once every waiter is done, free again.
pub async fn follows_a_hand_off(ctx: Ctx) -> CaseResult {
    let locks = ctx.client().await?;
    let caps = locks.capabilities();
    let name = ctx.name("lock");
    let opts = LockOptions::new()
        .with_ttl(TTL.max(caps.min_ttl.unwrap_or_default()))
        .with_wait_timeout(ctx.timing().bound);
    let free = locks.inspect(&name).await?;
    ensure!(!free.held && free.token.is_none(), "a free name: {free:?}");
    ensure!(
        free.waiters.is_none_or(|n| n == 0),
        "a free name with waiters: {free:?}"
    );

    let guard = locks
        .try_acquire(&name, &opts)
        .await?
        .ok_or_else(|| Failure(format!("{name} was not free")))?;
    let held = locks.inspect(&name).await?;
    ensure!(held.held, "held, yet: {held:?}");
    ensure!(
        held.token.is_none_or(|t| t == guard.fencing_token()),
        "the holder's token is {}, the inspection says {held:?}",
        guard.fencing_token()
    );
    if caps.lease == LeaseKind::Ttl {
        let left = held
            .remaining
            .ok_or_else(|| Failure(format!("a TTL lease with no time left: {held:?}")))?;
        ensure!(
            left > Duration::ZERO && left <= opts.ttl(),
            "{left:?} left of a {:?} lease",
            opts.ttl()
        );
    }
    ensure!(
        held.waiters.is_none_or(|n| n == 0),
        "no one waits yet: {held:?}"
    );

    let mut waiting = tokio::task::JoinSet::new();
    for n in 1..=2 {
        let client: Arc<dyn DistributedLock> = ctx.client().await?;
        let (wanted, opts) = (name.clone(), opts.clone());
        waiting.spawn(async move { client.acquire(&wanted, &opts).await });
        if held.waiters.is_some() {
            until(&ctx, &*locks, &name, "the waiter to be counted", |seen| {
                seen.waiters == Some(n)
            })
            .await?;
        }
    }

    let first = (guard.fencing_token(), held.holder.clone());
    guard.release().await?;
    // Handed on: another holder or a higher token, whichever the backend reports.
    let next = until(&ctx, &*locks, &name, "a waiter to hold the lock", |seen| {
        let unnamed = first.1.is_none() && seen.token.is_none();
        seen.held && (seen.holder != first.1 || seen.token.is_some_and(|t| t > first.0) || unnamed)
    })
    .await?;
    ensure!(
        next.token.is_none_or(|t| t > first.0),
        "the next holder's token is not above {}: {next:?}",
        first.0
    );

    // In the order they got the lock: a backend that is not FIFO may serve the second first.
    while let Some(task) = waiting.join_next().await {
        let guard = task.map_err(|e| Failure(format!("a waiter panicked: {e}")))??;
        guard.release().await?;
    }
    until(&ctx, &*locks, &name, "the name to be free again", |seen| {
        !seen.held && seen.waiters.is_none_or(|n| n == 0)
    })
    .await?;
    Ok(())
}

/// A writer holds while two readers and then a writer wait, each on a client of its own: the
/// server counts no readers holding and two of the three waiters as readers. The writer leaves:
/// both readers share the name, counted as two readers, and the writer still waits, counted as
/// the one waiter and no reader. They leave: the writer holds, with no readers. A backend with
/// readers and inspection reports both counts (what `dlock status` shows).
pub async fn counts_readers_and_waiting_modes(ctx: Ctx) -> CaseResult {
    let locks = ctx.client().await?;
    let name = ctx.name("rw");
    let first = locks
        .try_write(&name, &waiting(&ctx))
        .await?
        .ok_or_else(|| Failure(format!("{name} was not free")))?;
    let mut readers = Vec::new();
    for queued in 1..=2 {
        readers.push(spawn_read(&ctx.client().await?, &name, waiting(&ctx)));
        ctx.until_waiting(&*locks, &name, queued).await?;
    }
    let writer = spawn_write(&ctx.client().await?, &name, waiting(&ctx));
    let seen = until(&ctx, &*locks, &name, "three waiters", |seen| {
        seen.waiters == Some(3)
    })
    .await?;
    ensure!(
        seen.held && seen.readers == Some(0) && seen.waiting_readers == Some(2),
        "a writer holds, two readers and a writer wait: {seen:?}"
    );
    first.release().await?;
    let mut shares = Vec::new();
    for reader in readers {
        shares.push(granted(&ctx, "a waiting reader after the writer left", reader).await?);
    }
    let seen = until(&ctx, &*locks, &name, "two readers holding", |seen| {
        seen.readers == Some(2) && seen.waiters == Some(1)
    })
    .await?;
    ensure!(
        seen.held && seen.waiting_readers == Some(0),
        "two readers hold and a writer waits: {seen:?}"
    );
    for share in shares {
        share.release().await?;
    }
    let next = granted(&ctx, "the writer after the readers left", writer).await?;
    let seen = locks.inspect(&name).await?;
    ensure!(
        seen.held && seen.readers == Some(0) && seen.waiting_readers == Some(0),
        "the writer holds alone: {seen:?}"
    );
    next.release().await?;
    Ok(())
}
