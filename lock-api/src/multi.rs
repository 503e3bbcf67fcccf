//! Several locks at once: every caller takes a set's names in one order (sorted, each once), the
//! whole set waits within one deadline, and a set that cannot be completed leaves nothing held.
//!
//! Taking two locks in the caller's order is how two transfers between the same two accounts,
//! in opposite directions, deadlock (redisson/redisson #1160); giving each member the full wait
//! makes a set of five wait five times the timeout (Curator's `InterProcessMultiLock`). Here the
//! order is the names' own, the deadline is the set's, and a timeout, an error, a lost member or
//! a dropped future releases every member already taken (owner-checked, in reverse order).

use std::fmt;
use std::future::Future;

use futures::future::select_all;
use tokio::time::Instant;

use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::name::LockName;
use crate::options::LockOptions;
use crate::raw::time::deadline;
use crate::status::LostReason;
use crate::token::FencingToken;

/// Every lock of a set, held together (see
/// [`DistributedLockExt::acquire_all`](crate::DistributedLockExt::acquire_all)). The set is
/// lost when any member is; releasing it releases every member, last taken first.
#[must_use = "if unused every lock of the set is released immediately"]
pub struct LockSet {
    /// In the names' order, which is the order they were taken in.
    guards: Vec<LockGuard>,
}

impl LockSet {
    /// The members' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &LockName> {
        self.guards.iter().map(LockGuard::name)
    }

    /// The members' guards, in the names' order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The members' guards, in the names' order, each to hold or release on its own: the set
    /// no longer ties them (a member lost no longer loses the others).
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }

    /// The fencing token of `name`'s member, if `name` is in the set.
    pub fn fencing_token(&self, name: &LockName) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|guard| guard.name() == name)
            .map(LockGuard::fencing_token)
    }

    /// Each member's name and fencing token, in the names' order: send each resource the token
    /// of its own name.
    pub fn fencing_tokens(&self) -> Vec<(LockName, FencingToken)> {
        self.guards
            .iter()
            .map(|guard| (guard.name().clone(), guard.fencing_token()))
            .collect()
    }

    /// Whether every member is still held, as far as this client knows.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any member is lost, with its name and the reason.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes the guards.
    pub async fn lost(&self) -> (LockName, LostReason) {
        let members = self
            .guards
            .iter()
            .map(|guard| Box::pin(async move { (guard.name().clone(), guard.lost().await) }));
        select_all(members).await.0
    }

    /// Releases every member, the last taken first, and waits for the server to confirm each.
    ///
    /// # Errors
    /// The first member's error, as [`LockGuard::release`] reports it; every member is released
    /// (or attempted) whatever the others answer.
    ///
    /// # Cancel safety
    /// Cancel safe: each release runs to completion in the background if this is dropped.
    pub async fn release(mut self) -> Result<()> {
        release_in_reverse(&mut self.guards).await
    }
}

/// What [`DistributedLock::try_acquire_at_once`] found: the set taken in one step of the server,
/// or nothing taken.
#[derive(Debug)]
#[non_exhaustive]
pub enum AtOnce {
    /// Every member, taken together.
    Taken(LockSet),
    /// A member is held by someone else: none was taken.
    Busy,
    /// The backend has no one step for this set: take its names one by one.
    OneByOne,
}

/// A set of one lock, for code that holds one or several alike.
impl From<LockGuard> for LockSet {
    fn from(guard: LockGuard) -> Self {
        Self {
            guards: vec![guard],
        }
    }
}

impl fmt::Debug for LockSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.guards.iter()).finish()
    }
}

