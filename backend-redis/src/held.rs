//! The watch of a held lock: a holder learns that its key went and someone took the lock at
//! once, not at its next renewal.
//!
//! A Redis lock is a key with a TTL. Its key can go without its holder's release: the lease ran
//! out while the holder was paused, an operator deleted it, a failover to a replica lost it, the
//! server evicted it. Renewal finds out at the next extend (a third of the TTL: up to 10 s with
//! the default lease), and until then two guards say `is_held()`. So a lock held longer than
//! [`WATCH_HELD_AFTER`] marks the name's fence with its client's id ("a holder listens",
//! `scripts.rs`), once its client has subscribed to its own channel, `PREFIX:held-by:CLIENT`
//! (one subscription for all the locks a client holds, so holding many costs one script each,
//! not a subscription each). Whoever takes the lock over a vanished key then publishes `taken
//! OWNER TOKEN LOCK_KEY` there, and the push handler loses the guard as the message arrives. A
//! lock released sooner (most are) never pays for the mark.
//!
//! The watch also finds a key that went before it started (its mark answers "not yours"), and
//! marks again after every reconnect, whose new connection has no subscriptions. A key that goes
//! while nobody takes the lock is still found by the next renewal: nobody else holds it
//! meanwhile.

use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_api::Result;
use dlock_api::raw::{
    HeldCheck, HeldWatchTiming, LeaseState, Scheduled, start_watch_after, watch_held,
};

use crate::client::Inner;
use crate::keys::LockKeys;
use crate::wake::Watching;

/// How long a lock is held before its holder watches it, as etcd's and ZooKeeper's holders do.
pub(crate) const WATCH_HELD_AFTER: Duration = Duration::from_millis(250);

/// A watch marks the fence again well within the ten minutes a mark lives, and checks again
/// soon after a check that failed (no answer, a reconnect).
const TIMING: HeldWatchTiming = HeldWatchTiming {
    again_every: Duration::from_secs(120),
    retry_after: Duration::from_millis(200),
};

/// What a holder hands its watch.
pub(crate) struct HeldLock {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) token: u64,
    pub(crate) state: Arc<LeaseState>,
    /// The lease, to ask whether it wrote the name's leader record.
    pub(crate) lease: Weak<crate::lease::RedisLease>,
    /// A reader's share (`scripts/readers.rs`): marked in the name's reader watchers rather
    /// than on the fence, which names one client, while readers of many clients hold at once.
    pub(crate) reader: bool,
}

/// Schedules the watch of a lock just granted, [`WATCH_HELD_AFTER`] from now on the client's
/// guard timer; dropping the handle (the lease went first) cancels it.
pub(crate) fn schedule_watch(inner: &Arc<Inner>, held: HeldLock) -> Option<Scheduled> {
    let state = held.state.clone();
    let watch = watch(Arc::downgrade(inner), held);
    start_watch_after(&inner.timer, WATCH_HELD_AFTER, &state, watch)
}

/// Runs until the guard is released, lost, or its client dropped.
async fn watch(client: Weak<Inner>, held: HeldLock) {
    let watching = loop {
        let Some(inner) = client.upgrade() else {
            return;
        };
        let connected = inner
            .watch_conn
            .get_or_try_init(|| {
                crate::conn::Conn::connect(&inner.config, crate::wake::Wakeups::handler(&inner.hub))
            })
            .await;
        match connected {
            Ok(conn) => break watching(&inner, conn, &held),
            Err(error) => {
                tracing::debug!(%error, "redis: the connection for held-lock watches failed; trying again");
                drop(inner);
                tokio::select! {
                    _ = held.state.closed() => return,
                    _ = held.state.lost_token().cancelled() => return,
                    _ = tokio::time::sleep(TIMING.retry_after) => {}
                }
            }
        }
    };
    watch_held(&held.state, watching.wake(), TIMING, || {
        check(&client, &watching, &held)
    })
    .await;
}

fn watching(inner: &Inner, conn: &crate::conn::Conn, held: &HeldLock) -> Watching {
    inner.hub.watch(
        conn,
        &inner.held_by.channel,
        &held.keys.lock,
        &held.owner,
        held.token,
        &held.state,
        inner.config.command_timeout,
    )
}

/// Subscribes (a no-op while subscribed), then marks the fence if the lock is still this
/// holder's.
async fn check(client: &Weak<Inner>, watching: &Watching, held: &HeldLock) -> Result<HeldCheck> {
    watching.ensure_subscribed().await?;
    let Some(inner) = client.upgrade() else {
        return Ok(HeldCheck::Stop);
    };
    let timeout = inner.config.command_timeout;
    let args = [&*held.owner, &*inner.held_by.client];
    let marked: i64 = match held.reader {
        true => {
            let (readers, watchers) = (held.keys.permits(), held.keys.reader_watchers());
            let keys = [held.keys.lock.as_str(), &readers, &watchers];
            let script = &inner.scripts.watch_reader;
            inner.conn.run_script(timeout, script, &keys, &args).await?
        }
        false => {
            let keys = [held.keys.lock.as_str(), &held.keys.fence];
            let script = &inner.scripts.watch_held;
            inner.conn.run_script(timeout, script, &keys, &args).await?
        }
    };
    if marked == 1 {
        return Ok(HeldCheck::Held);
    }
    if held.lease.upgrade().is_some_and(|lease| lease.proclaimed()) {
        // A leader whose key went: its record goes and observers are told now, not when the
        // lease they last read ends (nobody else may announce it).
        let leader = held.keys.leader();
        let vacated: Result<i64> = inner
            .conn
            .run_script(
                inner.config.command_timeout,
                &inner.scripts.vacate,
                &[&held.keys.lock, &leader],
                &[&held.owner, &held.keys.channel],
            )
            .await;
        if let Err(error) = vacated {
            tracing::debug!(%error, key = %held.keys.lock, "redis: could not vacate a lost leader's record; it ends a second after its lease");
        }
    }
    Ok(HeldCheck::Gone)
}
