//! Holds: the intervals in which a worker believed it held a lock, and where two of them meet.
//!
//! A hold is counted conservatively at both ends, so an overlap is never a false alarm:
//! - it **starts** when `acquire` returned ok (the server granted it some time before);
//! - it **ends** at the first of: `release` invoked, the lost signal, the guard's own deadline
//!   (`valid_until`, pushed out by each `extend` confirmed before it passed), or the moment the
//!   harness killed the worker. A worker frozen with `SIGSTOP` keeps its hold until the deadline:
//!   it cannot stop believing while frozen, which is exactly what the deadline is for. Session
//!   locks have no deadline, so theirs end only at release, loss or death.
//!
//! An acquire whose outcome is unknown (phase `info`, or no outcome because the worker died) is
//! an *indeterminate* hold: listed, but never accused of an overlap.

use std::collections::BTreeMap;

use super::event::{Event, HoldId, Op, Phase};

/// Why a hold ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The worker invoked `release`.
    Release,
    /// The guard's lost signal fired.
    Lost,
    /// The guard's deadline passed.
    Expired,
    /// The harness killed the worker.
    Died,
    /// Nothing ended it within the history.
    Open,
}

/// One hold, derived from a worker's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    /// The worker and handle.
    pub id: HoldId,
    /// The lock name.
    pub name: String,
    /// When `acquire` was invoked, if recorded.
    pub invoked: Option<u64>,
    /// When `acquire` returned ok; for an indeterminate hold, its last acquire event.
    pub start: u64,
    /// The first end (see the module doc); `u64::MAX` if [`End::Open`].
    pub end: u64,
    /// What ended it.
    pub ended_by: End,
    /// The fencing token granted, if any.
    pub token: Option<u64>,
    /// False if the acquire's outcome is unknown.
    pub determinate: bool,
}

impl Hold {
    /// Whether the hold lasted any time at all (a guard returned already expired did not).
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Two determinate holds of one name that were valid at the same moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The hold that started first.
    pub first: Hold,
    /// The hold that started while `first` was still valid.
    pub second: Hold,
}

impl Overlap {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.first.name
    }

    /// The shared interval `[from, to)`.
    pub fn during(&self) -> (u64, u64) {
        (self.second.start, self.first.end.min(self.second.end))
    }
}

/// The holds of `events` (any order), ending at a worker's death time if `deaths` has one.
/// Failed acquires make no hold; events of a handle without an acquire are ignored. Sorted by
/// start.
pub fn derive_holds(events: &[Event], deaths: &BTreeMap<u32, u64>) -> Vec<Hold> {
    let mut by_hold: BTreeMap<HoldId, Vec<&Event>> = BTreeMap::new();
    for event in events {
        by_hold.entry(event.hold()).or_default().push(event);
    }
    let mut holds: Vec<Hold> = by_hold
        .into_iter()
        .filter_map(|(id, mut events)| {
            events.sort_by_key(|e| e.t);
            hold_of(id, &events, deaths.get(&id.worker).copied())
        })
        .collect();
    holds.sort_by_key(|h| (h.start, h.id));
    holds
}

fn hold_of(id: HoldId, events: &[&Event], death: Option<u64>) -> Option<Hold> {
    let acquire = |phase| {
        events
            .iter()
            .find(|e| e.op == Op::Acquire && e.phase == phase)
    };
    let invoke = acquire(Phase::Invoke);
    let (outcome, determinate) = match (acquire(Phase::Ok), acquire(Phase::Fail)) {
        (Some(ok), _) => (ok, true),
        (None, Some(_)) => return None,
        (None, None) => (acquire(Phase::Info).or(invoke)?, false),
    };
    let start = outcome.t;

    let mut valid_until = outcome.valid_until;
    for extend in events
        .iter()
        .filter(|e| e.op == Op::Extend && e.phase == Phase::Ok)
    {
        match (valid_until, extend.valid_until) {
            // Confirmed while still valid: the deadline moves. After it, the hold had ended.
            (Some(deadline), Some(next)) if extend.t >= start && extend.t <= deadline => {
                valid_until = Some(next);
            }
            _ => {}
        }
    }
    let first = |op| {
        events
            .iter()
            .find(|e| e.op == op && e.t >= start)
            .map(|e| e.t)
    };
    let (end, ended_by) = [
        (first(Op::Release), End::Release),
        (first(Op::Lost), End::Lost),
        (valid_until, End::Expired),
        (death, End::Died),
    ]
    .into_iter()
    .filter_map(|(t, why)| t.map(|t| (t, why)))
    .min_by_key(|&(t, _)| t)
    .unwrap_or((u64::MAX, End::Open));

    Some(Hold {
        id,
        name: outcome.name.clone(),
        invoked: invoke.map(|e| e.t),
        start,
        end,
        ended_by,
        token: outcome.token,
        determinate,
    })
}

/// Every pair of determinate, non-empty holds of one name whose `[start, end)` intersect:
/// per name, a sweep over the holds sorted by start, keeping those not yet ended.
pub fn overlaps(holds: &[Hold]) -> Vec<Overlap> {
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.determinate && !h.is_empty()) {
        by_name.entry(&hold.name).or_default().push(hold);
    }
    let mut found = Vec::new();
    for (_, mut holds) in by_name {
        holds.sort_by_key(|h| (h.start, h.id));
        let mut active: Vec<&Hold> = Vec::new();
        for hold in holds {
            active.retain(|a| a.end > hold.start);
            found.extend(active.iter().map(|a| Overlap {
                first: (*a).clone(),
                second: hold.clone(),
            }));
            active.push(hold);
        }
    }
    found
}
