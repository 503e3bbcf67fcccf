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
//!
//! ## Locks and semaphores
//! A lock's holds must not meet at all: [`overlaps`] reports every pair that does. A name that a
//! hold took as one of N > 1 permits of a semaphore (its acquire events record N) may have up to
//! N holds valid at once: [`over_limit`] sweeps its holds in start order and reports each grant
//! that made more valid at one moment than the limit, with the holds valid then. The limit at a
//! moment is the smallest any of the holds valid then recorded (a lock counts as one), so a lock
//! granted while permits of its name were held is caught too, while a name used as a semaphore
//! now and as a lock later is judged by what each moment held. The same conservative intervals
//! serve both, so an excess reported really happened.
//!
//! A reader's hold of a reader-writer lock (its acquire events say `shared`) has no limit of its
//! own: readers' holds may all meet, and a writer's (the name's lock, limit 1) valid among them
//! makes the limit of that moment 1, so a writer meeting any other hold is caught by the same
//! sweep.

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
    /// The semaphore's number of permits its acquire asked for; `None` for a lock.
    pub permits: Option<u32>,
    /// A reader's share of a reader-writer lock.
    pub shared: bool,
}

impl Hold {
    /// Whether the hold lasted any time at all (a guard returned already expired did not).
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// How many holds of its name, itself included, may be valid while it is: its permits, 1
    /// for a lock (and a writer), no limit for a reader.
    pub fn limit(&self) -> u32 {
        if self.shared {
            u32::MAX
        } else {
            self.permits.unwrap_or(1)
        }
    }
}

/// A grant that made more determinate holds of a semaphore's name valid at one moment than its
/// limit: the holds valid as the last of them started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverLimit {
    /// The limit then: the fewest permits any of `holds` asked for.
    pub limit: u32,
    /// The holds valid at `holds.last().start`, in start order; more than `limit` of them.
    pub holds: Vec<Hold>,
}

impl OverLimit {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.holds.first().map_or("", |h| h.name.as_str())
    }

    /// The interval `[from, to)` in which all of them were valid.
    pub fn during(&self) -> (u64, u64) {
        let from = self.holds.iter().map(|h| h.start).max().unwrap_or(0);
        let to = self.holds.iter().map(|h| h.end).min().unwrap_or(0);
        (from, to)
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
        permits: outcome.permits.or(invoke.and_then(|e| e.permits)),
        shared: outcome.shared || invoke.is_some_and(|e| e.shared),
    })
}

/// The names some hold took as one of more than one permit, with the most permits asked: the
/// names judged as semaphores ([`over_limit`]) rather than as locks ([`overlaps`]).
pub fn semaphore_names(holds: &[Hold]) -> BTreeMap<String, u32> {
    let mut names: BTreeMap<String, u32> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.limit() > 1) {
        let most = names.entry(hold.name.clone()).or_default();
        *most = (*most).max(hold.limit());
    }
    names
}

/// Determinate, non-empty holds of each name, sorted by start (then id).
fn by_name<'h>(holds: impl Iterator<Item = &'h Hold>) -> BTreeMap<&'h str, Vec<&'h Hold>> {
    let mut by_name: BTreeMap<&str, Vec<&Hold>> = BTreeMap::new();
    for hold in holds.filter(|h| h.determinate && !h.is_empty()) {
        by_name.entry(&hold.name).or_default().push(hold);
    }
    for holds in by_name.values_mut() {
        holds.sort_by_key(|h| (h.start, h.id));
    }
    by_name
}

/// Per semaphore name (see [`semaphore_names`]), each grant after which more determinate,
/// non-empty holds were valid than the limit then: a sweep over the holds in start order,
/// keeping those not yet ended (`[start, end)`: a hold ending as another starts does not meet
/// it). Indeterminate holds are never counted. Names of locks only are left to [`overlaps`].
pub fn over_limit(holds: &[Hold]) -> Vec<OverLimit> {
    let semaphores = semaphore_names(holds);
    let mut found = Vec::new();
    for (_, holds) in by_name(holds.iter().filter(|h| semaphores.contains_key(&h.name))) {
        let mut active: Vec<&Hold> = Vec::new();
        for hold in holds {
            active.retain(|a| a.end > hold.start);
            active.push(hold);
            let limit = active.iter().map(|h| h.limit()).min().unwrap_or(1);
            if active.len() > usize::try_from(limit).unwrap_or(usize::MAX) {
                found.push(OverLimit {
                    limit,
                    holds: active.iter().map(|h| (*h).clone()).collect(),
                });
            }
        }
    }
    found
}

/// Per semaphore name, the most determinate holds valid at one moment: how far the run used
/// its permits (a measurement; [`over_limit`] judges).
pub fn peak_holders(holds: &[Hold]) -> BTreeMap<String, usize> {
    let semaphores = semaphore_names(holds);
    let mut peaks = BTreeMap::new();
    for (name, holds) in by_name(holds.iter().filter(|h| semaphores.contains_key(&h.name))) {
        let mut active: Vec<&Hold> = Vec::new();
        let mut peak = 0;
        for hold in holds {
            active.retain(|a| a.end > hold.start);
            active.push(hold);
            peak = peak.max(active.len());
        }
        peaks.insert(name.to_owned(), peak);
    }
    peaks
}

/// Every pair of determinate, non-empty holds of one lock's name whose `[start, end)`
/// intersect: per name, a sweep over the holds sorted by start, keeping those not yet ended.
/// Semaphore names (see [`semaphore_names`]) are left to [`over_limit`].
pub fn overlaps(holds: &[Hold]) -> Vec<Overlap> {
    let semaphores = semaphore_names(holds);
    let mut found = Vec::new();
    for (_, holds) in by_name(holds.iter().filter(|h| !semaphores.contains_key(&h.name))) {
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
