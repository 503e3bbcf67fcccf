//! The shared renewal watchdog and maximum-hold enforcement: what happens to a guard's lease when
//! its renewal (or its maximum hold time) comes due. The client's [`GuardTimer`] decides when,
//! and hands over every renewal due at one tick at once; this file renews them together.

use std::any::Any;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::join_all;
use tokio::time::{Instant, sleep_until};

use super::lease::{RawLease, RenewBatch, spawn_release};
use super::state::LeaseState;
use super::time::{after, deadline};
use super::timer::{GuardTimer, Scheduled, Shared};
use crate::error::{LockError, Result};
use crate::observability;
use crate::status::LostReason;

/// The most a renewal is taken early to join the renewals of its tick: each lease is renewed up
/// to an eighth of its interval early, and never more than this.
pub(crate) const MAX_SLACK: Duration = Duration::from_millis(250);

/// The watchdog's settings for one guard.
pub(crate) struct Watch {
    pub(crate) name: crate::LockName,
    pub(crate) ttl: Duration,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) max_hold_until: Option<Instant>,
}

/// One guard's renewal between its turns: kept on its client's [`GuardTimer`] by its due time.
pub(crate) struct Renewing {
    watch: Watch,
    lease: Arc<dyn RawLease>,
    state: Arc<LeaseState>,
    next_renewal: Option<Instant>,
    /// The last renewal failed and the next is a retry: it waits its full delay, with no
    /// slack, or a failing backend would be asked again at once, over and over.
    retrying: bool,
}

impl Renewing {
    /// When it next needs its turn: its renewal, or its maximum hold time if that comes first.
    fn due(&self) -> Option<Instant> {
        match (self.next_renewal, self.watch.max_hold_until) {
            (Some(renewal), Some(max_hold)) => Some(renewal.min(max_hold)),
            (renewal, max_hold) => renewal.or(max_hold),
        }
    }

    fn renewal_ready(&self, now: Instant) -> bool {
        let slack = match self.retrying {
            true => Duration::ZERO,
            false => self
                .watch
                .renew_every
                .and_then(|every| every.checked_div(8))
                .unwrap_or_default()
                .min(MAX_SLACK),
        };
        self.next_renewal.is_some_and(|at| at <= after(now, slack))
    }

    /// Whether its turn has come at `now`: its maximum hold time passed, or its renewal is due
    /// within the slack (renewing a little early costs nothing but a little more traffic).
    pub(crate) fn ready(&self, now: Instant) -> bool {
        self.watch.max_hold_until.is_some_and(|at| at <= now) || self.renewal_ready(now)
    }

    fn ended(&self) -> bool {
        self.state.is_closed() || self.state.lost_token().is_cancelled()
    }

    /// The renewal did not answer before the lease ended.
    fn out_of_time(&self) {
        if self.ended() {
            return;
        }
        let error = LockError::unavailable_because(
            self.state.labels().map_or("", |labels| labels.backend),
            "the renewal did not finish before the lease ended",
        );
        observability::renewal(&self.state, Some((&error, false)));
        self.state.mark_lost(LostReason::RenewalFailed);
    }

    /// Applies a renewal's answer; false when the lock is lost. A retryable failure is retried
    /// soon while the lease has validity left; any other marks the lock lost (`TakenOver` when
    /// the server says someone else holds it).
    fn apply(&mut self, answer: Result<Instant>, started: Instant, deadline: Instant) -> bool {
        let Some(every) = self.watch.renew_every else {
            return true;
        };
        let state = &self.state;
        match answer {
            Ok(valid_until) => {
                observability::renewal(state, None);
                state.set_renewal_failing(false);
                state.set_valid_until(Some(valid_until));
                self.next_renewal = Some(after(started, every));
                self.retrying = false;
                true
            }
            Err(error) if error.is_retryable() && Instant::now() < deadline => {
                observability::renewal(state, Some((&error, true)));
                let remaining = deadline.saturating_duration_since(Instant::now());
                self.next_renewal = Some(after(
                    Instant::now(),
                    remaining
                        .checked_div(4)
                        .unwrap_or_default()
                        .clamp(Duration::from_millis(5), every),
                ));
                self.retrying = true;
                true
            }
            Err(error) => {
                let reason = match &error {
                    LockError::NotHeld { .. } => LostReason::TakenOver,
                    LockError::Lost { reason, .. } => *reason,
                    _ => LostReason::RenewalFailed,
                };
                observability::renewal(state, Some((&error, false)));
                state.mark_lost(reason);
                false
            }
        }
    }
}

