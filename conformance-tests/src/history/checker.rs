//! The history checker: from what was recorded, a typed [`Report`] of what happened.
//!
//! It decides from recorded events, never from in-process flags: whether the library ever
//! declared two guards valid at once (overlaps of [holds](super::holds)), whether the protected
//! resource ever took a stale holder's write ([register findings](super::fence)), whether tokens
//! rose, how long acquires took, and what the harness found left on the server. The report
//! states; an [`Expect`](super::expect::Expect) profile judges.
//!
//! ## Semaphores
//! A name that the run's holds took as one of N > 1 permits (the workers' acquire events record
//! N) is checked as a semaphore; every other name exactly as a lock, so a run of locks only is
//! checked as it always was. What changes for a semaphore's name, and why:
//! - **Holders**: not "no two at once" but "no more than N at once" ([`over_limit`]): the same
//!   conservative intervals, swept in start order; each grant that made N + 1 determinate holds
//!   valid at one moment is reported with the holds involved. Indeterminate holds are never
//!   counted. A profile's `overlaps` counts these too.
//! - **Tokens**: still unique per grant, and still above an earlier run's. "Rising in grant
//!   order" is judged by real time, not by start order: N grants in flight at once may return
//!   in any order, so a token is only required to be above every token whose acquire had
//!   *returned before this acquire was invoked* (that grant was certainly made first). For a
//!   lock the start order is kept.
//! - **The register**: its fencing rule (accept a token only if it is the highest seen) is a
//!   lock's: with N holders valid at once it refuses the writes of valid holders with lower
//!   tokens, and their read–think–write cycles drop each other's elements, without anything
//!   being wrong. So the register logs of semaphore names are replayed apart
//!   ([`Report::semaphore_register`], [`Report::semaphore_shadow`]): their refusals, lost adds
//!   and interleavings are reported, not judged; what still holds with N concurrent token
//!   holders is judged as for a lock: the register keeps its own rule (no write its rule
//!   refuses accepted, none it admits refused) and one token is one permit (no token written by
//!   two holds, no hold writing with two tokens). "Nothing lost" for a semaphore is about its
//!   permits: a holder that was paused, cut off or killed gives its permit back, which the
//!   cases check by taking all N afterwards, and by the residue.
//!
//! ## Reader-writer locks
//! A name some of whose holds were readers' (their acquire events say `shared`) is checked as a
//! semaphore without a limit among readers: a writer's hold, like a lock's, makes the limit of
//! its moment 1, so it meets no other hold ([`over_limit`]), and tokens are judged by real time,
//! since readers' grants return in any order. Its **register** is a lock's: readers write
//! nothing and a writer writes alone, so its log is judged with the locks' (listed in
//! [`Report::semaphores`] with `u32::MAX` as the limit).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::event::{Edge, Event, HoldId, NemesisRecord, Op, Phase};
use super::fence::{RegisterFindings, analyse};
use super::holds::{
    Hold, OverLimit, Overlap, derive_holds, over_limit, overlaps, peak_holders, semaphore_names,
};
use super::register::RegisterSnapshot;

/// Everything a run recorded, for [`check`] and for the dump on failure.
#[derive(Clone, Debug, Default)]
pub struct Input {
    /// Every worker's events, in any order.
    pub events: Vec<Event>,
    /// History files whose torn last line was skipped when loading.
    pub torn: Vec<PathBuf>,
    /// The fenced register's log and sets.
    pub register: RegisterSnapshot,
    /// The shadow register's, if the run had one.
    pub shadow: Option<RegisterSnapshot>,
    /// The faults injected.
    pub nemesis: Vec<NemesisRecord>,
    /// When the harness killed a worker, by worker id: its holds end there.
    pub deaths: BTreeMap<u32, u64>,
    /// What the post-run scan found left on the server (`None`: not scanned).
    pub residue: Option<Vec<String>>,
    /// The highest token an earlier run against the same deployment saw.
    pub earlier_max_token: Option<u64>,
    /// The seed of the run's random choices, for replaying it.
    pub seed: Option<u64>,
    /// Anything else worth keeping with a dump (configuration, server logs' paths).
    pub notes: Vec<String>,
}

