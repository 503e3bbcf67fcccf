//! `RedisLease`: owner-checked release and extend of one held lock, semaphore permit or reader's
//! share.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{RawLease, RecordAtGrant, RenewBatch, Scheduled};
use dlock_api::{FencingToken, LockError, LockName, Result};
use tokio::time::Instant;

use crate::client::Inner;
use crate::keys::LockKeys;

/// When a lease the server set (or extended) to `ttl`, by a request sent at `sent`, ends by this
/// client's clock: `ttl` after `sent`, less a drift allowance of 1% of `ttl` and 2 ms, as
/// Redlock's validity time has. The server times the key on its own wall clock from when it
/// ran the request, which is after `sent`; the allowance is for that clock running ahead of
/// ours, so that the guard's deadline errs early, never late.
pub(crate) fn lease_end(sent: Instant, ttl: Duration) -> Instant {
    let drift = ttl
        .checked_div(100)
        .unwrap_or_default()
        .saturating_add(Duration::from_millis(2));
    after(sent, ttl.saturating_sub(drift))
}

/// When a grant announced to a waiter (`granted OWNER TOKEN`) ends by this client's clock, if
/// enough of it is certain to take it as it is; `None` sends the waiter to ask the server.
///
/// `last_busy` is the waiter's latest attempt that found no room: when it was sent, and the
/// last token the name had handed out when the server ran it. A grant with a higher token was
/// made after that attempt was sent, so its lease of `ttl` runs at least until then plus `ttl`.
/// When the message *arrived* says nothing of when the grant was made: it may have sat in the
/// socket of a paused process. A grant with a token no higher was made before the server ran
/// the attempt, which found no room for this owner: that grant has already ended. And a lease
/// with less than half its TTL certain left is asked about again rather than trusted.
pub(crate) fn announced_grant_end(
    last_busy: Option<(Instant, u64)>,
    token: u64,
    ttl: Duration,
) -> Option<Instant> {
    last_busy
        .filter(|&(_, fence)| token > fence)
        .map(|(sent, _)| lease_end(sent, ttl))
        .filter(|until| {
            until.saturating_duration_since(Instant::now())
                >= ttl.checked_div(2).unwrap_or_default()
        })
}

/// What an owner value holds, or may hold, of a name: which scripts release and renew it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// The lock. `uncontended`: taken with nobody queued, so the release first tries the
    /// script without the hand-off. A lock granted after a wait goes straight to the hand-off,
    /// as others likely wait too.
    Lock { uncontended: bool },
    /// One permit of a semaphore (`scripts/permits.rs`).
    Permit,
    /// A reader's share of a reader-writer lock (`scripts/readers.rs`): a member of the same set
    /// as a permit, released, renewed and given up as one.
    Reader,
}

pub(crate) struct RedisLease {
    inner: Arc<Inner>,
    name: LockName,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Arc<str>,
    pub(crate) hold: Hold,
    /// Whether this lease has (or may have) written the name's leader record: set before its
    /// first proclaim is sent, after which its renewals keep the record as long as the lock
    /// and its release ends it (`scripts/election.rs`).
    proclaimed: AtomicBool,
    /// The term and value of the record the grant wrote (a campaign's), until the first
    /// proclaim, which then need not write it again.
    written_at_grant: RecordAtGrant,
    /// The start of the watch on the held lock (`held.rs`), until it comes due.
    _watch: Option<Scheduled>,
}

impl RedisLease {
    pub(crate) fn new(
        inner: Arc<Inner>,
        name: LockName,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        hold: Hold,
        watch: Option<Scheduled>,
    ) -> Self {
        Self {
            inner,
            name,
            keys,
            owner,
            hold,
            proclaimed: AtomicBool::new(false),
            written_at_grant: RecordAtGrant::default(),
            _watch: watch,
        }
    }

