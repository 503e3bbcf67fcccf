//! The wait in a name's line: our key joins it, and a watch on the keys ahead (with a fallback
//! re-read) says when it holds; a key that goes while it waits joins the line again.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{Claim, Detach, Grant, WaitRecovery};
use dlock_api::{LockError, LockName, LockOptions, LostReason, Result};
use tokio::time::Instant;

use super::{EtcdLock, Kind};
use crate::client::FALLBACK_REREAD;
use crate::keys::{KeyClaim, NameKeys};
use crate::queue::{Next, Queue, QueueWatch};

impl EtcdLock {
    /// Waits for what `asked` (see [`try_grant_of`](Self::try_grant_of)) until `deadline`.
    pub(super) async fn wait_grant_of(
        &self,
        name: &LockName,
        asked: Claim,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        // Once a key of ours went, joining the line again rides out an outage within the wait
        // (a server restarted ends every lease: the key went with it).
        let mut requeueing: Option<WaitRecovery> = None;
        loop {
            let waited = self
                .with_lease(name, options, |kind, keys, claim| async move {
                    let session = kind.session().cloned();
                    let result = self
                        .wait((name, asked), kind, keys, claim, options, deadline)
                        .await;
                    (result, session)
                })
                .await;
            let waited = match (waited, requeueing.as_mut()) {
                (Ok(waited), _) => waited,
                (Err(error), Some(recovery)) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                    continue;
                }
                (Err(error), None) => return Err(error),
            };
            match waited {
                Waited::Granted(grant) => return Ok(Some(grant)),
                Waited::TimedOut => return Ok(None),
                // A waiter holds nothing, so its key's end loses nothing: it joins the line
                // again on a live lease (a server that stays down answers `Unavailable` from
                // there), as long as its wait lasts.
                // A candidate is never granted on a place it lost (etcd-io/etcd #19597): its
                // campaign fails, and its caller decides whether to stand again.
                Waited::KeyGone if options.is_campaign() => {
                    return Err(LockError::Lost {
                        name: name.to_string(),
                        reason: LostReason::SessionExpired,
                    });
                }
                Waited::KeyGone if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Ok(None);
                }
                Waited::KeyGone => {
                    requeueing.get_or_insert_with(|| WaitRecovery::new(self.recovery_window()));
                }
            }
        }
    }
}

/// How one wait in the line ended.
enum Waited {
    Granted(Grant),
    TimedOut,
    /// Our key went before it was first in line: its lease ended (revoked, expired, or the
    /// client's session ended) or someone deleted it.
    KeyGone,
}

impl EtcdLock {
    /// How long a waiter rides out a server that does not answer before it gives up.
    fn recovery_window(&self) -> Duration {
        let config = &self.inner.config;
        config
            .connect_timeout
            .max(config.command_timeout.saturating_mul(3))
    }

    async fn wait(
        &self,
        (name, asked): (&LockName, Claim),
        kind: Kind,
        keys: NameKeys,
        claim: Arc<KeyClaim>,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Waited> {
        let inner = &self.inner;
        let key = claim.key().to_owned();
        let (pending, created) = self.arm(&kind, &claim);
        let leads_with = crate::queue::leads_with(asked, options);
        let create = {
            let (inner, keys, claim, id) = (inner.clone(), keys.clone(), claim.clone(), kind.id());
            let put = leads_with.clone();
            Detach::new(async move {
                let result = inner
                    .create(&keys, claim.key(), id, (asked, put.as_deref()))
                    .await;
                let _ = created.send(result.is_ok());
                result
            })
        };
        let (revision, read) = create.await?;
        // What the last read said, until the loop acts on it.
        let mut queue = Some(read);
        let mut watching: Option<QueueWatch> = None;
        let mut reread_at = after(Instant::now(), FALLBACK_REREAD);
        let session = kind.session().map(|s| s.session.clone());
        let mut recovery = WaitRecovery::new(self.recovery_window());
        let retry = options.retry();
        loop {
            match queue.take() {
                Some(Queue::First) => {
                    let grant =
                        self.grant((name, asked.limit), kind, (claim, leads_with), revision);
                    pending.disarm();
                    return Ok(Waited::Granted(grant));
                }
                Some(Queue::Gone) => {
                    drop(pending);
                    return Ok(Waited::KeyGone);
                }
                Some(Queue::Mismatch(in_use)) => {
                    self.leave(&kind, &key, revision, pending).await;
                    return Err(dlock_api::raw::permits_mismatch(name, asked.limit, in_use));
                }
                Some(Queue::Behind(behind)) => {
                    watching = Some(QueueWatch::start(
                        &inner.watcher,
                        &keys,
                        (behind, &key),
                        asked,
                    ));
                    reread_at = after(Instant::now(), FALLBACK_REREAD);
                }
                // Still waiting on the same watch.
                None => {}
            }
            let Some(queue_watch) = watching.as_mut() else {
                continue;
            };
            let wake = deadline.map_or(reread_at, |d| d.min(reread_at));
            let session_ended = async {
                match &session {
                    Some(session) => session.ended().await,
                    None => std::future::pending().await,
                }
            };
            // A waiter on a lease of its own keeps it alive while it queues.
            let renew_at = kind
                .own_timing()
                .map(|(until, every)| until.checked_sub(every.saturating_mul(2)).unwrap_or(until));
            let renew = async {
                match renew_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = queue_watch.watch.next() => match queue_watch.on(event, &key) {
                    Next::Wait => continue,
                    // The last deletion ahead of ours may reach a waiter that was paused long
                    // after it happened, with our lease (and key) gone since: past the lease's
                    // validity the read decides.
                    Next::Held if Instant::now() < kind.valid_until() => {
                        queue = Some(Queue::First);
                        continue;
                    }
                    Next::Held | Next::Read => {}
                },
                _ = session_ended => {
                    drop(pending);
                    return Ok(Waited::KeyGone);
                }
                () = renew => {
                    if let Err(error) = kind.renew_own(inner).await {
                        recovery.pause_or_give_up(error, retry, deadline).await?;
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        // Out of time: take our key out of the queue before answering.
                        self.leave(&kind, &key, revision, pending).await;
                        return Ok(Waited::TimedOut);
                    }
                    if let Some(nearest) = queue_watch.nearest_watched() {
                        // Deep in the line: the few keys we wait on say whether anything
                        // changed for us, without a read of the whole line.
                        match inner.still_behind(&key, revision, nearest).await {
                            Ok(true) => {
                                recovery.reached_server();
                                reread_at = after(Instant::now(), FALLBACK_REREAD);
                                continue;
                            }
                            Ok(false) => {}
                            Err(error) => {
                                recovery.pause_or_give_up(error, retry, deadline).await?;
                                continue;
                            }
                        }
                    }
                }
            }
            loop {
                match inner.read_queue(&keys, &key, revision, asked).await {
                    Ok(read) => {
                        recovery.reached_server();
                        queue = Some(read);
                        break;
                    }
                    Err(error) => recovery.pause_or_give_up(error, retry, deadline).await?,
                }
            }
        }
    }
}
