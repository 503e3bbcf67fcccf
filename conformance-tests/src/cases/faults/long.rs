//! The long run: a mixed load under every fault a client-side harness can make, one after
//! another, for a time, judged by the history checker. The suite's own fault cases each isolate
//! one fault for a few rounds; this one is what a user runs against a deployment before trusting
//! it (`dlock conformance --faults --long`).

use std::time::Duration;

use dlock_api::LockName;
use dlock_test_servers::ProxyMode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::steps::{SURVIVED, proxied, verify};
use crate::history::{Count, Edge, Expect};
use crate::nemesis::link::Link;
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, Fault, Harness, ensure};

/// How long the long run lasts and how many workers it runs.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LongRun {
    /// At least this long: whole rounds of the faults are run until it has passed.
    pub duration: Duration,
    /// Worker processes (or tasks) at any time; a killed one is replaced.
    pub workers: u32,
}

impl LongRun {
    /// A run of at least `duration` with `workers` workers.
    pub fn new(duration: Duration, workers: u32) -> Self {
        Self { duration, workers }
    }
}

impl Default for LongRun {
    /// 30 s, six workers.
    fn default() -> Self {
        Self::new(Duration::from_secs(30), 6)
    }
}

/// One phase of the run: what is done, to whom, for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nemesis {
    /// Nothing: the baseline, and time for the lock to settle.
    Calm,
    /// A worker is stopped (`SIGSTOP`) for three lease TTLs, then resumed.
    PauseWorker,
    /// A worker is killed (`SIGKILL`) and another takes its place.
    KillWorker,
    /// The proxied workers' link is cut for two TTLs, then healed (connections reset).
    Partition,
    /// The proxied workers' link delays each chunk by a fortieth to a tenth of the TTL.
    SlowLink,
    /// The proxied workers' replies are thrown away for a TTL, then connections reset.
    LostReplies,
    /// The proxied workers' replies are held back for half a TTL, then delivered.
    LateReplies,
}

impl Nemesis {
    const ALL: [Self; 7] = [
        Self::Calm,
        Self::PauseWorker,
        Self::KillWorker,
        Self::Partition,
        Self::SlowLink,
        Self::LostReplies,
        Self::LateReplies,
    ];

    fn needs_link(self) -> bool {
        matches!(
            self,
            Self::Partition | Self::SlowLink | Self::LostReplies | Self::LateReplies
        )
    }

    /// How long the phase takes: the fault, then a TTL for the lock to come back.
    fn length(self, ttl: Duration) -> Duration {
        let fault = match self {
            Self::Calm | Self::KillWorker => Duration::ZERO,
            Self::PauseWorker => ttl.saturating_mul(3),
            Self::Partition | Self::SlowLink => ttl.saturating_mul(2),
            Self::LostReplies => ttl,
            Self::LateReplies => ttl.checked_div(2).unwrap_or_default(),
        };
        fault.saturating_add(ttl)
    }
}

/// The workers alive, each with whether it reaches the deployment through the link.
struct Crew<'a> {
    run: &'a Run,
    names: &'a [LockName],
    direct: &'a dyn Harness,
    linked: Option<&'a dyn Harness>,
    ttl: Duration,
    workers: Vec<WorkerProcess>,
    next_id: u32,
    ends_at: tokio::time::Instant,
}

impl Crew<'_> {
    /// Starts worker `next_id`, through the link every other one where there is a link, running
    /// until the end of the run.
    fn spawn(&mut self) -> Result<(), Failure> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        // Holds from nothing up to a whole TTL: some end at once, some need a renewal.
        let mut spec = self.run.spec(
            id,
            self.names,
            u32::MAX,
            self.ttl,
            self.ttl.saturating_mul(4),
            self.ttl,
        );
        spec.run_for = Some(
            self.ends_at
                .saturating_duration_since(tokio::time::Instant::now()),
        );
        let worker = match self.linked {
            Some(linked) if id % 2 == 0 => self.run.spawn_via(&spec, linked)?,
            _ if self.linked.is_some() => self.run.spawn_via(&spec, self.direct)?,
            _ => self.run.spawn(&spec)?,
        };
        self.workers.push(worker);
        Ok(())
    }
}

