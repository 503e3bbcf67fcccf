//! `RedlockLease`: release on every node, extend on a quorum.

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{RawLease, RenewBatch, Scheduled, Session};
use dlock_api::{LockError, LockName, LostReason, Result};
use dlock_redis::LockKeys;
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::Inner;
use crate::fanout;
use crate::release::{LetGo, release_answered, release_on};

pub(crate) struct RedlockLease {
    inner: Arc<Inner>,
    name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    /// The validity obtained by the grant or the last extend that reached a quorum.
    valid_until: Mutex<Instant>,
    /// Suspended while renewals fail and validity remains; ends with `RenewalFailed` when the
    /// validity runs out first.
    session: Arc<Session>,
    /// Whether the watchdog renews this lease (a failed renewal then suspends the guard; a
    /// failed extend by hand only reports its error).
    renewed: bool,
    /// The start of the takeover watch (`held.rs`), until it comes due.
    _watch: Option<Scheduled>,
    /// Let go as the release starts, before any node is asked: a grant's answer still out then
    /// is undone where the release missed its key (the round's late answers, `lock.rs`).
    let_go: Arc<LetGo>,
}

impl RedlockLease {
    #[allow(clippy::too_many_arguments)] // one per field the grant sets
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        valid_until: Instant,
        session: Arc<Session>,
        renewed: bool,
        watch: Option<Scheduled>,
        let_go: Arc<LetGo>,
    ) -> Self {
        Self {
            inner,
            name,
            keys,
            owner,
            valid_until: Mutex::new(valid_until),
            session,
            renewed,
            _watch: watch,
            let_go,
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An extend's outcome from how many nodes `extended` it and found it `gone`: with a quorum
    /// in time the new validity is `started + ttl - drift`; when a quorum can no longer be
    /// reached it is `NotHeld`; otherwise `Unavailable`, and a renewed guard is suspended until
    /// the validity it still has. A failure deletes nothing.
    pub(crate) fn conclude(
        &self,
        round: Extended,
        (extended, gone): (usize, usize),
        failed: &[String],
    ) -> Result<Instant> {
        let config = &self.inner.config;
        let (n, quorum) = (self.inner.slots.len(), config.quorum());
        let Extended {
            started,
            current,
            ttl,
        } = round;
        if extended >= quorum && Instant::now() < current {
            let valid_until = after(started, ttl.saturating_sub(config.drift_for(ttl)));
            *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = valid_until;
            self.session.resume();
            return Ok(valid_until);
        }
        if gone > n.saturating_sub(quorum) {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        if self.renewed {
            self.session
                .suspend_with(current, LostReason::RenewalFailed);
        }
        Err(LockError::unavailable_because(
            BACKEND,
            format!(
                "extend of `{}` reached {extended} of {n} nodes, {quorum} needed ({})",
                self.name,
                failed.join("; ")
            ),
        ))
    }

    /// The answer of an extend begun when the validity had already run out.
    pub(crate) fn out_of_validity(&self) -> LockError {
        LockError::Lost {
            name: self.name.to_string(),
            reason: LostReason::RenewalFailed,
        }
    }
}

/// One extend round of a lease: when it started, the validity it started with, the TTL asked.
#[derive(Clone, Copy)]
pub(crate) struct Extended {
    pub(crate) started: Instant,
    pub(crate) current: Instant,
    pub(crate) ttl: Duration,
}

#[async_trait]
impl RawLease for RedlockLease {
    /// Deletes the key (owner-checked) on every node at once and announces each deletion.
    /// `Ok` if any node still had it; `NotHeld` if every node answered without it. Returns once
    /// a quorum deleted it (the lock is free for others then); the deletions still out finish
    /// in the background, each on its node's connection, ahead of anything this client sends
    /// that node later. A node whose connection dropped is asked again while it comes back,
    /// up to the command timeout, so that its key does not outlive the release until its TTL.
    async fn release(&self) -> Result<()> {
        self.let_go.let_go();
        let timeout = self.inner.config.command_timeout;
        let quorum = self.inner.config.quorum();
        let mut deleted: usize = 0;
        let mut failed: Vec<String> = Vec::new();
        // A node that missed the release is asked again in the background, while its
        // connection comes back; one that answered without the key may see a late answer of
        // the grant's round set it after all (`LetGo`).
        let answered = {
            let (inner, keys, owner) = (self.inner.clone(), self.keys.clone(), self.owner.clone());
            let let_go = self.let_go.clone();
            move |slot: &Arc<crate::nodes::Slot>, reply: &Result<bool>| match reply {
                Ok(deleted) => {
                    let budget = inner.config.command_timeout;
                    release_answered(budget, slot, (&keys, &owner), &let_go, *deleted);
                }
                Err(_) => {
                    let key = (keys.clone(), owner.clone());
                    release_on(&inner, slot.clone(), key, Some(let_go.clone()));
                }
            }
        };
        let answered_late = answered.clone();
        fanout::until_decided(
            &self.inner.slots,
            |slot| {
                let (slot, keys, owner) = (slot.clone(), self.keys.clone(), self.owner.clone());
                async move { slot.get()?.release(&keys, &owner, timeout).await }
            },
            |slot, reply| {
                answered(slot, &reply);
                match reply {
                    Ok(true) => deleted = deleted.saturating_add(1),
                    Ok(false) => {}
                    Err(error) => failed.push(format!("{}: {error}", slot.addr())),
                }
                deleted >= quorum
            },
            move |slot, reply| answered_late(slot, &reply),
        )
        .await;
        if deleted > 0 {
            if !failed.is_empty() {
                tracing::debug!(lock = %self.name, failed = %failed.join("; "), "redlock: some nodes missed the release; asking them again");
            }
            Ok(())
        } else if failed.is_empty() {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        } else {
            Err(LockError::unavailable_because(
                BACKEND,
                format!(
                    "no node confirmed the release of `{}` ({})",
                    self.name,
                    failed.join("; ")
                ),
            ))
        }
    }

    /// Resets the TTL (owner-checked) on every node at once, each within the per-node timeout
    /// and the validity left, and returns once a quorum did (the others finish in the
    /// background) or every node answered. A quorum makes the new validity `start + ttl - drift`; a failure
    /// deletes nothing. When a quorum can no longer be reached (the key is gone from too many
    /// nodes) it is `NotHeld`; otherwise `Unavailable`, and a renewed guard is suspended until
    /// the validity it still has.
    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        let config = &self.inner.config;
        let quorum = config.quorum();
        let started = Instant::now();
        let current = self.valid_until();
        let left = current.saturating_duration_since(started);
        if left.is_zero() {
            return Err(self.out_of_validity());
        }
        let timeout = config.node_timeout_for(ttl).min(left);
        // Decided at a quorum's yes, like a grant: the new validity counts from before the
        // first request, so the nodes still to answer cannot shorten it.
        let (mut extended, mut gone) = (0usize, 0usize);
        let mut failed: Vec<String> = Vec::new();
        fanout::until_decided(
            &self.inner.slots,
            |slot| {
                let (slot, keys, owner) = (slot.clone(), self.keys.clone(), self.owner.clone());
                async move { slot.get()?.extend(&keys, &owner, ttl, timeout).await }
            },
            |slot, reply| {
                match reply {
                    Ok(true) => extended = extended.saturating_add(1),
                    Ok(false) => gone = gone.saturating_add(1),
                    Err(error) => failed.push(format!("{}: {error}", slot.addr())),
                }
                extended >= quorum
            },
            |_, _| {},
        )
        .await;
        self.conclude(
            Extended {
                started,
                current,
                ttl,
            },
            (extended, gone),
            &failed,
        )
    }

    fn guard_timer(&self) -> Option<&dlock_api::raw::GuardTimer> {
        Some(&self.inner.timer)
    }

    fn renewal_batch(&self) -> Option<(Arc<dyn RenewBatch>, &(dyn Any + Send + Sync))> {
        Some((self.inner.clone(), self))
    }
}

impl fmt::Debug for RedlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.keys.lock)
            .finish_non_exhaustive()
    }
}
