//! Expectation profiles: what a fault test declares its history must show.
//!
//! The same checker serves tests that must come out clean, tests where a fault must be
//! survived (and must have bitten: fencing refused something), and negative controls, where a
//! known-unsafe configuration must be *caught*. Each test states its profile as an [`Expect`]
//! of [`Count`]s, starting from one of the constants and overriding fields:
//!
//! ```
//! use dlock_conformance::history::{Count, Expect};
//! // A holder paused past its lease: no overlap, fencing refused at least one stale write.
//! let paused_holder = Expect { residue: Count::Zero, ..Expect::FENCED_FAULT };
//! # let _ = paused_holder;
//! ```
//!
//! What no profile can allow: a register refusing writes its rule admits, or one token shared
//! between holds among accepted writes. Those mean the test's own instruments are broken.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use super::checker::{Input, Report, check};
use super::dump::dump;
use super::fence::RegisterFindings;

/// How many findings of one kind a profile allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// None.
    Zero,
    /// Exactly this many.
    Exactly(usize),
    /// At least this many (`AtLeast(1)`: the fault must have shown up).
    AtLeast(usize),
    /// At most this many.
    AtMost(usize),
    /// Not judged; reported only.
    Any,
}

impl Count {
    /// Whether `n` findings satisfy this count.
    pub fn admits(self, n: usize) -> bool {
        match self {
            Self::Zero => n == 0,
            Self::Exactly(m) => n == m,
            Self::AtLeast(m) => n >= m,
            Self::AtMost(m) => n <= m,
            Self::Any => true,
        }
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero => f.write_str("0"),
            Self::Exactly(n) => write!(f, "exactly {n}"),
            Self::AtLeast(n) => write!(f, "at least {n}"),
            Self::AtMost(n) => write!(f, "at most {n}"),
            Self::Any => f.write_str("any"),
        }
    }
}

/// A test's expectation of its [`Report`], check by check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Validity overlaps: two determinate guards of one lock's name valid at once, plus the
    /// grants that made more determinate permits of a semaphore's name valid at once than its
    /// limit ([`Report::over_limit`]).
    pub overlaps: Count,
    /// Writes the fenced register refused (of locks' names: see [`Report::semaphore_register`]).
    pub stale_attempts: Count,
    /// Writes the fenced register accepted that fencing refuses (of every name: the register
    /// keeps its rule for semaphores' names too).
    pub stale_accepted: Count,
    /// Accepted elements missing from the fenced register's final sets.
    pub lost_updates: Count,
    /// Fenced-register writers interleaved (`h1 h2 h1`).
    pub interleavings: Count,
    /// Duplicate, decreasing or regressed tokens.
    pub token_issues: Count,
    /// Entries left on the server; anything but [`Count::Any`] needs a residue scan.
    pub residue: Count,
    /// Accepted elements missing from the shadow register's final sets: the updates fencing
    /// saved. Anything but [`Count::Any`] needs a shadow register.
    pub shadow_lost: Count,
    /// The liveness bound: after each heal and each death the nemesis logged, the next grant
    /// (of any worker) came within this. `None`: measured and reported only. A recovery that no
    /// grant followed (the run ended first) is not judged.
    pub recovery_within: Option<Duration>,
}

impl Expect {
    /// No faults: nothing unsafe, nothing refused, nothing lost (even without fencing), nothing
    /// left behind.
    pub const CLEAN: Self = Self {
        overlaps: Count::Zero,
        stale_attempts: Count::Zero,
        stale_accepted: Count::Zero,
        lost_updates: Count::Zero,
        interleavings: Count::Zero,
        token_issues: Count::Zero,
        residue: Count::Zero,
        shadow_lost: Count::Zero,
        recovery_within: None,
    };

    /// A fault the lock must survive, and that must have bitten: no overlap, fencing refused
    /// at least one stale write and took none; what the shadow lost is reported only.
    pub const FENCED_FAULT: Self = Self {
        stale_attempts: Count::AtLeast(1),
        residue: Count::Any,
        shadow_lost: Count::Any,
        ..Self::CLEAN
    };

