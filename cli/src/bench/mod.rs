//! `dlock bench`: uncontended acquire+release latency and throughput, contended hand-off, and
//! many names on one client, each next to the backend's raw protocol floor measured in the
//! same run (see [`crate::floor`]).
//!
//! Definitions: a *pair* is acquire + release on one name
//! by one client, back to back; *hand-off* is the time from the holder issuing its release to the
//! next holder's acquire returning, with `--waiters` clients on one name each holding `--hold`.
//! `--rounds N` repeats the whole measurement N times and reports each figure and each ratio
//! as the median over the rounds, with their spread (min–max).

mod permits;
mod profile;
mod read_mostly;
mod report;
mod scale;
mod set;
mod verdict;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use serde_json::{Value, json};

use crate::contend::{Contender, contend};
use crate::floor::{self, Floors, Measured, Ops, Pairs, ProcessCost, Throughput, WarmUp};
use crate::{BackendArgs, parse_duration};
use report::{Combine, Report};

/// Arguments of `dlock bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// How long each phase runs.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    duration: Duration,
    /// Repeat the whole measurement (dlock's phases and their floors) this many times, and
    /// report each figure and ratio as the median over the rounds with its spread (min–max).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Clients contending for one name in the hand-off phase.
    #[arg(long, default_value_t = 4)]
    waiters: usize,
    /// How long each contending client holds the lock.
    #[arg(long, value_parser = parse_duration, default_value = "2ms")]
    hold: Duration,
    /// Task counts for the many-names phase: that many tasks share one client, each locking its
    /// own name (and as many tasks share one raw client of the backend's driver, for the floor).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    parallel: Vec<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of the phases above: start this many tasks at once on `--waiters` clients over
    /// `--names` names, each acquiring once with `--flood-wait`, holding `--hold`; report how
    /// many acquired and how many timed out.
    #[arg(long)]
    flood: Option<usize>,
    /// Names in the flood.
    #[arg(long, default_value_t = 32)]
    names: usize,
    /// Each flood acquire's wait timeout.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    flood_wait: Duration,
    /// Instead of the phases above: a semaphore of each of these numbers of permits, its
    /// uncontended pair (one permit taken and given back) and the hand-off of its last free
    /// permit (the others held throughout), each against the backend's raw floor of the same
    /// algorithm, e.g. `--permits 1,8`.
    #[arg(long, value_delimiter = ',')]
    permits: Option<Vec<u32>>,
    /// Instead of the phases above: a read-mostly mix on a reader-writer lock, this many
    /// readers on clients of their own and one writer: the readers' grants per second against
    /// the same clients taking the lock, and the writer's wait p50/p99.
    #[arg(long, conflicts_with_all = ["permits", "flood"])]
    read_mostly: Option<usize>,
    /// Instead of the phases above: a set of this many names taken with `acquire_all` and
    /// released, against the same names taken one by one and released, uncontended: sets per
    /// second of each and the ratio.
    #[arg(long, conflicts_with_all = ["permits", "flood", "read_mostly"])]
    set: Option<usize>,
    #[command(flatten)]
    scale: scale::ScaleArgs,
    /// Instead of the phases above: only this side's uncontended pairs, for a profiler.
    #[arg(long, hide = true, conflicts_with_all = ["permits", "flood", "read_mostly", "set"])]
    profile: Option<profile::ProfileSide>,
    /// With `--profile`: stop after this many measured pairs (after the warm-up).
    #[arg(long, hide = true, requires = "profile")]
    pairs: Option<u64>,
    /// With `--profile`: instead of uncontended pairs, this many tasks sharing the client, each
    /// on a name of its own (the many-names phase), for `--duration`.
    #[arg(long, hide = true, requires = "profile", conflicts_with = "pairs")]
    profile_tasks: Option<usize>,
    /// With `--profile`: the pairs take one permit of a semaphore of this many (dlock's, or
    /// the floor's of the same algorithm) instead of a lock.
    #[arg(
        long,
        hide = true,
        requires = "profile",
        conflicts_with = "profile_tasks"
    )]
    profile_permits: Option<u32>,
}

