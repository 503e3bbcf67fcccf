//! How a [`Report`] reads: one line per check, then its first findings, indented.
//!
//! The verdict is what a developer sees when a fault test fails, before opening the dump, so
//! each finding names the lock, the holds (`w<worker>/h<handle>`) and host-clock times.

use std::fmt;

use super::checker::{Report, TokenIssue};
use super::fence::RegisterFindings;
use super::holds::{Hold, OverLimit, Overlap};

/// Nanoseconds as a short human duration: `850ns`, `12.3µs`, `4.56ms`, `2.001s`.
pub fn fmt_ns(ns: u64) -> String {
    match ns {
        u64::MAX => "never".to_owned(),
        0..1_000 => format!("{ns}ns"),
        1_000..1_000_000 => format!("{:.1}µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}ms", ns as f64 / 1e6),
        _ => format!("{:.3}s", ns as f64 / 1e9),
    }
}

impl fmt::Display for TokenIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Duplicate { name, token, holds } => {
                write!(
                    f,
                    "{name}: token {token} granted to {} and {}",
                    holds.0, holds.1
                )
            }
            Self::Decreasing {
                name,
                earlier,
                later,
            } => write!(
                f,
                "{name}: {} got token {} after {} got {}",
                later.0, later.1, earlier.0, earlier.1
            ),
            Self::NotAboveEarlierRun {
                name,
                hold,
                earlier_max,
            } => write!(
                f,
                "{name}: {} got token {}, not above the earlier run's {earlier_max}",
                hold.0, hold.1
            ),
        }
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = self.token.map_or("-".to_owned(), |t| t.to_string());
        let end = if self.end == u64::MAX {
            "open".to_owned()
        } else {
            self.end.to_string()
        };
        write!(
            f,
            "{} token {token} [{}, {end}) ended by {:?}",
            self.id, self.start, self.ended_by
        )
    }
}

/// How long `[from, to)` lasted; `open` if it never ended.
fn length((from, to): (u64, u64)) -> String {
    if to == u64::MAX {
        "open".to_owned()
    } else {
        fmt_ns(to.saturating_sub(from))
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let length = length(self.during());
        write!(
            f,
            "{}: {} and {} for {length}",
            self.name(),
            self.first,
            self.second
        )
    }
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let length = length(self.during());
        write!(
            f,
            "{}: {} holds of a limit of {} for {length}:",
            self.name(),
            self.holds.len(),
            self.limit
        )?;
        for hold in &self.holds {
            write!(f, " {hold};")?;
        }
        Ok(())
    }
}

/// How many findings a report line lists before "… and N more".
const SHOWN: usize = 5;

fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    for item in items.iter().take(SHOWN) {
        writeln!(f, "    {item}")?;
    }
    if items.len() > SHOWN {
        writeln!(f, "    … and {} more", items.len().saturating_sub(SHOWN))?;
    }
    Ok(())
}

fn register_line(f: &mut fmt::Formatter<'_>, label: &str, r: &RegisterFindings) -> fmt::Result {
    let integrity = match r.integrity_faults() {
        0 => "integrity ok".to_owned(),
        n => format!("{n} INTEGRITY FAULTS"),
    };
    writeln!(
        f,
        "{label}: {} writes, {} accepted; stale attempts {}; stale accepted {}; lost adds {} \
         (and {} of killed writers, arrived late); interleavings {}; {integrity}",
        r.writes,
        r.accepted,
        r.rejected.len(),
        r.stale_accepted.len(),
        r.lost.len(),
        r.lost_after_death.len(),
        r.interleavings.len()
    )?;
    list(f, &r.stale_accepted)?;
    list(f, &r.lost)?;
    list(f, &r.lost_after_death)?;
    list(f, &r.interleavings)?;
    list(f, &r.token_conflicts)?;
    let wrong: Vec<String> = r
        .wrong_rejections
        .iter()
        .map(|w| {
            format!(
                "{}: refused {} token {} that the rule admits",
                w.name, w.holder, w.token
            )
        })
        .collect();
    list(f, &wrong)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let indeterminate = self.holds.iter().filter(|h| !h.determinate).count();
        writeln!(
            f,
            "holds: {} ({indeterminate} indeterminate); torn history lines skipped: {}",
            self.holds.len(),
            self.torn
        )?;
        writeln!(f, "overlaps: {}", self.overlaps.len())?;
        list(f, &self.overlaps)?;
        if !self.semaphores.is_empty() {
            let names: Vec<String> = self
                .semaphores
                .iter()
                .map(|(name, permits)| {
                    let peak = self.peak_holders.get(name).copied().unwrap_or(0);
                    if *permits == u32::MAX {
                        format!("{name} (readers and a writer, at most {peak} held at once)")
                    } else {
                        format!("{name} ({permits} permits, at most {peak} held at once)")
                    }
                })
                .collect();
            writeln!(
                f,
                "semaphores: {}; over the limit: {}",
                names.join(", "),
                self.over_limit.len()
            )?;
            list(f, &self.over_limit)?;
        }
        register_line(f, "fenced register", &self.register)?;
        match &self.shadow {
            Some(shadow) => register_line(f, "shadow register", shadow)?,
            None => writeln!(f, "shadow register: none")?,
        }
        if let Some(register) = &self.semaphore_register {
            register_line(
                f,
                "fenced register, semaphores (integrity judged)",
                register,
            )?;
        }
        if let Some(shadow) = &self.semaphore_shadow {
            register_line(f, "shadow register, semaphores (reported)", shadow)?;
        }
        let max = self.max_token.map_or("none".to_owned(), |t| t.to_string());
        writeln!(f, "tokens: {} issues; max token {max}", self.tokens.len())?;
        list(f, &self.tokens)?;
        let l = &self.liveness;
        let median = l.median_latency.map_or("-".to_owned(), fmt_ns);
        let max = l
            .max_latency
            .map_or("-".to_owned(), |(id, ns)| format!("{} ({id})", fmt_ns(ns)));
        writeln!(
            f,
            "liveness: {} granted, {} failed, {} indeterminate; latency median {median}, max {max}",
            l.granted, l.failed, l.indeterminate
        )?;
        let recoveries: Vec<String> = l
            .recoveries
            .iter()
            .map(|r| {
                format!(
                    "after {}: next grant {}",
                    r.after,
                    r.next_grant.map_or("never".to_owned(), fmt_ns)
                )
            })
            .collect();
        list(f, &recoveries)?;
        let signals = &l.lost_signals;
        match (signals.get(signals.len() / 2), signals.last()) {
            (Some(median), Some(max)) => writeln!(
                f,
                "lost signal: {} holds learnt of a later grant of their lock; after it by median {}, max {} ({} after {})",
                signals.len(),
                fmt_ns(median.latency),
                fmt_ns(max.latency),
                max.hold,
                max.superseded_by
            )?,
            _ => writeln!(
                f,
                "lost signal: no hold learnt of a later grant of its lock"
            )?,
        }
        match &self.residue {
            None => writeln!(f, "residue: not scanned"),
            Some(residue) => {
                writeln!(f, "residue: {}", residue.len())?;
                list(f, residue)
            }
        }
    }
}