/// Starts the watchdog if `watch` asks for renewal or a maximum hold time: on the lease's
/// [`GuardTimer`] where it has one (the returned handle takes it off when the guard lets go),
/// or on a task of its own.
///
/// It renews every `renew_every` (a third of the TTL by default). A renewal that fails with a
/// retryable error is retried quickly until the lease's validity runs out, then the lock is marked
/// lost (`RenewalFailed`); any other failure marks it lost at once (`TakenOver` when the server says
/// someone else holds it). At the maximum hold time it marks the lock lost and releases it.
pub(crate) fn start_watchdog(
    watch: Watch,
    lease: Arc<dyn RawLease>,
    state: Arc<LeaseState>,
) -> Option<Scheduled> {
    let next_renewal = watch.renew_every.map(|every| after(Instant::now(), every));
    let renewing = Renewing {
        watch,
        lease,
        state,
        next_renewal,
        retrying: false,
    };
    let first = renewing.due()?;
    let lease = renewing.lease.clone();
    if let Some(timer) = lease.guard_timer() {
        return GuardTimer::schedule_renewal(timer, first, renewing);
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(name = %renewing.watch.name, "no tokio runtime: the lock will not be renewed");
        return None;
    };
    handle.spawn(watch_alone(Box::new(renewing)));
    None
}

/// The watchdog of a lease whose client keeps no timer: a task of its own, until the guard is
/// closed or lost.
async fn watch_alone(mut renewing: Box<Renewing>) {
    let state = renewing.state.clone();
    let run = async move {
        while let Some(due) = renewing.due() {
            sleep_until(due).await;
            match renew_batch(vec![((), renewing)]).await.pop() {
                Some(((), Some(next))) => renewing = next,
                _ => return,
            }
        }
    };
    tokio::select! {
        _ = state.closed() => {}
        _ = state.lost_token().cancelled() => {}
        _ = run => {}
    }
}

/// One tick's renewals, taken from the timer behind `shared`: renews them together and puts
/// back those still held.
pub(crate) async fn renew_due(shared: Weak<Shared>, batch: Vec<(u64, Box<Renewing>)>) {
    let done = renew_batch(batch).await;
    // The timer is gone with its client: nothing to renew for any more.
    let Some(shared) = shared.upgrade() else {
        return;
    };
    for (id, renewing) in done {
        match renewing.and_then(|renewing| Some((renewing.due()?, renewing))) {
            Some((due, renewing)) => shared.requeue(id, due, renewing),
            None => shared.finished(id),
        }
    }
}

/// Takes each of `batch` through its turn: ends those past their maximum hold time, renews the
/// others that are due, all in one exchange per backend batch. Each comes back with its next
/// turn, or `None` when its guard is done (closed, lost, or lost now).
async fn renew_batch<T>(batch: Vec<(T, Box<Renewing>)>) -> Vec<(T, Option<Box<Renewing>>)> {
    let now = Instant::now();
    let mut done = Vec::with_capacity(batch.len());
    let mut due = Vec::with_capacity(batch.len());
    for (tag, renewing) in batch {
        if renewing.ended() {
            done.push((tag, None));
        } else if renewing.watch.max_hold_until.is_some_and(|at| at <= now) {
            // The loss event says why; the release needs no event of its own.
            if renewing.state.mark_lost(LostReason::MaxHoldExceeded) {
                spawn_release(renewing.watch.name.as_str(), renewing.lease.clone());
            }
            done.push((tag, None));
        } else if renewing.renewal_ready(now) {
            due.push((tag, renewing));
        } else {
            done.push((tag, Some(renewing)));
        }
    }
    if due.is_empty() {
        return done;
    }
    let started = Instant::now();
    // A renewal that cannot finish before its lease ends is pointless: each is bounded by its
    // deadline, and until it succeeds counts as failing, so a deadline passing meanwhile is a
    // renewal failure, not a plain expiry.
    let deadlines: Vec<Instant> = due
        .iter()
        .map(|(_, renewing)| {
            renewing.state.set_renewal_failing(true);
            (renewing.state.valid_until()).unwrap_or(after(started, renewing.watch.ttl))
        })
        .collect();
    let mut by_deadline: Vec<usize> = (0..due.len()).collect();
    by_deadline.sort_by_key(|&index| deadlines.get(index).copied());
    let mut expired = 0usize;
    let answers = {
        let leases: Vec<&Renewing> = due.iter().map(|(_, renewing)| &**renewing).collect();
        let extend = extend_all(&leases);
        tokio::pin!(extend);
        loop {
            let Some(next) = by_deadline
                .get(expired)
                .and_then(|&index| deadlines.get(index))
            else {
                break None;
            };
            tokio::select! {
                answers = &mut extend => break Some(answers),
                _ = sleep_until(*next) => {
                    let now = Instant::now();
                    while let Some(&index) = by_deadline.get(expired) {
                        if deadlines.get(index).is_none_or(|&at| at > now) {
                            break;
                        }
                        if let Some(renewing) = leases.get(index) {
                            renewing.out_of_time();
                        }
                        expired = expired.saturating_add(1);
                    }
                }
            }
        }
    };
    let mut answers = answers.map(Vec::into_iter);
    for ((tag, mut renewing), deadline) in due.into_iter().zip(deadlines) {
        let answer = answers.as_mut().and_then(Iterator::next);
        let keep = match answer {
            // Closed meanwhile, or its deadline passed before the batch answered (marked lost).
            _ if renewing.ended() => false,
            Some(answer) => renewing.apply(answer, started, deadline),
            None => renewing.apply(Err(no_answer(&renewing)), started, deadline),
        };
        done.push((tag, keep.then_some(renewing)));
    }
    done
}

