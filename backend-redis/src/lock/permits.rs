//! Semaphores and readers on Redis: one script takes a permit (`scripts/permits.rs`) or a
//! reader's share (`scripts/readers.rs`); a waiter queues in the name's queue (the lock's) and
//! listens on the name's channel. A permit's release grants the room to the waiters at the
//! queue's head and tells each (`granted OWNER TOKEN`); readers are told `free` and try again.
//! Every waiter also tries again when the earliest permit's lease (or the holding writer's) ends
//! on the server (a holder that vanished announces nothing); the scripts grant in queue order.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::Grant;
use dlock_api::raw::time::after;
use dlock_api::{LockError, LockName, LockOptions, Result};
use tokio::time::{Instant, sleep_until};

use super::{Held, RedisLock, in_use_as, owner_token, ttl_ms};
use crate::BACKEND;
use crate::keys::LockKeys;
use crate::lease::{Hold, RedisLease, announced_grant_end, lease_end};

/// The most permits a Redis semaphore takes: each held permit is one member of a sorted set,
/// and every acquire counts them in O(1) and trims the expired ones in O(log n), so the limit
/// is the memory a user gives the name, not the algorithm's; this keeps a typo from asking for
/// billions.
pub(super) const MAX_PERMITS: u32 = 1_000_000;

/// What a shared acquire asks for: one of N permits of a semaphore, or a reader's share.
#[derive(Clone, Copy, Debug)]
pub(super) enum Share {
    Permits(u32),
    Reader,
}

impl Share {
    fn hold(self) -> Hold {
        match self {
            Self::Permits(_) => Hold::Permit,
            Self::Reader => Hold::Reader,
        }
    }

    /// The holder limit asked for, as a refusal names it (a reader asks the lock's one).
    fn limit(self) -> u32 {
        match self {
            Self::Permits(permits) => permits,
            Self::Reader => 1,
        }
    }
}

enum PermitAttempt {
    Granted(Grant),
    /// Every permit is taken, or the free ones are owed to live waiters queued ahead (for a
    /// reader: a writer holds, or a live writer waits ahead); the earliest of the held permits'
    /// leases (the writer's) ends this long from now (`None`: none is held).
    Busy {
        next_end: Option<Duration>,
        /// The last token the name had handed out when the server ran the attempt (a
        /// semaphore's; a reader's attempt does not say), which dates a grant announced later.
        fence: Option<u64>,
    },
}

impl RedisLock {
    /// One round trip: one of the permits of `name` for `owner`, if one is free and not owed to
    /// an earlier waiter, or a reader's share, if no writer holds or waits ahead; with
    /// `enqueue`, a busy answer queues the caller in the name's queue (or refreshes its
    /// presence there).
    async fn attempt_permit(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        share: Share,
        options: &LockOptions,
        enqueue: bool,
    ) -> Result<PermitAttempt> {
        let (ttl_ms, permits_key) = (ttl_ms(options), keys.permits());
        let presence_ms = match enqueue {
            true => self.presence().as_millis().max(1).to_string(),
            false => "0".to_owned(),
        };
        let (scripts, readers_watchers, limit) = (
            &self.inner.scripts,
            keys.reader_watchers(),
            share.limit().to_string(),
        );
        let (script, args) = match share {
            Share::Permits(_) => (
                &scripts.acquire_permit,
                [
                    owner.as_bytes(),
                    ttl_ms.as_bytes(),
                    limit.as_bytes(),
                    presence_ms.as_bytes(),
                ],
            ),
            Share::Reader => (
                &scripts.acquire_read,
                [
                    owner.as_bytes(),
                    ttl_ms.as_bytes(),
                    presence_ms.as_bytes(),
                    self.inner.held_by.prefix.as_bytes(),
                ],
            ),
        };
        let key_names = [
            keys.lock.as_str(),
            &permits_key,
            &keys.fence,
            &keys.queue,
            &keys.waiters,
            &readers_watchers,
        ];
        // A semaphore's script takes no reader watchers.
        let key_names = match share {
            Share::Permits(_) => &key_names[..5],
            Share::Reader => &key_names[..],
        };
        let (reply, started, pending) = self
            .send_acquire(
                (script, share.hold()),
                keys,
                owner,
                key_names,
                &args,
                options.ttl(),
            )
            .await?;
        let answer = match &reply {
            redis::Value::Array(items) => match items.as_slice() {
                [redis::Value::Int(a), redis::Value::Int(b)] => Some((*a, *b, None)),
                [
                    redis::Value::Int(a),
                    redis::Value::Int(b),
                    redis::Value::Int(c),
                ] => Some((*a, *b, Some(*c))),
                _ => None,
            },
            _ => None,
        };
        match answer {
            Some((1, token, _)) => {
                let held = Held {
                    token,
                    valid_until: lease_end(started, options.ttl()),
                    hold: share.hold(),
                    record: None,
                };
                self.granted(pending, name, keys, owner, held)
                    .await
                    .map(PermitAttempt::Granted)
            }
            Some((0, next_end_ms, fence)) => {
                // Queued or not, a waiter's own cleanup covers the queue from here.
                pending.disarm();
                Ok(PermitAttempt::Busy {
                    next_end: u64::try_from(next_end_ms).ok().map(Duration::from_millis),
                    fence: fence.and_then(|fence| u64::try_from(fence).ok()),
                })
            }
            Some((-1, in_use, _)) => {
                pending.disarm();
                Err(in_use_as(name, share.limit(), in_use.unsigned_abs()))
            }
            _ => Err(LockError::backend(
                BACKEND,
                format!("unexpected permit reply {reply:?}"),
            )),
        }
    }

