//! The history checker: from what was recorded, a typed [`Report`] of what happened.
//!
//! It decides from recorded events, never from in-process flags: whether the library ever
//! declared two guards valid at once (overlaps of [holds](super::holds)), whether the protected
//! resource ever took a stale holder's write ([register findings](super::fence)), whether tokens
//! rose, how long acquires took, and what the harness found left on the server. The report
//! states; an [`Expect`](super::expect::Expect) profile judges.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::event::{Edge, Event, HoldId, NemesisRecord, Op, Phase};
use super::fence::{RegisterFindings, analyse};
use super::holds::{Hold, Overlap, derive_holds, overlaps};
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
}

/// Checks everything `input` recorded.
pub fn check(input: &Input) -> Report {
    let holds = derive_holds(&input.events, &input.deaths);
    let findings = |snapshot: &RegisterSnapshot| {
        let mut findings = analyse(snapshot);
        findings.set_apart_late_writes(&input.deaths);
        findings
    };
    Report {
        overlaps: overlaps(&holds),
        register: findings(&input.register),
        shadow: input.shadow.as_ref().map(findings),
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

/// Per name, over determinate holds in start order: every token unique, each above all before
/// it (holds that were already over when granted are left out of the order), and all above the
/// earlier run's maximum.
fn token_issues(holds: &[Hold], earlier_max: Option<u64>) -> Vec<TokenIssue> {
    let mut issues = Vec::new();
    let mut by_name: BTreeMap<&str, Vec<(&Hold, u64)>> = BTreeMap::new();
    for hold in holds.iter().filter(|h| h.determinate) {
        if let Some(token) = hold.token {
            by_name.entry(&hold.name).or_default().push((hold, token));
        }
    }
    for (name, mut granted) in by_name {
        granted.sort_by_key(|&(h, token)| (h.start, token));
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
/// started, if that came before the signal: the signal's lateness.
fn lost_signals(holds: &[Hold], input: &Input) -> Vec<LostSignal> {
    let mut signals: Vec<LostSignal> = input
        .events
        .iter()
        .filter(|e| e.op == Op::Lost)
        .filter_map(|lost| {
            let id = HoldId {
                worker: lost.worker,
                handle: lost.handle,
            };
            let own = holds.iter().find(|h| h.id == id && h.determinate)?;
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