/// Releases `guards` last first; all are released, the first error is returned.
async fn release_in_reverse(guards: &mut Vec<LockGuard>) -> Result<()> {
    let mut first_error = None;
    while let Some(guard) = guards.pop() {
        if let Err(error) = guard.release().await {
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The set's names in the one order every caller uses: sorted, each once.
fn ordered(names: &[LockName]) -> Result<Vec<LockName>> {
    if names.is_empty() {
        return Err(LockError::invalid("names", "a set of locks needs a name"));
    }
    let mut ordered = names.to_vec();
    ordered.sort();
    ordered.dedup();
    Ok(ordered)
}

/// [`DistributedLockExt::acquire_all`](crate::DistributedLockExt::acquire_all).
pub(crate) async fn acquire_all<L: DistributedLock + ?Sized>(
    locks: &L,
    names: &[LockName],
    options: &LockOptions,
) -> Result<LockSet> {
    options.validate()?;
    let names = ordered(names)?;
    let started = Instant::now();
    let until = deadline(started, options.wait_timeout());
    // A set free at once costs one step where the backend has one; a busy one waits member by
    // member, in the names' order, as on every backend.
    if let AtOnce::Taken(set) = locks.try_acquire_at_once(&names, options).await? {
        return Ok(set);
    }
    // Dropped with the future at any await: every member taken so far is released in the
    // background by its guard's drop.
    let mut taken = Vec::with_capacity(names.len());
    for name in &names {
        let member = match until {
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                options.clone().with_wait_timeout(left)
            }
            None => options.clone(),
        };
        let outcome = match locks.acquire(name, &member).await {
            Ok(guard) if guard.is_held() => Ok(guard),
            Ok(guard) => Err(LockError::Lost {
                name: name.to_string(),
                reason: guard.lost_reason().unwrap_or(LostReason::Expired),
            }),
            Err(LockError::Timeout { name, .. }) => Err(LockError::Timeout {
                name,
                waited: started.elapsed(),
            }),
            Err(error) => Err(error),
        };
        match outcome {
            Ok(guard) => taken.push(guard),
            Err(error) => {
                let _ = release_in_reverse(&mut taken).await;
                return Err(error);
            }
        }
    }
    complete(taken).await
}

/// [`DistributedLockExt::try_acquire_all`](crate::DistributedLockExt::try_acquire_all).
pub(crate) async fn try_acquire_all<L: DistributedLock + ?Sized>(
    locks: &L,
    names: &[LockName],
    options: &LockOptions,
) -> Result<Option<LockSet>> {
    options.validate()?;
    let names = ordered(names)?;
    match locks.try_acquire_at_once(&names, options).await? {
        AtOnce::Taken(set) => return Ok(Some(set)),
        AtOnce::Busy => return Ok(None),
        AtOnce::OneByOne => {}
    }
    let mut taken = Vec::with_capacity(names.len());
    for name in &names {
        match locks.try_acquire(name, options).await {
            Ok(Some(guard)) => taken.push(guard),
            Ok(None) => {
                let _ = release_in_reverse(&mut taken).await;
                return Ok(None);
            }
            Err(error) => {
                let _ = release_in_reverse(&mut taken).await;
                return Err(error);
            }
        }
    }
    complete(taken).await.map(Some)
}

/// The set, if no member was lost while the later ones were taken; else every member released
/// and the loss reported.
pub(crate) async fn complete(mut taken: Vec<LockGuard>) -> Result<LockSet> {
    if let Some(lost) = taken.iter().find(|guard| !guard.is_held()) {
        let error = LockError::Lost {
            name: lost.name().to_string(),
            reason: lost.lost_reason().unwrap_or(LostReason::Expired),
        };
        let _ = release_in_reverse(&mut taken).await;
        return Err(error);
    }
    Ok(LockSet { guards: taken })
}

/// Runs `work` while `set` holds every member, releasing after; the work is dropped at its next
/// await point if any member is lost.
pub(crate) async fn hold_all_while<F, Fut, T>(set: LockSet, work: F) -> Result<T>
where
    F: FnOnce(Vec<(LockName, FencingToken)>) -> Fut,
    Fut: Future<Output = T>,
{
    let tokens = set.fencing_tokens();
    let outcome = tokio::select! {
        biased;
        (name, reason) = set.lost() => Err((name, reason)),
        output = work(tokens) => Ok(output),
    };
    match outcome {
        Ok(output) => {
            set.release().await?;
            Ok(output)
        }
        Err((name, reason)) => {
            let _ = set.release().await;
            Err(LockError::Lost {
                name: name.to_string(),
                reason,
            })
        }
    }
}