/// A token that broke "unique and strictly increasing in grant order".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIssue {
    /// Two holds of one name were granted the same token.
    Duplicate {
        /// The lock name.
        name: String,
        /// The token.
        token: u64,
        /// The earlier and the later hold.
        holds: (HoldId, HoldId),
    },
    /// A hold granted later got a lower token than an earlier one.
    Decreasing {
        /// The lock name.
        name: String,
        /// The earlier hold with the highest token so far, and that token.
        earlier: (HoldId, u64),
        /// The later hold and its lower token.
        later: (HoldId, u64),
    },
    /// A token not above the highest an earlier run saw (tokens went back across a restart).
    NotAboveEarlierRun {
        /// The lock name.
        name: String,
        /// The hold and its token.
        hold: (HoldId, u64),
        /// The earlier run's highest token.
        earlier_max: u64,
    },
}

/// The time from a heal (or a worker's death) to the next grant of any name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// What ended: the nemesis record's text, or `worker N died`.
    pub after: String,
    /// When.
    pub t: u64,
    /// Nanoseconds until the next acquire returned ok, if one did.
    pub next_grant: Option<u64>,
}

/// How late a holder learnt that its lock had passed to someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostSignal {
    /// The hold whose lost signal fired.
    pub hold: HoldId,
    /// The grant of the same name, to another hold, that came first after it started.
    pub superseded_by: HoldId,
    /// Nanoseconds from that grant's return to the lost signal.
    pub latency: u64,
}

/// Measurements of progress; reported, never asserted by the checker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    /// Acquires that returned ok.
    pub granted: usize,
    /// Acquires that failed.
    pub failed: usize,
    /// Acquires with unknown outcome.
    pub indeterminate: usize,
    /// The median invoke-to-ok latency, in nanoseconds.
    pub median_latency: Option<u64>,
    /// The slowest grant: its hold and invoke-to-ok latency.
    pub max_latency: Option<(HoldId, u64)>,
    /// Per heal or death, the time to the next grant.
    pub recoveries: Vec<Recovery>,
    /// Per hold lost after another hold of its name was granted, how late its signal came
    /// (a hold lost before any other grant has no latency to report: nobody held it meanwhile).
    pub lost_signals: Vec<LostSignal>,
}

/// What a history shows, check by check. Its [`Display`](std::fmt::Display) is the verdict,
/// one line per check with the first findings of each (see [`verdict`](super::verdict)).
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Every hold, determinate or not, sorted by start.
    pub holds: Vec<Hold>,
    /// Determinate holds of one name valid at the same moment.
    pub overlaps: Vec<Overlap>,
    /// The fenced register's log, replayed.
    pub register: RegisterFindings,
    /// The shadow register's log, replayed (what fencing prevented), if there was one.
    pub shadow: Option<RegisterFindings>,
    /// Token order and uniqueness.
    pub tokens: Vec<TokenIssue>,
    /// The highest token granted, to hand to the next run.
    pub max_token: Option<u64>,
    /// Latencies and recoveries.
    pub liveness: Liveness,
    /// What was left on the server (`None`: not scanned).
    pub residue: Option<Vec<String>>,
    /// History files whose torn last line was skipped.
    pub torn: usize,
    /// The names checked as semaphores, with their number of permits (empty for a run of
    /// locks).
    pub semaphores: BTreeMap<String, u32>,
    /// Grants of a semaphore's name that made more determinate holds valid at once than its
    /// limit.
    pub over_limit: Vec<OverLimit>,
    /// Per semaphore name, the most determinate holds valid at one moment.
    pub peak_holders: BTreeMap<String, usize>,
    /// The fenced register's log of semaphore names, replayed apart (see the
    /// [module docs](self)); `None` for a run of locks.
    pub semaphore_register: Option<RegisterFindings>,
    /// The same of the shadow register.
    pub semaphore_shadow: Option<RegisterFindings>,
}

