//! `RedisLease`: owner-checked release and extend of one held lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{RawLease, Scheduled};
use dlock_api::{LockError, LockName, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::keys::LockKeys;

pub(crate) struct RedisLease {
    inner: Arc<Inner>,
    name: LockName,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    /// Taken with nobody queued: the release first tries the script without the hand-off. A
    /// lock granted after a wait goes straight to the hand-off, as others likely wait too.
    taken_uncontended: bool,
    /// The start of the watch on the held lock (`held.rs`), until it comes due.
    _watch: Option<Scheduled>,
}

impl RedisLease {
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        taken_uncontended: bool,
        watch: Option<Scheduled>,
    ) -> Self {
        Self {
            inner,
            name,
            keys,
            owner,
            taken_uncontended,
            _watch: watch,
        }
    }

    /// Runs `script` (the cancel) with the name's four keys, for `owner`.
    async fn run(
        inner: &Inner,
        script: &redis::Script,
        keys: &LockKeys,
        owner: &str,
    ) -> Result<i64> {
        let names = [
            keys.lock.as_str(),
            keys.fence.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
        ];
        Self::run_with(inner, script, &names, &[owner, keys.channel.as_str()]).await
    }

    async fn run_with(
        inner: &Inner,
        script: &redis::Script,
        names: &[&str],
        args: &[&str],
    ) -> Result<i64> {
        let attempt = || {
            inner
                .conn
                .run_script(inner.config.command_timeout, script, names, args)
        };
        match attempt().await {
            // A Sentinel connection that found its primary gone has switched to the new one:
            // every release script checks the owner, so running one again there is safe, and a
            // release that would otherwise fail leaves the lock held until its TTL.
            Err(error) if error.is_retryable() && inner.conn.follows_failover() => attempt().await,
            done => done,
        }
    }

    /// Releases `owner`'s hold, handing the lock to the next live waiter. True if it was held
    /// (also when this is the second arrival of a release whose first one released it, where
    /// releases are marked).
    async fn release_script(&self) -> Result<bool> {
        let (inner, keys, owner) = (&self.inner, &self.keys, &*self.owner);
        let marks = inner.scripts.marks_releases;
        if self.taken_uncontended {
            let names = [keys.lock.as_str(), keys.released_by.as_str()];
            let names = if marks { &names[..] } else { &names[..1] };
            match Self::run_with(inner, &inner.scripts.release_uncontended, names, &[owner]).await?
            {
                // Waiters queued while it was held (they marked it): the full release hands it over.
                2 => {}
                released => return Ok(released == 1),
            }
        }
        let names = [
            keys.lock.as_str(),
            keys.fence.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
            keys.released_by.as_str(),
        ];
        let names = if marks { &names[..] } else { &names[..4] };
        let args = [owner, keys.channel.as_str()];
        Ok(Self::run_with(inner, &inner.scripts.release, names, &args).await? == 1)
    }

    /// Ends `owner`'s wait: leaves the queue, or, if a release granted it the lock meanwhile,
    /// releases it onward.
    pub(crate) async fn cancel(inner: &Inner, keys: &LockKeys, owner: &str) -> Result<()> {
        Self::run(inner, &inner.scripts.cancel, keys, owner)
            .await
            .map(drop)
    }

    /// The cleanup of a cancelled acquire: whatever the server did with `owner` (took the lock,
    /// queued it, granted it the lock), undo it.
    pub(crate) fn spawn_cleanup(inner: Arc<Inner>, keys: Arc<LockKeys>, owner: Arc<str>) {
        dlock_api::raw::spawn_cleanup(async move {
            if let Err(error) = Self::cancel(&inner, &keys, &owner).await {
                tracing::warn!(key = %keys.lock, %error, "redis: cleanup of a cancelled acquire failed; the lease will end on its own");
            }
        });
    }

    /// The cleanup of an acquire whose reply never came (a command timeout, a broken
    /// connection). Its script may still run, late: a stalled server runs it when it wakes, and
    /// after a reconnect it may arrive on the old connection after the cancel on the new one.
    /// So the cancel runs once as [`spawn_cleanup`](Self::spawn_cleanup)'s does, then again
    /// every command timeout until the server answers (for at most `ttl`, by when a lock the
    /// script took in time has ended anyway), and once more after that answer.
    ///
    /// Only the first cancel counts for `settle`: a program on its way out does not wait for a
    /// server that may not come back. The later ones stop when the client is dropped.
    pub(crate) fn spawn_cleanup_of_lost_reply(
        inner: Arc<Inner>,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        ttl: Duration,
    ) {
        dlock_api::raw::spawn_cleanup(async move {
            let mut answered = Self::cancel(&inner, &keys, &owner).await.is_ok();
            let (inner, every) = (Arc::downgrade(&inner), inner.config.command_timeout);
            let give_up = after(Instant::now(), ttl);
            tokio::spawn(async move {
                loop {
                    if !answered && Instant::now() >= give_up {
                        tracing::warn!(key = %keys.lock, "redis: the server did not answer the cleanup of an acquire whose reply was lost; a late lock will end with its lease");
                        return;
                    }
                    tokio::time::sleep(every).await;
                    let Some(inner) = inner.upgrade() else { return };
                    let ok = Self::cancel(&inner, &keys, &owner).await.is_ok();
                    if answered {
                        return;
                    }
                    answered = ok;
                }
            });
        });
    }
}

#[async_trait]
impl RawLease for RedisLease {
    async fn release(&self) -> Result<()> {
        if self.release_script().await? {
            Ok(())
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        let inner = &self.inner;
        let sent = Instant::now();
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let extended: i64 = inner
            .conn
            .run_script(
                inner.config.command_timeout,
                &inner.scripts.extend,
                &[&self.keys.lock],
                &[&self.owner, &ttl_ms],
            )
            .await?;
        if extended == 1 {
            Ok(after(sent, ttl))
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    fn guard_timer(&self) -> Option<&dlock_api::raw::GuardTimer> {
        Some(&self.inner.timer)
    }
}

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("key", &self.keys.lock)
            .finish_non_exhaustive()
    }
}
