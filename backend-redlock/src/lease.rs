//! `RedlockLease`: release on every node, extend on a quorum.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{RawLease, Session};
use dlock_api::{LockError, LockName, LostReason, Result};
use dlock_redis::LockKeys;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::Inner;

pub(crate) struct RedlockLease {
    inner: Arc<Inner>,
    name: LockName,
    keys: Arc<LockKeys>,
    owner: String,
    /// The validity obtained by the grant or the last extend that reached a quorum.
    valid_until: Mutex<Instant>,
    /// Suspended while renewals fail and validity remains; ends with `RenewalFailed` when the
    /// validity runs out first.
    session: Arc<Session>,
    /// Whether the watchdog renews this lease (a failed renewal then suspends the guard; a
    /// failed extend by hand only reports its error).
    renewed: bool,
}

impl RedlockLease {
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: String,
        valid_until: Instant,
        session: Arc<Session>,
        renewed: bool,
    ) -> Self {
        Self {
            inner,
            name,
            keys,
            owner,
            valid_until: Mutex::new(valid_until),
            session,
            renewed,
        }
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl RawLease for RedlockLease {
    /// Deletes the key (owner-checked) on every node at once and announces each deletion.
    /// `Ok` if any node still had it; `NotHeld` if every node answered without it. Returns once
    /// a quorum deleted it (the lock is free for others then); the deletions still out finish
    /// in the background, each on its node's connection, ahead of anything this client sends
    /// that node later.
    async fn release(&self) -> Result<()> {
        let timeout = self.inner.config.command_timeout;
        let quorum = self.inner.config.quorum();
        let owner: Arc<str> = Arc::from(self.owner.as_str());
        let mut replies: FuturesUnordered<_> = self
            .inner
            .slots
            .iter()
            .map(|slot| {
                let (slot, keys, owner) = (slot.clone(), self.keys.clone(), owner.clone());
                async move {
                    let reply = match slot.get() {
                        Ok(node) => node.release(&keys, &owner, timeout).await,
                        Err(error) => Err(error),
                    };
                    (slot, reply)
                }
            })
            .collect();
        let mut deleted = 0;
        let mut failed: Vec<String> = Vec::new();
        while let Some((slot, reply)) = replies.next().await {
            match reply {
                Ok(true) => deleted += 1,
                Ok(false) => {}
                Err(error) => failed.push(format!("{}: {error}", slot.addr())),
            }
            if deleted >= quorum {
                break;
            }
        }
        if !replies.is_empty() {
            let name = self.name.clone();
            dlock_api::raw::spawn_cleanup(async move {
                while let Some((slot, reply)) = replies.next().await {
                    if let Err(error) = reply {
                        tracing::debug!(lock = %name, node = %slot.addr(), %error, "redlock: a node missed the release; its key ends with the TTL");
                    }
                }
            });
        }
        if deleted > 0 {
            if !failed.is_empty() {
                tracing::debug!(lock = %self.name, failed = %failed.join("; "), "redlock: some nodes missed the release; their keys end with the TTL");
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
    /// and the validity left. A quorum makes the new validity `start + ttl - drift`; a failure
    /// deletes nothing. When a quorum can no longer be reached (the key is gone from too many
    /// nodes) it is `NotHeld`; otherwise `Unavailable`, and a renewed guard is suspended until
    /// the validity it still has.
    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        let config = &self.inner.config;
        let (n, quorum) = (self.inner.slots.len(), config.quorum());
        let started = Instant::now();
        let current = self.valid_until();
        let left = current.saturating_duration_since(started);
        if left.is_zero() {
            return Err(LockError::Lost {
                name: self.name.to_string(),
                reason: LostReason::RenewalFailed,
            });
        }
        let timeout = config.node_timeout_for(ttl).min(left);
        let replies = join_all(self.inner.slots.iter().map(|slot| async move {
            slot.get()?
                .extend(&self.keys, &self.owner, ttl, timeout)
                .await
        }))
        .await;
        let extended = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let gone = replies.iter().filter(|r| matches!(r, Ok(false))).count();
        if extended >= quorum && Instant::now() < current {
            let valid_until = after(started, ttl.saturating_sub(config.drift_for(ttl)));
            *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = valid_until;
            self.session.resume();
            return Ok(valid_until);
        }
        if gone > n - quorum {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        if self.renewed {
            self.session
                .suspend_with(current, LostReason::RenewalFailed);
        }
        let failed: Vec<String> = replies
            .iter()
            .zip(&self.inner.slots)
            .filter_map(|(r, slot)| r.as_ref().err().map(|e| format!("{}: {e}", slot.addr())))
            .collect();
        Err(LockError::unavailable_because(
            BACKEND,
            format!(
                "extend of `{}` reached {extended} of {n} nodes, {quorum} needed ({})",
                self.name,
                failed.join("; ")
            ),
        ))
    }

    fn guard_timer(&self) -> Option<&dlock_api::raw::GuardTimer> {
        Some(&self.inner.timer)
    }
}

impl fmt::Debug for RedlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.keys.lock)
            .finish_non_exhaustive()
    }
}
