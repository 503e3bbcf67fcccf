//! What a register's log shows about the resource the lock protects.
//!
//! The fenced register enforces its rule itself; the checker replays the rule over the log
//! anyway, so a bug in the register (or a harness mixing up tokens) cannot pass for a safe
//! lock. Applied to the shadow register, which accepts everything, the same replay measures the
//! damage fencing prevents: stale writes taken, updates lost, writers interleaved.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::event::HoldId;
use super::register::{RegisterSnapshot, WriteRecord};

/// An accepted write that the fencing rule refuses: its token is below the highest accepted
/// before it, or equal to it from another hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaleWrite {
    /// The write.
    pub write: WriteRecord,
    /// The highest token accepted before it.
    pub newer_token: u64,
    /// The hold that wrote `newer_token`.
    pub newer_holder: HoldId,
}

/// A break of "one token, one hold" among accepted writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenConflict {
    /// Two holds wrote with the same token.
    SharedToken {
        /// The lock name.
        name: String,
        /// The token.
        token: u64,
        /// The first two holds that used it.
        holders: (HoldId, HoldId),
    },
    /// One hold wrote with two tokens.
    TwoTokens {
        /// The lock name.
        name: String,
        /// The hold.
        holder: HoldId,
        /// The first two tokens it used.
        tokens: (u64, u64),
    },
}

/// A hold that wrote again after another hold had written in between (`h1 h2 h1`): two
/// holders took turns inside what should have been one critical section each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interleaving {
    /// The lock name.
    pub name: String,
    /// The hold that came back.
    pub holder: HoldId,
    /// The hold that wrote in between.
    pub between: HoldId,
    /// When `holder`'s returning write was decided.
    pub t: u64,
}

/// An accepted write whose element is missing from the final set: overwritten by a writer
/// that read the set before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostAdd {
    /// The write.
    pub write: WriteRecord,
}

/// The findings on one register's log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterFindings {
    /// Writes logged.
    pub writes: usize,
    /// Writes accepted.
    pub accepted: usize,
    /// Writes refused: the stale attempts fencing stopped.
    pub rejected: Vec<WriteRecord>,
    /// Accepted writes the fencing rule refuses.
    pub stale_accepted: Vec<StaleWrite>,
    /// Refused writes the fencing rule accepts (only a broken register makes these).
    pub wrong_rejections: Vec<WriteRecord>,
    /// Tokens shared between holds, or holds using two tokens.
    pub token_conflicts: Vec<TokenConflict>,
    /// Accepted writes of a hold after another hold's.
    pub interleavings: Vec<Interleaving>,
    /// Accepted elements missing from the final sets.
    pub lost: Vec<LostAdd>,
    /// Accepted elements missing from the final sets whose write reached the register after the
    /// harness had killed its writer: kept apart from [`lost`](Self::lost) by
    /// [`set_apart_late_writes`](Self::set_apart_late_writes).
    pub lost_after_death: Vec<LostAdd>,
}