/// Checks everything `input` recorded.
pub fn check(input: &Input) -> Report {
    let holds = derive_holds(&input.events, &input.deaths);
    let semaphores = semaphore_names(&holds);
    let findings = |snapshot: &RegisterSnapshot| {
        let mut findings = analyse(snapshot);
        findings.set_apart_late_writes(&input.deaths);
        findings
    };
    // Locks' names are judged on the register as ever; semaphores' apart. A reader-writer
    // lock's writes are a lock's (readers write nothing).
    let shared_writers: BTreeMap<String, u32> = semaphores
        .iter()
        .filter(|(_, limit)| **limit != u32::MAX)
        .map(|(name, limit)| (name.clone(), *limit))
        .collect();
    let (register, semaphore_register) = split(&input.register, &shared_writers);
    let shadow = input.shadow.as_ref().map(|s| split(s, &shared_writers));
    Report {
        overlaps: overlaps(&holds),
        over_limit: over_limit(&holds),
        peak_holders: peak_holders(&holds),
        register: findings(&register),
        shadow: shadow.as_ref().map(|(locks, _)| findings(locks)),
        semaphore_register: semaphore_register.as_ref().map(findings),
        semaphore_shadow: shadow
            .as_ref()
            .and_then(|(_, semaphores)| semaphores.as_ref().map(findings)),
        semaphores,
        tokens: token_issues(&holds, input.earlier_max_token),
        max_token: holds
            .iter()
            .filter(|h| h.determinate)
            .filter_map(|h| h.token)
            .max(),
        liveness: liveness(&holds, input),
        residue: input.residue.clone(),
        torn: input.torn.len(),
        holds,
    }
}

/// `snapshot` as two: the log and sets of names that are not `semaphores`, and, if the run had
/// semaphores, those of their names (`None` otherwise, so a run of locks keeps its snapshot
/// whole).
fn split(
    snapshot: &RegisterSnapshot,
    semaphores: &BTreeMap<String, u32>,
) -> (RegisterSnapshot, Option<RegisterSnapshot>) {
    if semaphores.is_empty() {
        return (snapshot.clone(), None);
    }
    let part = |of_semaphores: bool| RegisterSnapshot {
        log: snapshot
            .log
            .iter()
            .filter(|w| semaphores.contains_key(&w.name) == of_semaphores)
            .cloned()
            .collect(),
        sets: snapshot
            .sets
            .iter()
            .filter(|(name, _)| semaphores.contains_key(*name) == of_semaphores)
            .map(|(name, set)| (name.clone(), set.clone()))
            .collect(),
    };
    (part(false), Some(part(true)))
}

/// Per name, over determinate holds: every token unique, all above the earlier run's maximum,
/// and each above all granted before it. For a lock, "before" is start order (holds that were
/// already over when granted are left out of the order); for a semaphore, whose grants may
/// return in any order, it is the holds whose acquire returned before this one's was invoked.
fn token_issues(holds: &[Hold], earlier_max: Option<u64>) -> Vec<TokenIssue> {
    let semaphores = semaphore_names(holds);
    let mut issues = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<(&Hold, u64)>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.determinate) {
        if let Some(token) = hold.token {
            by_name.entry(&hold.name).or_default().push((hold, token));
        }
    }
    for (name, mut granted) in by_name {
        granted.sort_by_key(|&(h, token)| (h.start, token));
        if semaphores.contains_key(name) {
            issues.extend(semaphore_token_issues(name, &granted, earlier_max));
            continue;
        }
        let mut seen: BTreeMap<u64, HoldId> = BTreeMap::new();
        let mut top: Option<(HoldId, u64)> = None;
        for (hold, token) in granted {
            if let Some(&first) = seen.get(&token) {
                issues.push(TokenIssue::Duplicate {
                    name: name.to_owned(),
                    token,
                    holds: (first, hold.id),
                });
            } else if let Some(earlier) = top.filter(|&(_, t)| token < t && !hold.is_empty()) {
                issues.push(TokenIssue::Decreasing {
                    name: name.to_owned(),
                    earlier,
                    later: (hold.id, token),
                });
            }
            seen.entry(token).or_insert(hold.id);
            if !hold.is_empty() && top.is_none_or(|(_, t)| token > t) {
                top = Some((hold.id, token));
            }
            if let Some(earlier_max) = earlier_max.filter(|&m| token <= m) {
                issues.push(TokenIssue::NotAboveEarlierRun {
                    name: name.to_owned(),
                    hold: (hold.id, token),
                    earlier_max,
                });
            }
        }
    }
    issues
}

