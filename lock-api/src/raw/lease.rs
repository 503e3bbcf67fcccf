//! What a backend's hold on one lock can do ([`RawLease`]), who renews it ([`RenewedBy`]), and
//! the background release of a dropped guard.

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::Result;

/// Who keeps a granted lease alive while the guard is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewedBy {
    /// The shared watchdog, one per guard, calling [`RawLease::extend`] (a TTL per lock: Redis,
    /// memory).
    Guard,
    /// The backend's session, for all its guards at once (a SQL connection, an etcd keep-alive
    /// stream, a ZooKeeper heartbeat): no per-guard watchdog.
    Session,
    /// Nobody: the lease ends at its deadline unless extended by hand.
    Nobody,
}

/// A backend's hold on one lock: the operations a [`LockGuard`](crate::LockGuard) delegates to.
///
/// Both methods may be called from the watchdog task while the guard is elsewhere, hence `&self`.
#[async_trait]
pub trait RawLease: Debug + Send + Sync + 'static {
    /// Releases the lock if this lease still owns it.
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if someone else holds it now or
    /// nobody does; it must never touch another holder's lock.
    ///
    /// The guard runs it inside a [`Detach`](super::Detach), so it always runs to completion even when the
    /// caller of `release()` is dropped: keep the client's own bookkeeping of the release in it.
    async fn release(&self) -> Result<()>;

    /// Resets the lease to `ttl` if this lease still owns the lock, and returns the validity it
    /// obtained: the instant the lease ends by this client's clock, measured from *before* the
    /// request was sent (`raw::time::after(sent, ttl)`), or less where the backend must allow for
    /// drift (Redlock) or was granted a different TTL (etcd).
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if the lock is gone or owned by
    /// someone else, [`LockError::Unsupported`](crate::LockError::Unsupported) on backends without
    /// leases to extend.
    async fn extend(&self, ttl: Duration) -> Result<Instant>;

    /// Publishes `value` as the leader's value of this lease's name for `term` (this lease's
    /// fencing token), **if this lease still holds the name**, and tells the name's observers:
    /// what [`Leadership::proclaim`](crate::Leadership::proclaim) and a campaign's first
    /// publication run. Backends with elections (`Capabilities::elections`) implement it; the
    /// default answers [`LockError::Unsupported`](crate::LockError::Unsupported).
    ///
    /// Returns [`LockError::NotHeld`](crate::LockError::NotHeld) if the lease no longer holds
    /// the name: a deposed leader's value must never replace its successor's.
    async fn proclaim(&self, term: crate::FencingToken, value: &[u8]) -> Result<()> {
        let _ = (term, value);
        Err(crate::LockError::Unsupported {
            backend: "this backend",
            operation: "elections",
        })
    }

    /// The client's [`GuardTimer`](super::GuardTimer), if it keeps one: a guard that renews
    /// its own lease then starts its watchdog only when the first renewal comes due, instead of
    /// spawning a task the moment it is granted. The default (`None`) spawns at once, which is
    /// correct but costs a task per guard.
    fn guard_timer(&self) -> Option<&super::GuardTimer> {
        None
    }

    /// Where this lease's renewals may go together with those of the client's other leases
    /// that come due at the same tick, and this lease as the batch will see it (the backend
    /// downcasts it to its own lease type). Only leases with a
    /// [`guard_timer`](Self::guard_timer) are renewed in batches. The default (`None`) renews
    /// each lease by its own [`extend`](Self::extend), still from the timer's one task per tick.
    fn renewal_batch(&self) -> Option<(Arc<dyn RenewBatch>, &(dyn Any + Send + Sync))> {
        None
    }
}

/// Renews many leases of one client in one exchange with the server: what
/// [`RawLease::renewal_batch`] returns. The timer groups the leases due at one tick by the
/// batch they name (the same `Arc`) and hands each group over in one call.
#[async_trait]
pub trait RenewBatch: Send + Sync + 'static {
    /// Extends each lease in `leases` (as [`RawLease::renewal_batch`] gave it) to its TTL,
    /// answering in the same order what that lease's [`extend`](RawLease::extend) would have.
    /// The answers must number as many as the leases: a lease left unanswered counts as a
    /// failed renewal.
    ///
    /// # Cancel safety
    ///
    /// Dropped when every lease of the batch has run out of validity: it must leave nothing
    /// half done that a later renewal or release would trip over (an owner-checked extend
    /// sent or not is either way harmless).
    async fn extend_batch(
        &self,
        leases: &[(&(dyn Any + Send + Sync), Duration)],
    ) -> Vec<Result<Instant>>;
}

/// The leases of a [`RenewBatch::extend_batch`] call that downcast to `L`, grouped by TTL and cut
/// into groups of at most `most`: what one renewal script may extend together. Each lease keeps
/// its position in the call, for [`batch_answers`]; the others (`None` from `pick`) are left out.
pub fn batch_groups<'a, L: 'static>(
    leases: &'a [(&'a (dyn Any + Send + Sync), Duration)],
    most: usize,
    pick: impl Fn(&'a L) -> bool,
) -> Vec<(Duration, Vec<(usize, &'a L)>)> {
    let mut by_ttl: std::collections::BTreeMap<Duration, Vec<(usize, &'a L)>> =
        std::collections::BTreeMap::new();
    for (index, &(lease, ttl)) in leases.iter().enumerate() {
        if let Some(lease) = lease.downcast_ref::<L>().filter(|&lease| pick(lease)) {
            by_ttl.entry(ttl).or_default().push((index, lease));
        }
    }
    by_ttl
        .into_iter()
        .flat_map(|(ttl, group)| {
            group
                .chunks(most.max(1))
                .map(|chunk| (ttl, chunk.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A batch's answers in the order of its `count` leases, from `(position, answer)` pairs in any
/// order; a lease no pair answers gets `unanswered()` (a failed renewal, as the
/// [`RenewBatch`] contract says).
pub fn batch_answers(
    count: usize,
    answered: impl IntoIterator<Item = (usize, Result<Instant>)>,
    unanswered: impl Fn() -> crate::LockError,
) -> Vec<Result<Instant>> {
    let mut answers: Vec<Option<Result<Instant>>> = (0..count).map(|_| None).collect();
    for (index, answer) in answered {
        if let Some(slot) = answers.get_mut(index) {
            *slot = Some(answer);
        }
    }
    answers
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|| Err(unanswered())))
        .collect()
}

/// Releases `lease` in the background: what dropping an unreleased guard does.
///
/// It never blocks (async drop does not exist, and `block_on` in `Drop` can deadlock a
/// runtime): with a tokio runtime it spawns the release (counted by [`settle`](super::settle));
/// without one it drops the lease, so a session backend closes its connection and a TTL
/// backend's lock ends at its TTL. Both paths log.
pub fn spawn_release(name: &str, lease: Arc<dyn RawLease>) {
    let owned_name = name.to_owned();
    let started = super::spawn_cleanup(async move {
        if let Err(error) = lease.release().await {
            tracing::warn!(name = %owned_name, %error, "background release of a dropped guard failed; the lease will end on its own");
        }
    });
    if !started {
        tracing::warn!(name = %name, "guard dropped outside a tokio runtime; the lock ends when its lease or session does");
    }
}