/// How many alternating slices the uncontended phase and its floors are measured in.
const SLICES: u32 = 6;

/// How many alternating slices each many-names task count and its floors are measured in.
const MANY_SLICES: u32 = 3;

/// What one slice of an interleaved phase measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Dlock,
    Floor,
    FencedFloor,
    /// The crate a user would pick instead of dlock ([`Ops::peer_pair`]).
    Peer,
}

impl Side {
    /// dlock, and the floors `floors` measures.
    fn all(floors: Option<&Floors>) -> Vec<Self> {
        let mut sides = vec![Self::Dlock];
        if let Some(floors) = floors {
            sides.push(Self::Floor);
            if floors.ops().fenced_pair.is_some() {
                sides.push(Self::FencedFloor);
            }
            if floors.ops().peer_pair.is_some() {
                sides.push(Self::Peer);
            }
        }
        sides
    }

    /// The order of `sides` in slice `slice`: turned by one each slice, so that each goes first
    /// as often. What runs first after another phase (the hand-off, a smaller task count) runs
    /// under other conditions than what follows it: on a VM, a third faster or slower.
    fn rotated(sides: &[Self], slice: u32) -> impl Iterator<Item = Self> + '_ {
        let turn = (slice as usize).checked_rem(sides.len()).unwrap_or(0);
        sides[turn..].iter().chain(&sides[..turn]).copied()
    }
}

/// Latency samples of one phase.
#[derive(Default)]
pub(super) struct Samples {
    pub(super) micros: Vec<f64>,
    elapsed: Duration,
    /// What the samples cost this process, where it was measured (pairs back to back).
    cost: Option<ProcessCost>,
}

impl Samples {
    /// Adds another slice's samples.
    fn extend(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed = self.elapsed.saturating_add(other.elapsed);
        self.cost = match (self.cost, other.cost) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
    }

    /// Pairs measured back to back, with their cost.
    fn from_measured(measured: &Measured) -> Self {
        Self {
            cost: Some(measured.cost),
            ..Self::from_durations(&measured.latencies)
        }
    }

    /// The JSON fields of the samples' cost per operation, if measured.
    fn cost_fields(&self, json: &mut Value) {
        if let Some(cost) = self.cost {
            let operations = self.micros.len() as u64;
            json["cpu_us_per_op"] = json!(rounded(cost.cpu_us_per(operations), 1));
            json["context_switches_per_op"] = json!(rounded(cost.switches_per(operations), 2));
        }
    }

    /// This process's CPU µs per sample, where measured.
    fn cpu_per_op(&self) -> Option<f64> {
        self.cost
            .map(|cost| cost.cpu_us_per(self.micros.len() as u64))
    }

    /// Samples from back-to-back measurements (their sum is the phase's duration).
    pub(super) fn from_durations(samples: &[Duration]) -> Self {
        Self {
            micros: samples.iter().map(|d| d.as_secs_f64() * 1e6).collect(),
            elapsed: samples.iter().sum(),
            cost: None,
        }
    }

    pub(super) fn percentile(&self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.micros.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * sorted.len().saturating_sub(1) as f64).round() as usize;
        sorted[rank]
    }

    fn per_sec(&self) -> f64 {
        self.micros.len() as f64 / self.elapsed.as_secs_f64()
    }
}