    /// This lease, whose grant wrote the leader record `value` with the term `term`: its
    /// renewals keep the record and its release ends it, and a first proclaim of the same term
    /// and value is done.
    pub(crate) fn with_record(self, term: u64, value: Arc<[u8]>) -> Self {
        self.proclaimed.store(true, Ordering::SeqCst);
        self.written_at_grant.wrote(term, value);
        self
    }

    /// The answer of an extend or release that found the lock no longer this lease's.
    pub(crate) fn not_held(&self) -> LockError {
        LockError::NotHeld {
            name: self.name.to_string(),
        }
    }

    /// Whether this lease has (or may have) written the name's leader record: the lock's watch
    /// (`held.rs`) then vacates it when it finds the lock gone.
    pub(crate) fn proclaimed(&self) -> bool {
        self.proclaimed.load(Ordering::SeqCst)
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

    /// Gives `owner`'s permit back and takes it out of the name's queue, granting the room to
    /// the live waiters at its head. True if the permit was live (also when this is the second
    /// arrival of a release whose first one gave it back, where releases are marked).
    /// `leaving`: a wait ends, so the owner may still be queued (a holder's owner is not: it
    /// left the queue when it was granted).
    async fn release_permit(
        inner: &Inner,
        keys: &LockKeys,
        owner: &str,
        leaving: bool,
    ) -> Result<bool> {
        let (permits, mark) = (keys.permits(), keys.permit_released_by(owner));
        let names = [
            keys.lock.as_str(),
            permits.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
            keys.fence.as_str(),
            mark.as_str(),
        ];
        let names = match inner.scripts.marks_releases {
            true => &names[..],
            false => &names[..5],
        };
        let args = [
            owner,
            keys.channel.as_str(),
            if leaving { "1" } else { "0" },
        ];
        Ok(Self::run_with(inner, &inner.scripts.release_permit, names, &args).await? == 1)
    }

    /// Releases `owner`'s hold, handing a lock to the next live waiter. True if it was held
    /// (also when this is the second arrival of a lock's release whose first one released it,
    /// where releases are marked).
    async fn release_script(&self) -> Result<bool> {
        let (inner, keys, owner) = (&self.inner, &self.keys, &*self.owner);
        let uncontended = match self.hold {
            Hold::Permit | Hold::Reader => {
                return Self::release_permit(inner, keys, owner, false).await;
            }
            Hold::Lock { uncontended } => uncontended,
        };
        let marks = inner.scripts.marks_releases;
        if self.proclaimed.load(Ordering::SeqCst) {
            return self.release_leader().await;
        }
        if uncontended {
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

    /// The release of a lease that proclaimed: the lock's full release, which also deletes the
    /// leader record and tells observers; a record of its own goes even when the lock is no
    /// longer its.
    async fn release_leader(&self) -> Result<bool> {
        let (inner, keys, owner) = (&self.inner, &self.keys, &*self.owner);
        let leader = keys.leader();
        let names = [
            keys.lock.as_str(),
            keys.fence.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
            leader.as_str(),
            keys.released_by.as_str(),
        ];
        let names = if inner.scripts.marks_releases {
            &names[..]
        } else {
            &names[..5]
        };
        let args = [owner, keys.channel.as_str()];
        Ok(Self::run_with(inner, &inner.scripts.release_leader, names, &args).await? == 1)
    }

    /// Ends `owner`'s wait: leaves the queue, or, if a release granted it the lock meanwhile,
    /// releases it onward; for a permit or a reader, leaves the queue and gives back a permit or
    /// share it may have been granted.
    pub(crate) async fn cancel(
        inner: &Inner,
        keys: &LockKeys,
        owner: &str,
        hold: Hold,
    ) -> Result<()> {
        match hold {
            Hold::Lock { .. } => Self::run(inner, &inner.scripts.cancel, keys, owner)
                .await
                .map(drop),
            Hold::Permit | Hold::Reader => Self::release_permit(inner, keys, owner, true)
                .await
                .map(drop),
        }
    }

    /// The cleanup of a cancelled acquire: whatever the server did with `owner` (took the lock,
    /// queued it, granted it the lock or a permit), undo it.
    pub(crate) fn spawn_cleanup(
        inner: Arc<Inner>,
        keys: Arc<LockKeys>,
        owner: Arc<str>,
        hold: Hold,
    ) {
        dlock_api::raw::spawn_cleanup(async move {
            if let Err(error) = Self::cancel(&inner, &keys, &owner, hold).await {
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
        hold: Hold,
        ttl: Duration,
    ) {
        dlock_api::raw::spawn_cleanup(async move {
            let mut answered = Self::cancel(&inner, &keys, &owner, hold).await.is_ok();
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
                    let ok = Self::cancel(&inner, &keys, &owner, hold).await.is_ok();
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
        let timeout = inner.config.command_timeout;
        let args = [&*self.owner, &ttl_ms];
        let extended: i64 = match self.hold {
            Hold::Lock { .. } if self.proclaimed.load(Ordering::SeqCst) => {
                let leader = self.keys.leader();
                let names = [self.keys.lock.as_str(), leader.as_str()];
                let args = [&*self.owner, &ttl_ms, &self.keys.channel];
                let script = &inner.scripts.extend_leader;
                inner
                    .conn
                    .run_script(timeout, script, &names, &args)
                    .await?
            }
            Hold::Lock { .. } => {
                let names = [self.keys.lock.as_str()];
                let script = &inner.scripts.extend;
                inner
                    .conn
                    .run_script(timeout, script, &names, &args)
                    .await?
            }
            Hold::Permit | Hold::Reader => {
                let permits = self.keys.permits();
                let names = [self.keys.lock.as_str(), permits.as_str()];
                let script = &inner.scripts.extend_permit;
                inner
                    .conn
                    .run_script(timeout, script, &names, &args)
                    .await?
            }
        };
        if extended == 1 {
            Ok(lease_end(sent, ttl))
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    /// One script: the record is written only if this lease holds the lock, and observers are
    /// told (`scripts/election.rs`). A permit or a reader's share leads nothing: its proclaim is
    /// refused.
    async fn proclaim(&self, term: FencingToken, value: &[u8]) -> Result<()> {
        if !matches!(self.hold, Hold::Lock { .. }) {
            return Err(LockError::Unsupported {
                backend: crate::BACKEND,
                operation: "elections on a semaphore's permit or a reader's share",
            });
        }
        if self.written_at_grant.answers(term, value) {
            return Ok(());
        }
        // Before the script is sent: once it may have run, renewal and release must keep and
        // end the record.
        self.proclaimed.store(true, Ordering::SeqCst);
        let inner = &self.inner;
        let leader = self.keys.leader();
        let term = term.get().to_string();
        let names = [self.keys.lock.as_str(), leader.as_str()];
        let args = [
            self.owner.as_bytes(),
            term.as_bytes(),
            value,
            self.keys.channel.as_bytes(),
        ];
        let script = &inner.scripts.proclaim;
        let attempt = || {
            inner
                .conn
                .run_script_bytes(inner.config.command_timeout, script, &names, &args)
        };
        let proclaimed: i64 = match attempt().await {
            // As a release after a failover: the script checks the owner, so it may run again.
            Err(error) if error.is_retryable() && inner.conn.follows_failover() => {
                attempt().await?
            }
            done => done?,
        };
        if proclaimed == 1 {
            Ok(())
        } else {
            Err(LockError::NotHeld {
                name: self.name.to_string(),
            })
        }
    }

    fn guard_timer(&self) -> Option<&dlock_api::raw::GuardTimer> {
        Some(&self.inner.timer)
    }

    fn renewal_batch(&self) -> Option<(Arc<dyn RenewBatch>, &(dyn Any + Send + Sync))> {
        Some((self.inner.clone(), self))
    }
}

impl fmt::Debug for RedisLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("key", &self.keys.lock)
            .finish_non_exhaustive()
    }
}