/// Replays the fencing rule over `snapshot`'s log, name by name, in decision order.
pub fn analyse(snapshot: &RegisterSnapshot) -> RegisterFindings {
    let mut findings = RegisterFindings {
        writes: snapshot.log.len(),
        ..RegisterFindings::default()
    };
    let mut top: BTreeMap<&str, (u64, HoldId)> = BTreeMap::new();
    let mut token_holder: BTreeMap<(&str, u64), HoldId> = BTreeMap::new();
    let mut holder_token: BTreeMap<(&str, HoldId), u64> = BTreeMap::new();
    let mut last_writer: BTreeMap<&str, HoldId> = BTreeMap::new();
    let mut finished: BTreeSet<(&str, HoldId)> = BTreeSet::new();
    let empty = BTreeSet::new();

    for write in &snapshot.log {
        let name = write.name.as_str();
        let admitted = top
            .get(name)
            .is_none_or(|&(t, by)| write.token > t || (write.token == t && write.holder == by));
        if !write.accepted {
            findings.rejected.push(write.clone());
            if admitted {
                findings.wrong_rejections.push(write.clone());
            }
            continue;
        }
        findings.accepted = findings.accepted.saturating_add(1);
        match top.get(name).copied() {
            Some((newer_token, newer_holder)) if !admitted => {
                findings.stale_accepted.push(StaleWrite {
                    write: write.clone(),
                    newer_token,
                    newer_holder,
                });
            }
            Some((t, _)) if write.token <= t => {}
            _ => {
                top.insert(name, (write.token, write.holder));
            }
        }

        let holder = *token_holder
            .entry((name, write.token))
            .or_insert(write.holder);
        if holder != write.holder {
            findings.token_conflicts.push(TokenConflict::SharedToken {
                name: name.to_owned(),
                token: write.token,
                holders: (holder, write.holder),
            });
        }
        let token = *holder_token
            .entry((name, write.holder))
            .or_insert(write.token);
        if token != write.token {
            findings.token_conflicts.push(TokenConflict::TwoTokens {
                name: name.to_owned(),
                holder: write.holder,
                tokens: (token, write.token),
            });
        }

        if let Some(previous) = last_writer.insert(name, write.holder) {
            if previous != write.holder {
                finished.insert((name, previous));
                if finished.contains(&(name, write.holder)) {
                    findings.interleavings.push(Interleaving {
                        name: name.to_owned(),
                        holder: write.holder,
                        between: previous,
                        t: write.t,
                    });
                }
            }
        }

        if !snapshot
            .sets
            .get(name)
            .unwrap_or(&empty)
            .contains(&write.element)
        {
            findings.lost.push(LostAdd {
                write: write.clone(),
            });
        }
    }
    findings
}

impl RegisterFindings {
    /// Findings that mean the register or the harness is broken, whatever the lock did:
    /// wrong rejections and token conflicts.
    pub fn integrity_faults(&self) -> usize {
        self.wrong_rejections
            .len()
            .saturating_add(self.token_conflicts.len())
    }

    /// Moves out of [`lost`](Self::lost) the writes the register decided after their writer was
    /// killed (`deaths`: when, by worker id). Such a write left its writer while it held the
    /// lock and arrived after the next holder had read the set: a register that fences writes
    /// alone takes it (no higher token has written yet), and the next holder's write then drops
    /// it. No lock can call back a message its dead holder already sent, so these are reported
    /// and not counted as lost updates; a write that arrived while its writer lived still is.
    pub fn set_apart_late_writes(&mut self, deaths: &BTreeMap<u32, u64>) {
        let (late, lost) = std::mem::take(&mut self.lost)
            .into_iter()
            .partition(|lost| {
                deaths
                    .get(&lost.write.holder.worker)
                    .is_some_and(|&died| died < lost.write.t)
            });
        self.lost = lost;
        self.lost_after_death = late;
    }
}

impl fmt::Display for StaleWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.write;
        write!(
            f,
            "{} accepted {} token {} (element {}) at t={} after {} token {}",
            w.name, w.holder, w.token, w.element, w.t, self.newer_holder, self.newer_token
        )
    }
}

impl fmt::Display for TokenConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SharedToken {
                name,
                token,
                holders,
            } => {
                write!(
                    f,
                    "{name}: token {token} written by {} and {}",
                    holders.0, holders.1
                )
            }
            Self::TwoTokens {
                name,
                holder,
                tokens,
            } => {
                write!(
                    f,
                    "{name}: {holder} wrote with tokens {} and {}",
                    tokens.0, tokens.1
                )
            }
        }
    }
}

impl fmt::Display for Interleaving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} wrote again at t={} after {} had written",
            self.name, self.holder, self.t, self.between
        )
    }
}

impl fmt::Display for LostAdd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = &self.write;
        write!(
            f,
            "{}: element {} of {} (token {}, t={}) missing from the final set",
            w.name, w.element, w.holder, w.token, w.t
        )
    }
}