pub(super) async fn bench(args: BenchArgs) -> Result<ExitCode, LockError> {
    if args.waiters < 2 {
        return Err(LockError::invalid(
            "--waiters",
            "hand-off needs at least 2 clients",
        ));
    }
    let client = args.backend.connect().await?;
    let label = client.to_string();
    let run = format!("dlock-bench/{}", std::process::id());
    if let Some(tasks) = args.flood {
        let mut clients = Vec::with_capacity(args.waiters);
        for _ in 0..args.waiters {
            clients.push(args.backend.connect().await?);
        }
        let flood =
            crate::flood::flood(clients, &run, args.names, tasks, args.flood_wait, args.hold)
                .await?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "backend": label,
                    "flood": {
                        "tasks": tasks, "clients": args.waiters, "names": args.names,
                        "wait_ms": args.flood_wait.as_millis() as u64,
                        "hold_us": args.hold.as_micros() as u64,
                        "acquired": flood.acquired, "timed_out": flood.timed_out,
                        "failed": flood.failed,
                        "p50_us": flood.percentile(50.0).round(),
                        "p99_us": flood.percentile(99.0).round(),
                        "elapsed_ms": flood.elapsed.as_millis() as u64,
                    }
                })
            );
        } else {
            println!(
                "dlock bench --flood against {label}: {tasks} tasks, {} clients, {} names, wait {:?}, hold {:?}\n\
                 acquired {}, timed out {}, failed {}; acquire p50 {:.0} µs, p99 {:.0} µs; {:?} in all",
                args.waiters,
                args.names,
                args.flood_wait,
                args.hold,
                flood.acquired,
                flood.timed_out,
                flood.failed,
                flood.percentile(50.0),
                flood.percentile(99.0),
                flood.elapsed
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(permits) = &args.permits {
        return permits::bench(&args, permits, &client, &label, &run).await;
    }
    if let Some(readers) = args.read_mostly {
        return read_mostly::bench(&args, readers, &client, &label, &run).await;
    }
    if let Some(members) = args.set {
        return set::bench(&args, members, &client, &label, &run).await;
    }
    if let Some(side) = args.profile {
        return profile::bench(&args, side, &client, &run).await;
    }
    if args.scale.scale.is_some() {
        return scale::bench(&args, &client, &label, &run).await;
    }
    // dlock and the raw floors run interleaved (the uncontended and many-names phases in
    // alternating slices, each side first in turn), so drift in the machine's speed over the run
    // (common on shared VMs) affects both alike and the ratios stay fair.
    let floors = Floors::for_url(&args.backend.url()?)?;
    let mut clients = Vec::with_capacity(args.waiters);
    for _ in 0..args.waiters {
        clients.push(args.backend.connect().await?);
    }
    let ops = floors.as_ref().map(Floors::ops);
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        let round = measure(&args, &client, &clients, floors.as_ref(), &run).await?;
        rounds.push(round.to_json(&args, ops.as_ref()));
    }
    let mut report = Combine::Median.rounds(&rounds).unwrap_or(Value::Null);
    let spread = Combine::Spread.rounds(&rounds);
    if args.json {
        report["backend"] = json!(label);
        report["rounds"] = Value::Array(rounds);
        report["spread"] = spread.unwrap_or(Value::Null);
        println!("{report}");
    } else {
        let table = Report {
            figures: &report,
            spread: (args.rounds > 1).then_some(spread).flatten(),
        };
        print!(
            "{}",
            table.render(&report::Run {
                label: &label,
                duration: args.duration,
                rounds: args.rounds,
                waiters: args.waiters,
                hold: args.hold,
            })
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What one round measured.
struct Round {
    uncontended: Samples,
    floor: Option<Samples>,
    /// The floor's pairs with a fencing token, where the plain floor takes none.
    fenced_floor: Option<Samples>,
    /// The peer's pairs, where one is measured.
    peer: Option<Samples>,
    handoff: Samples,
    handoff_floor: Option<Samples>,
    /// Leadership passed on by resignation, where the backend has elections.
    election_handoff: Option<Samples>,
    /// Per task count: dlock's pairs/s, the raw floor's, and the fenced floor's.
    parallel: Vec<Parallel>,
}

/// The many-names phase at one task count.
struct Parallel {
    tasks: usize,
    ours: Throughput,
    floor: Option<Throughput>,
    fenced_floor: Option<Throughput>,
    peer: Option<Throughput>,
}

/// One round: every phase of dlock with its floors, the hand-off followed by its floor, the
/// others interleaved with theirs in alternating slices.
async fn measure(
    args: &BenchArgs,
    client: &Arc<dyn DistributedLock>,
    clients: &[Arc<dyn DistributedLock>],
    floors: Option<&Floors>,
    run: &str,
) -> Result<Round, LockError> {
    let name = LockName::new(format!("{run}/uncontended"))?;
    let slice = args.duration.checked_div(SLICES).unwrap_or_default();
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let sides = Side::all(floors);
    let mut uncontended = Samples::default();
    let mut floor: Option<Samples> = None;
    let mut fenced_floor: Option<Samples> = None;
    let mut peer: Option<Samples> = None;
    for slice_no in 0..SLICES {
        for side in Side::rotated(&sides, slice_no) {
            let measured = match (side, floors) {
                (Side::Dlock, _) => {
                    let pairs = floor::sample(WarmUp::Rounds(50), slice, async || {
                        client.acquire(&name, &opts).await?.release().await
                    })
                    .await?;
                    uncontended.extend(Samples::from_measured(&pairs));
                    continue;
                }
                (Side::Floor, Some(floors)) => (&mut floor, Some(floors.pairs(slice).await?)),
                (Side::FencedFloor, Some(floors)) => {
                    (&mut fenced_floor, floors.fenced_pairs(slice).await?)
                }
                (Side::Peer, Some(floors)) => (&mut peer, floors.peer_pairs(slice).await?),
                (_, None) => continue,
            };
            if let (samples, Some(pairs)) = measured {
                samples
                    .get_or_insert_with(Samples::default)
                    .extend(Samples::from_measured(&pairs));
            }
        }
    }
    let handoff = handoff(
        clients.to_vec(),
        (LockName::new(format!("{run}/handoff"))?, Holding::Lock),
        args.duration,
        args.hold,
    )
    .await?;
    // The election's hand-over is the lock's with a campaign and a resignation around it: the
    // same raw hand-off floor bounds it.
    let election_handoff = if client.capabilities().elections {
        Some(
            self::handoff(
                clients.to_vec(),
                (LockName::new(format!("{run}/election"))?, Holding::Leader),
                args.duration,
                args.hold,
            )
            .await?,
        )
    } else {
        None
    };
    let handoff_floor = match floors {
        Some(floors) => Some(Samples::from_durations(
            &floors
                .handoffs(args.duration, args.waiters, args.hold)
                .await?,
        )),
        None => None,
    };
    let mut parallel = Vec::new();
    for &tasks in &args.parallel {
        let phase = args.duration.checked_div(2).unwrap_or_default();
        parallel.push(many_names(client, floors, &sides, run, tasks.max(1), phase).await?);
    }
    Ok(Round {
        uncontended,
        floor,
        fenced_floor,
        peer,
        handoff,
        handoff_floor,
        election_handoff,
        parallel,
    })
}

/// The many-names phase at `tasks` tasks: dlock's pairs, a name per task, on `client`, and the
/// floors' (`sides`), alternating in [`MANY_SLICES`] slices that together last `phase` each.
async fn many_names(
    client: &Arc<dyn DistributedLock>,
    floors: Option<&Floors>,
    sides: &[Side],
    run: &str,
    tasks: usize,
    phase: Duration,
) -> Result<Parallel, LockError> {
    let slice = phase.checked_div(MANY_SLICES).unwrap_or_default();
    let names = (0..tasks)
        .map(|i| LockName::new(format!("{run}/parallel/{tasks}/{i}")))
        .collect::<Result<_, _>>()?;
    let pairs = Arc::new(DlockPairs {
        client: client.clone(),
        names,
        opts: LockOptions::new(),
    });
    let mut measured = Parallel {
        tasks,
        ours: Throughput::default(),
        floor: None,
        fenced_floor: None,
        peer: None,
    };
    for slice_no in 0..MANY_SLICES {
        for side in Side::rotated(sides, slice_no) {
            let (total, run) = match (side, floors) {
                (Side::Dlock, _) => {
                    let run = floor::many(pairs.clone(), tasks, slice).await?;
                    measured.ours = measured.ours.add(run);
                    continue;
                }
                (Side::Floor, Some(floors)) => (
                    &mut measured.floor,
                    Some(floors.parallel(tasks, slice).await?),
                ),
                (Side::FencedFloor, Some(floors)) => (
                    &mut measured.fenced_floor,
                    floors.fenced_parallel(tasks, slice).await?,
                ),
                (Side::Peer, Some(floors)) => (
                    &mut measured.peer,
                    floors.peer_parallel(tasks, slice).await?,
                ),
                (_, None) => continue,
            };
            if let Some(run) = run {
                *total = Some(total.unwrap_or_default().add(run));
            }
        }
    }
    Ok(measured)
}

/// dlock's pairs on one client, a name per task.
pub(super) struct DlockPairs {
    pub(super) client: Arc<dyn DistributedLock>,
    pub(super) names: Vec<LockName>,
    pub(super) opts: LockOptions,
}

impl Pairs for DlockPairs {
    async fn pair(&self, task: usize) -> Result<(), LockError> {
        let guard = self.client.acquire(&self.names[task], &self.opts).await?;
        guard.release().await
    }
}

/// The bench process's CPU per pair of a many-names run, in µs to one decimal.
fn cpu_us_per_pair(run: &Throughput) -> f64 {
    rounded(run.cost.cpu_us_per(run.pairs), 1)
}

/// `ours / floor`, to two decimals.
pub(super) fn ratio(ours: f64, floor: f64) -> f64 {
    rounded(ours / floor, 2)
}

/// `value` to `places` decimals, as the report shows it.
pub(super) fn rounded(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

impl Round {
    /// The round as the JSON report's fields (figures rounded as reported).
    fn to_json(&self, args: &BenchArgs, ops: Option<&Ops>) -> Value {
        let (uncontended, handoff) = (&self.uncontended, &self.handoff);
        let mut json = json!({
            "uncontended": {
                "ops_per_sec": uncontended.per_sec().round(),
                "p50_us": uncontended.percentile(50.0).round(),
                "p99_us": uncontended.percentile(99.0).round(),
                "samples": uncontended.micros.len(),
            },
            "handoff": {
                "waiters": args.waiters,
                "hold_us": args.hold.as_micros() as u64,
                "p50_us": handoff.percentile(50.0).round(),
                "p99_us": handoff.percentile(99.0).round(),
                "acquisitions_per_sec": handoff.per_sec().round(),
                "samples": handoff.micros.len(),
            },
        });
        uncontended.cost_fields(&mut json["uncontended"]);
        if let Some(election) = &self.election_handoff {
            json["election_handoff"] = json!({
                "p50_us": election.percentile(50.0).round(),
                "p99_us": election.percentile(99.0).round(),
                "samples": election.micros.len(),
            });
        }
        json["parallel_names"] = self
            .parallel
            .iter()
            .map(|run| {
                let mut entry = json!({
                    "tasks": run.tasks,
                    "ops_per_sec": run.ours.per_sec().round(),
                    "cpu_us_per_op": cpu_us_per_pair(&run.ours),
                });
                if let Some(raw) = run.floor {
                    entry["floor_ops_per_sec"] = json!(raw.per_sec().round());
                    entry["floor_cpu_us_per_op"] = json!(cpu_us_per_pair(&raw));
                    entry["vs_floor"] = json!(ratio(run.ours.per_sec(), raw.per_sec()));
                }
                if let Some(fenced) = run.fenced_floor {
                    entry["fenced_floor_ops_per_sec"] = json!(fenced.per_sec().round());
                    entry["fenced_floor_cpu_us_per_op"] = json!(cpu_us_per_pair(&fenced));
                    entry["vs_fenced_floor"] = json!(ratio(run.ours.per_sec(), fenced.per_sec()));
                }
                if let Some(peer) = run.peer {
                    entry["peer_ops_per_sec"] = json!(peer.per_sec().round());
                    entry["peer_cpu_us_per_op"] = json!(cpu_us_per_pair(&peer));
                    entry["vs_peer"] = json!(ratio(run.ours.per_sec(), peer.per_sec()));
                }
                entry
            })
            .collect();
        let (Some(ops), Some(floor), Some(hf)) = (ops, &self.floor, &self.handoff_floor) else {
            return json;
        };
        json["raw_floor"] = json!({
            "op": ops.pair,
            "ops_per_sec": floor.per_sec().round(),
            "p50_us": floor.percentile(50.0).round(),
            "p99_us": floor.percentile(99.0).round(),
            "samples": floor.micros.len(),
        });
        floor.cost_fields(&mut json["raw_floor"]);
        if let (Some(op), Some(fenced)) = (ops.fenced_pair, &self.fenced_floor) {
            json["raw_fenced_floor"] = json!({
                "op": op,
                "ops_per_sec": fenced.per_sec().round(),
                "p50_us": fenced.percentile(50.0).round(),
                "p99_us": fenced.percentile(99.0).round(),
                "samples": fenced.micros.len(),
            });
            fenced.cost_fields(&mut json["raw_fenced_floor"]);
        }
        if let (Some(op), Some(peer)) = (ops.peer_pair, &self.peer) {
            json["peer"] = json!({
                "op": op,
                "ops_per_sec": peer.per_sec().round(),
                "p50_us": peer.percentile(50.0).round(),
                "p99_us": peer.percentile(99.0).round(),
                "samples": peer.micros.len(),
            });
            peer.cost_fields(&mut json["peer"]);
        }
        json["raw_handoff_floor"] = json!({
            "op": ops.handoff,
            "p50_us": hf.percentile(50.0).round(),
            "p99_us": hf.percentile(99.0).round(),
            "samples": hf.micros.len(),
        });
        json["raw_parallel_floor"] = json!({"op": ops.pair, "client": ops.client});
        json["ratios"] = json!({
            "uncontended_throughput_vs_floor": ratio(uncontended.per_sec(), floor.per_sec()),
            "handoff_p50_vs_raw_handoff_floor":
                ratio(handoff.percentile(50.0), hf.percentile(50.0)),
            "handoff_p50_vs_floor_round_trip":
                ratio(handoff.percentile(50.0), floor.percentile(50.0) / 2.0),
        });
        if let Some(election) = &self.election_handoff {
            json["ratios"]["election_handoff_p50_vs_raw_handoff_floor"] =
                json!(ratio(election.percentile(50.0), hf.percentile(50.0)));
        }
        if let Some(fenced) = &self.fenced_floor {
            json["ratios"]["uncontended_throughput_vs_fenced_floor"] =
                json!(ratio(uncontended.per_sec(), fenced.per_sec()));
        }
        if let Some(peer) = &self.peer {
            json["ratios"]["uncontended_throughput_vs_peer"] =
                json!(ratio(uncontended.per_sec(), peer.per_sec()));
        }
        for (samples, key) in [
            (Some(floor), "uncontended_cpu_vs_floor"),
            (
                self.fenced_floor.as_ref(),
                "uncontended_cpu_vs_fenced_floor",
            ),
            (self.peer.as_ref(), "uncontended_cpu_vs_peer"),
        ] {
            if let (Some(ours), Some(theirs)) = (
                uncontended.cpu_per_op(),
                samples.and_then(Samples::cpu_per_op),
            ) {
                json["ratios"][key] = json!(ratio(ours, theirs));
            }
        }
        json
    }
}

/// A dlock client contending in the hand-off phase.
struct DlockContender {
    client: Arc<dyn DistributedLock>,
    name: LockName,
    options: LockOptions,
    guard: Option<LockGuard>,
    holding: Holding,
}

/// What the hand-off phase passes from client to client.
#[derive(Clone, Copy, Debug)]
pub(super) enum Holding {
    Lock,
    /// One of this many permits of a semaphore.
    Permit(u32),
    /// The leadership of an election: a release is a resignation, the next grant a campaign won.
    Leader,
}

impl Contender for DlockContender {
    async fn lock(&mut self) -> Result<(), LockError> {
        let (client, name, options) = (&self.client, &self.name, &self.options);
        self.guard = Some(match self.holding {
            Holding::Lock => client.acquire(name, options).await?,
            Holding::Permit(permits) => client.acquire_permit(name, permits, options).await?,
            Holding::Leader => client
                .campaign(name, b"dlock-bench", options)
                .await?
                .into_guard(),
        });
        Ok(())
    }

    async fn unlock(&mut self) -> Result<(), LockError> {
        match self.guard.take() {
            Some(guard) => guard.release().await,
            None => Ok(()),
        }
    }
}

pub(super) async fn handoff(
    clients: Vec<Arc<dyn DistributedLock>>,
    (name, holding): (LockName, Holding),
    duration: Duration,
    hold: Duration,
) -> Result<Samples, LockError> {
    let options =
        LockOptions::new().with_wait_timeout(duration.saturating_add(Duration::from_secs(30)));
    let contenders = clients
        .into_iter()
        .map(|client| DlockContender {
            client,
            name: name.clone(),
            options: options.clone(),
            guard: None,
            holding,
        })
        .collect();
    let (samples, elapsed) = contend(contenders, duration, hold).await?;
    Ok(Samples {
        elapsed,
        ..Samples::from_durations(&samples)
    })
}

#[cfg(test)]
mod tests {
    use super::report::Unit;
    use super::*;

    #[test]
    fn measured_pairs_report_their_cost_per_pair_and_others_none() {
        let measured = Measured {
            latencies: vec![Duration::from_micros(200); 8],
            cost: ProcessCost {
                cpu: Duration::from_micros(1000),
                context_switches: 36,
            },
        };
        let mut pairs = Samples::from_measured(&measured);
        pairs.extend(Samples::from_measured(&measured));
        let mut json = json!({});
        pairs.cost_fields(&mut json);
        assert_eq!(json["cpu_us_per_op"], json!(125.0));
        assert_eq!(json["context_switches_per_op"], json!(4.5));
        let report = Report {
            figures: &json!({ "uncontended": json }),
            spread: None,
        };
        assert_eq!(
            report.fig("/uncontended/cpu_us_per_op", Unit::Decimals(1)),
            "125.0"
        );

        let many = Throughput {
            pairs: 3,
            elapsed: Duration::from_micros(750),
            cost: ProcessCost {
                cpu: Duration::from_micros(100),
                context_switches: 0,
            },
        };
        assert_eq!(cpu_us_per_pair(&many), 33.3);

        let mut unmeasured = json!({});
        Samples::from_durations(&measured.latencies).cost_fields(&mut unmeasured);
        assert_eq!(unmeasured, json!({}));
    }

    #[test]
    fn each_side_goes_first_in_as_many_slices() {
        let sides = [Side::Dlock, Side::Floor, Side::FencedFloor];
        let orders: Vec<Vec<Side>> = (0..3).map(|k| Side::rotated(&sides, k).collect()).collect();
        assert_eq!(orders[0], sides);
        assert_eq!(orders[1], [Side::Floor, Side::FencedFloor, Side::Dlock]);
        assert_eq!(orders[2], [Side::FencedFloor, Side::Dlock, Side::Floor]);
        assert_eq!(
            Side::rotated(&[Side::Dlock], 5).collect::<Vec<_>>(),
            [Side::Dlock]
        );
        assert_eq!(Side::rotated(&[], 1).count(), 0);
    }
}