/// **The long run**: six or more workers (half of them behind a fault proxy, where the harness
/// can put one in front of the deployment) take locks of two to four names at random, holding
/// each from nothing up to a TTL, for the run's duration, while the harness does every fault it
/// can in turn: nothing, a paused worker, a killed one (replaced), and on the proxied workers'
/// link a partition, a slow and jittery link, lost replies and late ones. The history must come
/// out safe: no two holds of a name overlap, fencing took no stale write, tokens rise, nothing
/// is left on the server; what fencing refused and how fast the lock came back after each fault
/// is reported.
///
/// # Errors
/// A failure names what the checker found and where the run was dumped.
pub async fn long_run_under_every_nemesis(ctx: Ctx, plan: LongRun) -> CaseResult {
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let run = Run::start(&ctx).await?;
    let mut rng = StdRng::seed_from_u64(run.seed);
    let can_proxy = ctx
        .faults()
        .is_some_and(|f| f.supports(Fault::ProxyLink) || f.supports(Fault::OwnServer));
    let target = match can_proxy {
        true => Some(proxied(&ctx).await?),
        false => None,
    };
    let linked = target
        .as_ref()
        .map(|(target, link)| (target.reach_at)(&link.addrs()));
    let link: Option<&Link> = target.as_ref().map(|(_, link)| link);
    let direct: &dyn Harness = match &target {
        Some((target, _)) => &*target.harness,
        None => &**ctx.harness(),
    };
    let phases = schedule(plan.duration, ttl, link.is_some());
    let total: Duration = phases.iter().map(|phase| phase.length(ttl)).sum();
    let names: Vec<LockName> = (0..rng.random_range(2..=4))
        .map(|i| ctx.name(&format!("long{i}")))
        .collect();
    run.log(
        Edge::Start,
        format!("long run: {} workers, {total:?}, {phases:?}", plan.workers),
    );
    let mut crew = Crew {
        run: &run,
        names: &names,
        direct,
        linked: linked.as_deref(),
        ttl,
        workers: Vec::new(),
        next_id: 1,
        ends_at: dlock_api::raw::time::after(tokio::time::Instant::now(), total),
    };
    for _ in 0..plan.workers.max(2) {
        crew.spawn()?;
    }
    for phase in phases {
        apply(&mut crew, link, phase, &mut rng).await?;
    }
    for worker in std::mem::take(&mut crew.workers) {
        ctx.within_for(
            "a worker's last round",
            ttl.saturating_mul(4).saturating_add(timing.bound),
            worker.finish(),
        )
        .await??;
    }
    let residue = ctx.settled_residue_on(direct, &names).await?;
    let expect = Expect {
        // A cut-off holder's write can land before the next holder's first one (no newer token
        // seen yet), and that holder, working from an earlier read, drops it: fencing refuses
        // only a token older than one the resource has seen.
        lost_updates: Count::Any,
        residue: Count::Zero,
        ..SURVIVED
    };
    let report = verify(&run, &expect, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted >= usize::try_from(plan.workers).unwrap_or(usize::MAX),
        "only {} grants in {total:?}: {report}",
        report.liveness.granted
    );
    run.discard();
    Ok(())
}

/// Whole rounds of every fault that can be done here, until `duration` is reached.
fn schedule(duration: Duration, ttl: Duration, with_link: bool) -> Vec<Nemesis> {
    let round: Vec<Nemesis> = Nemesis::ALL
        .into_iter()
        .filter(|nemesis| with_link || !nemesis.needs_link())
        .collect();
    let mut phases = Vec::new();
    let mut planned = Duration::ZERO;
    while phases.is_empty() || planned < duration {
        for &nemesis in &round {
            planned = planned.saturating_add(nemesis.length(ttl));
            phases.push(nemesis);
        }
    }
    phases
}

/// Does `phase` to the crew or its link, and waits out its length.
async fn apply(
    crew: &mut Crew<'_>,
    link: Option<&Link>,
    phase: Nemesis,
    rng: &mut StdRng,
) -> Result<(), Failure> {
    let (run, ttl) = (crew.run, crew.ttl);
    let settle = || tokio::time::sleep(ttl);
    let link_fault = |mode: ProxyMode, what: &str| {
        if let Some(link) = link {
            link.set_mode(mode);
            run.log(Edge::Start, format!("{what} on the proxied workers' link"));
        }
    };
    let heal = |reset: bool| {
        if let Some(link) = link {
            if reset {
                link.reset();
            }
            link.heal();
            run.log(Edge::Stop, "heal the proxied workers' link");
        }
    };
    match phase {
        Nemesis::Calm => {}
        Nemesis::PauseWorker => {
            let victim = rng.random_range(..crew.workers.len());
            run.pause(&crew.workers[victim])?;
            tokio::time::sleep(ttl.saturating_mul(3)).await;
            run.resume(&crew.workers[victim])?;
        }
        Nemesis::KillWorker => {
            let victim = crew
                .workers
                .swap_remove(rng.random_range(..crew.workers.len()));
            run.kill(victim).await?;
            crew.spawn()?;
        }
        Nemesis::Partition => {
            link_fault(ProxyMode::Blackhole, "blackhole");
            tokio::time::sleep(ttl.saturating_mul(2)).await;
            heal(true);
        }
        Nemesis::SlowLink => {
            let (min, max) = (
                ttl.checked_div(40).unwrap_or_default(),
                ttl.checked_div(10).unwrap_or_default(),
            );
            link_fault(ProxyMode::Jitter { min, max }, "jitter");
            tokio::time::sleep(ttl.saturating_mul(2)).await;
            heal(false);
        }
        Nemesis::LostReplies => {
            link_fault(ProxyMode::DropReplies, "drop replies");
            tokio::time::sleep(ttl).await;
            heal(true);
        }
        Nemesis::LateReplies => {
            link_fault(ProxyMode::HoldReplies, "hold replies");
            tokio::time::sleep(ttl.checked_div(2).unwrap_or_default()).await;
            heal(false);
        }
    }
    settle().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_runs_at_least_once_and_the_run_is_at_least_as_long_as_asked() {
        let ttl = Duration::from_secs(2);
        let once = schedule(Duration::ZERO, ttl, true);
        assert_eq!(once, Nemesis::ALL.to_vec());
        let long = schedule(Duration::from_secs(120), ttl, true);
        let total: Duration = long.iter().map(|n| n.length(ttl)).sum();
        assert!(total >= Duration::from_secs(120), "{total:?}");
        let unlinked = schedule(Duration::ZERO, ttl, false);
        assert!(unlinked.iter().all(|n| !n.needs_link()), "{unlinked:?}");
        assert!(unlinked.contains(&Nemesis::KillWorker));
    }
}