/// [`token_issues`] of a semaphore's name, over its grants sorted by start.
fn semaphore_token_issues(
    name: &str,
    granted: &[(&Hold, u64)],
    earlier_max: Option<u64>,
) -> Vec<TokenIssue> {
    let mut issues = Vec::new();
    let mut seen: BTreeMap<u64, HoldId> = BTreeMap::new();
    for &(hold, token) in granted {
        if let Some(&first) = seen.get(&token) {
            issues.push(TokenIssue::Duplicate {
                name: name.to_owned(),
                token,
                holds: (first, hold.id),
            });
        }
        seen.entry(token).or_insert(hold.id);
        if let Some(earlier_max) = earlier_max.filter(|&m| token <= m) {
            issues.push(TokenIssue::NotAboveEarlierRun {
                name: name.to_owned(),
                hold: (hold.id, token),
                earlier_max,
            });
        }
    }
    // In order of invocation, the highest token among the grants returned before it.
    let mut by_invoke: Vec<(u64, &Hold, u64)> = granted
        .iter()
        .filter_map(|&(h, token)| h.invoked.map(|i| (i, h, token)))
        .collect();
    by_invoke.sort_by_key(|&(i, h, _)| (i, h.id));
    let mut returned = granted.iter().peekable();
    let mut top: Option<(HoldId, u64)> = None;
    for (invoked, hold, token) in by_invoke {
        while let Some(&&(earlier, t)) = returned.peek().filter(|(h, _)| h.start < invoked) {
            if top.is_none_or(|(_, top)| t > top) {
                top = Some((earlier.id, t));
            }
            returned.next();
        }
        if let Some(earlier) = top.filter(|&(_, t)| token < t) {
            issues.push(TokenIssue::Decreasing {
                name: name.to_owned(),
                earlier,
                later: (hold.id, token),
            });
        }
    }
    issues
}

fn liveness(holds: &[Hold], input: &Input) -> Liveness {
    let mut latencies: Vec<(u64, HoldId)> = holds
        .iter()
        .filter(|h| h.determinate)
        .filter_map(|h| h.invoked.map(|i| (h.start.saturating_sub(i), h.id)))
        .collect();
    latencies.sort();
    let grants: Vec<u64> = holds
        .iter()
        .filter(|h| h.determinate)
        .map(|h| h.start)
        .collect();
    let next_grant = |t: u64| {
        grants
            .iter()
            .filter(|&&s| s >= t)
            .min()
            .map(|s| s.saturating_sub(t))
    };
    let heals = input
        .nemesis
        .iter()
        .filter(|n| n.edge == Edge::Stop)
        .map(|n| (n.what.clone(), n.t));
    let deaths = input
        .deaths
        .iter()
        .map(|(w, &t)| (format!("worker {w} died"), t));
    let mut recoveries: Vec<Recovery> = heals
        .chain(deaths)
        .map(|(after, t)| Recovery {
            after,
            t,
            next_grant: next_grant(t),
        })
        .collect();
    recoveries.sort_by_key(|r| r.t);
    Liveness {
        lost_signals: lost_signals(holds, input),
        granted: grants.len(),
        failed: input
            .events
            .iter()
            .filter(|e| e.op == Op::Acquire && e.phase == Phase::Fail)
            .count(),
        indeterminate: holds.iter().filter(|h| !h.determinate).count(),
        median_latency: latencies.get(latencies.len() / 2).map(|&(l, _)| l),
        max_latency: latencies.last().map(|&(l, id)| (id, l)),
        recoveries,
    }
}

/// For each hold whose lost signal fired, the first grant of its name to another hold after it
/// started, if that came before the signal: the signal's lateness. Not for a semaphore's
/// permits: another grant of the name does not take a permit's place.
fn lost_signals(holds: &[Hold], input: &Input) -> Vec<LostSignal> {
    let semaphores = semaphore_names(holds);
    let mut signals: Vec<LostSignal> = input
        .events
        .iter()
        .filter(|e| e.op == Op::Lost)
        .filter_map(|lost| {
            let id = HoldId {
                worker: lost.worker,
                handle: lost.handle,
            };
            let own = holds
                .iter()
                .find(|h| h.id == id && h.determinate && !semaphores.contains_key(&h.name))?;
            let first_other = holds
                .iter()
                .filter(|h| h.determinate && h.id != id && h.name == own.name)
                .filter(|h| h.start > own.start && h.start <= lost.t)
                .min_by_key(|h| h.start)?;
            Some(LostSignal {
                hold: id,
                superseded_by: first_other.id,
                latency: lost.t.saturating_sub(first_other.start),
            })
        })
        .collect();
    signals.sort_by_key(|s| s.latency);
    signals
}