    /// A known-unsafe configuration that the checker must catch: at least one overlap, yet
    /// fencing takes no stale write. Tokens may misbehave (that may be the point).
    pub const NEGATIVE_CONTROL: Self = Self {
        overlaps: Count::AtLeast(1),
        stale_attempts: Count::Any,
        stale_accepted: Count::Zero,
        lost_updates: Count::Any,
        interleavings: Count::Zero,
        token_issues: Count::Any,
        residue: Count::Any,
        shadow_lost: Count::Any,
        recovery_within: None,
    };

    /// Judges nothing but what no profile may allow (see the [module docs](self)): a base for
    /// a profile that asks for one finding alone.
    pub const ANY: Self = Self {
        overlaps: Count::Any,
        stale_attempts: Count::Any,
        stale_accepted: Count::Any,
        lost_updates: Count::Any,
        interleavings: Count::Any,
        token_issues: Count::Any,
        residue: Count::Any,
        shadow_lost: Count::Any,
        recovery_within: None,
    };

    /// `Ok` if `report` meets every count, else one line per unmet check.
    pub fn check(&self, report: &Report) -> Result<(), String> {
        let register = &report.register;
        let shadow_lost = report.shadow.as_ref().map(|s| s.lost.len());
        let residue = report.residue.as_ref().map(Vec::len);
        // Of semaphores' names, what still holds with several token holders at once.
        let semaphores = report.semaphore_register.as_ref();
        let semaphore_stale = semaphores.map_or(0, |s| s.stale_accepted.len());
        let semaphore_integrity = semaphores.map_or(0, RegisterFindings::integrity_faults);
        let checks = [
            (
                "overlaps",
                self.overlaps,
                Some(
                    report
                        .overlaps
                        .len()
                        .saturating_add(report.over_limit.len()),
                ),
            ),
            (
                "stale attempts",
                self.stale_attempts,
                Some(register.rejected.len()),
            ),
            (
                "stale accepted",
                self.stale_accepted,
                Some(
                    register
                        .stale_accepted
                        .len()
                        .saturating_add(semaphore_stale),
                ),
            ),
            ("lost updates", self.lost_updates, Some(register.lost.len())),
            (
                "interleavings",
                self.interleavings,
                Some(register.interleavings.len()),
            ),
            ("token issues", self.token_issues, Some(report.tokens.len())),
            ("residue", self.residue, residue),
            ("shadow lost updates", self.shadow_lost, shadow_lost),
            (
                "register integrity faults",
                Count::Zero,
                Some(
                    register
                        .integrity_faults()
                        .saturating_add(semaphore_integrity),
                ),
            ),
        ];
        let mut unmet: Vec<String> = checks
            .into_iter()
            .filter_map(|(what, want, found)| match found {
                _ if want == Count::Any => None,
                None => Some(format!("{what}: expected {want}, not measured")),
                Some(n) if want.admits(n) => None,
                Some(n) => Some(format!("{what}: expected {want}, found {n}")),
            })
            .collect();
        if let Some(bound) = self.recovery_within {
            let bound_ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
            unmet.extend(
                report
                    .liveness
                    .recoveries
                    .iter()
                    .filter(|r| r.next_grant.is_some_and(|ns| ns > bound_ns))
                    .map(|r| {
                        format!(
                            "recovery: expected the next grant within {bound:?} after {}, took {:?}",
                            r.after,
                            Duration::from_nanos(r.next_grant.unwrap_or_default())
                        )
                    }),
            );
        }
        if unmet.is_empty() {
            Ok(())
        } else {
            Err(unmet.join("\n"))
        }
    }

    /// Checks `input`; if the profile is unmet, dumps the run under `dump_dir` and fails with
    /// the unmet checks, the report and the dump's path.
    pub fn verify(&self, input: &Input, dump_dir: &Path) -> Result<Report, String> {
        let report = check(input);
        match self.check(&report) {
            Ok(()) => Ok(report),
            Err(unmet) => {
                let dumped = match dump(input, &report, dump_dir) {
                    Ok(dir) => format!("history dumped to {}", dir.display()),
                    Err(e) => format!(
                        "could not dump the history under {}: {e}",
                        dump_dir.display()
                    ),
                };
                Err(format!("{unmet}\n\n{report}\n{dumped}"))
            }
        }
    }
}