fn no_answer(renewing: &Renewing) -> LockError {
    LockError::unavailable_because(
        renewing.state.labels().map_or("", |labels| labels.backend),
        "the backend's batch renewal gave no answer for this lease",
    )
}

/// Extends every lease of `leases`, in order: those naming one [`RenewBatch`] in one call to it,
/// the others each by its own `extend`, all at once.
async fn extend_all(leases: &[&Renewing]) -> Vec<Result<Instant>> {
    type Group<'a> = (
        Arc<dyn RenewBatch>,
        Vec<usize>,
        Vec<(&'a (dyn Any + Send + Sync), Duration)>,
    );
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut alone = Vec::new();
    for (index, renewing) in leases.iter().enumerate() {
        let Some((batch, lease)) = renewing.lease.renewal_batch() else {
            alone.push(index);
            continue;
        };
        let ttl = renewing.watch.ttl;
        match groups
            .iter_mut()
            .find(|(known, ..)| std::ptr::addr_eq(Arc::as_ptr(known), Arc::as_ptr(&batch)))
        {
            Some((_, indices, items)) => {
                indices.push(index);
                items.push((lease, ttl));
            }
            None => groups.push((batch, vec![index], vec![(lease, ttl)])),
        }
    }
    let batched = join_all(
        groups
            .iter()
            .map(|(batch, _, items)| batch.extend_batch(items)),
    );
    let single = join_all(alone.iter().filter_map(|&index| {
        let renewing = leases.get(index)?;
        Some(renewing.lease.extend(renewing.watch.ttl))
    }));
    let (batched, single) = futures::join!(batched, single);
    let mut answers: Vec<Option<Result<Instant>>> = leases.iter().map(|_| None).collect();
    let placed = groups
        .iter()
        .zip(batched)
        .flat_map(|((_, indices, _), answers)| indices.iter().copied().zip(answers))
        .chain(alone.iter().copied().zip(single));
    for (index, answer) in placed {
        if let Some(slot) = answers.get_mut(index) {
            *slot = Some(answer);
        }
    }
    answers
        .into_iter()
        .zip(leases)
        .map(|(answer, renewing)| answer.unwrap_or_else(|| Err(no_answer(renewing))))
        .collect()
}

/// The watchdog settings a guard derives from its options.
pub(crate) fn watchdog_settings(
    name: &crate::LockName,
    options: &crate::LockOptions,
    renewed_by_guard: bool,
) -> Watch {
    Watch {
        name: name.clone(),
        ttl: options.ttl(),
        renew_every: if renewed_by_guard {
            options.renewal_interval()
        } else {
            None
        },
        max_hold_until: deadline(tokio::time::Instant::now(), options.max_hold()),
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // Tests may panic.
#[path = "watchdog_tests.rs"]
mod tests;