    /// [`RawLock::try_grant`](dlock_api::raw::RawLock::try_grant) of more than one permit, or a
    /// reader's: never ahead of a queued waiter it would have to wait for.
    pub(super) async fn try_permit(
        &self,
        name: &LockName,
        share: Share,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        let keys = Arc::new(self.keys(name));
        match self
            .attempt_permit(name, &keys, &owner_token(), share, options, false)
            .await?
        {
            PermitAttempt::Granted(grant) => Ok(Some(grant)),
            PermitAttempt::Busy { .. } => Ok(None),
        }
    }

    /// [`RawLock::wait_grant`](dlock_api::raw::RawLock::wait_grant) of more than one permit, or a
    /// reader's: tries once without queueing (the uncontended path), then joins the name's queue
    /// and waits. A release grants the room it makes to the live waiters at the queue's head
    /// (`granted OWNER TOKEN` on the name's channel: the permit is this waiter's already); a
    /// reader tries again at each `free`. Every waiter also tries again at the end of the
    /// earliest held lease (a holder that vanished announces nothing) and at each refresh of its
    /// presence in the queue (a waiter ahead that vanished announces nothing either). The server
    /// grants a permit only once no live waiter queued ahead of it is owed the free ones, and a
    /// reader's share only once no live writer waits ahead of it, so waiters are served in order.
    pub(super) async fn wait_permit(
        &self,
        name: &LockName,
        share: Share,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let keys = Arc::new(self.keys(name));
        let mut recovery = self.wait_recovery();
        let mut owner = loop {
            let owner = owner_token();
            match self
                .attempt_permit(name, &keys, &owner, share, options, false)
                .await
            {
                Ok(PermitAttempt::Granted(grant)) => return Ok(Some(grant)),
                Ok(PermitAttempt::Busy { .. }) => break owner,
                // Ridden out as the lock's first attempt is (`wait_grant`): the next try is a
                // new owner, the lost reply's cleanup undoing what the server did for this one.
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                }
            }
        };
        let (mut waiting, mut pending) = self.join_wait(&keys, &owner, share.hold());
        let refresh = self.presence().checked_div(3).unwrap_or_default();
        // The latest attempt that found no room, which dates a grant announced to us.
        let mut last_busy: Option<(Instant, u64)> = None;
        let mut reply_lost = false;
        loop {
            if std::mem::take(&mut reply_lost) {
                // The lost reply's cleanup gives back whatever that attempt did for this owner
                // (a place in the queue, a permit), late or not: the wait goes on as a new
                // owner, at the end of the queue.
                owner = owner_token();
                pending.disarm();
                (waiting, pending) = self.join_wait(&keys, &owner, share.hold());
                last_busy = None;
            }
            let notified = waiting.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(token) = waiting.take_grant() {
                if let Some(valid_until) = announced_grant_end(last_busy, token, options.ttl()) {
                    let held = Held {
                        token: token as i64,
                        valid_until,
                        hold: share.hold(),
                        record: None,
                    };
                    return self
                        .granted(pending, name, &keys, &owner, held)
                        .await
                        .map(Some);
                }
                // An ended grant, or too little of its lease is certain: the attempt below asks
                // the server (the permit still ours is renewed with a new token).
            }
            // Subscribed before the attempt, so a release between the two is not missed.
            if let Err(error) = waiting.ensure_subscribed().await {
                recovery
                    .pause_or_give_up(error, options.retry(), deadline)
                    .await?;
                continue;
            }
            let sent = Instant::now();
            let next_end = match self
                .attempt_permit(name, &keys, &owner, share, options, true)
                .await
            {
                Ok(PermitAttempt::Granted(grant)) => {
                    pending.disarm();
                    return Ok(Some(grant));
                }
                Ok(PermitAttempt::Busy { next_end, fence }) => {
                    recovery.reached_server();
                    last_busy = fence.map(|fence| (sent, fence));
                    next_end
                }
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                    reply_lost = true;
                    continue;
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                // Leave the queue (or give back a permit that raced in) before the timeout.
                RedisLease::cancel(&self.inner, &keys, &owner, share.hold()).await?;
                pending.disarm();
                return Ok(None);
            }
            let mut wake_at = after(now, refresh);
            if let Some(next_end) = next_end {
                wake_at = wake_at.min(after(now, next_end));
            }
            if let Some(deadline) = deadline {
                wake_at = wake_at.min(deadline);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = waiting.granted_signal() => {}
                _ = sleep_until(wake_at) => {}
            }
        }
    }

    /// [`RawLock::count_permits`](dlock_api::raw::RawLock::count_permits): one read-only script.
    pub(super) async fn count(&self, name: &LockName) -> Result<u32> {
        let keys = self.keys(name);
        let permits = keys.permits();
        let inner = &self.inner;
        let count: i64 = inner
            .conn
            .run_script(
                inner.config.command_timeout,
                &inner.scripts.count_permits,
                &[&keys.lock, &permits],
                &[],
            )
            .await?;
        Ok(u32::try_from(count).unwrap_or(u32::MAX))
    }
}
