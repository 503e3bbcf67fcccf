//! `dlock bench`: uncontended acquire+release latency and throughput, contended hand-off, and
//! many names on one client, each next to the backend's raw protocol floor measured in the
//! same run (see [`crate::floor`]).
//!
//! Definitions: a *pair* is acquire + release on one name
//! by one client, back to back; *hand-off* is the time from the holder issuing its release to the
//! next holder's acquire returning, with `--waiters` clients on one name each holding `--hold`.
//! `--rounds N` repeats the whole measurement N times and reports each figure and each ratio
//! as the median over the rounds, with their spread (min–max).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use serde_json::{Value, json};

use crate::contend::{Contender, contend};
use crate::floor::{self, Floors, Measured, Ops, Pairs, ProcessCost, Throughput, WarmUp};
use crate::{BackendArgs, parse_duration};

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
}

/// How many alternating slices the uncontended phase and its floor are measured in.
const SLICES: u32 = 6;

/// Latency samples of one phase.
#[derive(Default)]
struct Samples {
    micros: Vec<f64>,
    elapsed: Duration,
    /// What the samples cost this process, where it was measured (pairs back to back).
    cost: Option<ProcessCost>,
}

impl Samples {
    /// Adds another slice's samples.
    fn extend(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed += other.elapsed;
        self.cost = match (self.cost, other.cost) {
            (Some(a), Some(b)) => Some(a + b),
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

    /// Samples from back-to-back measurements (their sum is the phase's duration).
    fn from_durations(samples: &[Duration]) -> Self {
        Self {
            micros: samples.iter().map(|d| d.as_secs_f64() * 1e6).collect(),
            elapsed: samples.iter().sum(),
            cost: None,
        }
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.micros.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.micros.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
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
    // dlock and the raw floors run interleaved (the uncontended phase in alternating slices),
    // so drift in the machine's speed over the run (common on shared VMs) affects both alike
    // and the ratios stay fair.
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
        print!("{}", table.render(&args, &label));
    }
    Ok(ExitCode::SUCCESS)
}

/// What one round measured.
struct Round {
    uncontended: Samples,
    floor: Option<Samples>,
    handoff: Samples,
    handoff_floor: Option<Samples>,
    /// Per task count: dlock's pairs/s, and the raw floor's.
    parallel: Vec<(usize, Throughput, Option<Throughput>)>,
}

/// One round: every phase of dlock, each followed (or, uncontended, interleaved) by its floor.
async fn measure(
    args: &BenchArgs,
    client: &Arc<dyn DistributedLock>,
    clients: &[Arc<dyn DistributedLock>],
    floors: Option<&Floors>,
    run: &str,
) -> Result<Round, LockError> {
    let name = LockName::new(format!("{run}/uncontended"))?;
    let slice = args.duration / SLICES;
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let mut uncontended = Samples::default();
    let mut floor = floors.map(|_| Samples::default());
    for _ in 0..SLICES {
        let pairs = floor::sample(WarmUp::Rounds(50), slice, async || {
            client.acquire(&name, &opts).await?.release().await
        })
        .await?;
        uncontended.extend(Samples::from_measured(&pairs));
        if let (Some(floors), Some(floor)) = (floors, floor.as_mut()) {
            floor.extend(Samples::from_measured(&floors.pairs(slice).await?));
        }
    }
    let handoff = handoff(
        clients.to_vec(),
        LockName::new(format!("{run}/handoff"))?,
        args.duration,
        args.hold,
    )
    .await?;
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
        let tasks = tasks.max(1);
        let phase = args.duration / 2;
        let names = (0..tasks)
            .map(|i| LockName::new(format!("{run}/parallel/{tasks}/{i}")))
            .collect::<Result<_, _>>()?;
        let pairs = Arc::new(DlockPairs {
            client: client.clone(),
            names,
            opts: LockOptions::new(),
        });
        let ours = floor::many(pairs, tasks, phase).await?;
        let raw = match floors {
            Some(floors) => Some(floors.parallel(tasks, phase).await?),
            None => None,
        };
        parallel.push((tasks, ours, raw));
    }
    Ok(Round {
        uncontended,
        floor,
        handoff,
        handoff_floor,
        parallel,
    })
}

/// dlock's pairs on one client, a name per task.
struct DlockPairs {
    client: Arc<dyn DistributedLock>,
    names: Vec<LockName>,
    opts: LockOptions,
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
fn ratio(ours: f64, floor: f64) -> f64 {
    rounded(ours / floor, 2)
}

/// `value` to `places` decimals, as the report shows it.
fn rounded(value: f64, places: i32) -> f64 {
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
        json["parallel_names"] = self
            .parallel
            .iter()
            .map(|&(tasks, ours, raw)| {
                let mut entry = json!({
                    "tasks": tasks,
                    "ops_per_sec": ours.per_sec.round(),
                    "cpu_us_per_op": cpu_us_per_pair(&ours),
                });
                if let Some(raw) = raw {
                    entry["floor_ops_per_sec"] = json!(raw.per_sec.round());
                    entry["floor_cpu_us_per_op"] = json!(cpu_us_per_pair(&raw));
                    entry["vs_floor"] = json!(ratio(ours.per_sec, raw.per_sec));
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
        json
    }
}

/// Fields that describe the run rather than measure it: the same in every round, never spread.
const SETTINGS: &[&str] = &["tasks", "waiters", "hold_us"];

/// How the rounds' reports make one.
#[derive(Clone, Copy)]
enum Combine {
    /// Each figure's median over the rounds (the mean of the middle two of an even count);
    /// settings and text as in the first round.
    Median,
    /// Each figure's `[min, max]` over the rounds; no settings, no text.
    Spread,
}

impl Combine {
    /// Combines the rounds' reports field by field; `None` when nothing is left.
    fn rounds(self, rounds: &[Value]) -> Option<Value> {
        self.field(rounds, None)
    }

    fn field(self, values: &[Value], key: Option<&str>) -> Option<Value> {
        let first = values.first()?;
        match first {
            Value::Object(fields) => {
                let mut out = serde_json::Map::new();
                for k in fields.keys() {
                    let children: Vec<Value> = values.iter().map(|v| v[k].clone()).collect();
                    if let Some(child) = self.field(&children, Some(k)) {
                        out.insert(k.clone(), child);
                    }
                }
                (!out.is_empty()).then_some(Value::Object(out))
            }
            Value::Array(items) => Some(Value::Array(
                (0..items.len())
                    .map(|i| {
                        let children: Vec<Value> = values.iter().map(|v| v[i].clone()).collect();
                        self.field(&children, None).unwrap_or(Value::Null)
                    })
                    .collect(),
            )),
            Value::Number(_) if key.is_some_and(|k| SETTINGS.contains(&k)) => {
                matches!(self, Self::Median).then(|| first.clone())
            }
            Value::Number(_) | Value::Null => {
                let numbers: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
                if numbers.len() < values.len() {
                    // A figure some round could not measure (no samples).
                    return Some(Value::Null);
                }
                let integers = values.iter().all(|v| v.is_u64() || v.is_i64());
                Some(self.figure(numbers, integers))
            }
            _ => matches!(self, Self::Median).then(|| first.clone()),
        }
    }

    /// One figure from its per-round values: counts (`integers`) stay integers, whole figures
    /// whole, ratios keep two decimals.
    fn figure(self, mut numbers: Vec<f64>, integers: bool) -> Value {
        let whole = numbers.iter().all(|n| n.fract() == 0.0);
        let shown = |n: f64| {
            if integers {
                json!(n.round() as i64)
            } else if whole {
                json!(n.round())
            } else {
                json!((n * 100.0).round() / 100.0)
            }
        };
        numbers.sort_by(f64::total_cmp);
        match self {
            Self::Median => {
                let mid = numbers.len() / 2;
                if numbers.len() % 2 == 1 {
                    shown(numbers[mid])
                } else {
                    shown((numbers[mid - 1] + numbers[mid]) / 2.0)
                }
            }
            Self::Spread => json!([shown(numbers[0]), shown(numbers[numbers.len() - 1])]),
        }
    }
}

/// The table `dlock bench` prints: the figures (the medians over the rounds), with their spread
/// after several rounds.
struct Report<'a> {
    figures: &'a Value,
    spread: Option<Value>,
}

/// How a figure is shown.
#[derive(Clone, Copy)]
enum Unit {
    Whole,
    Ratio,
    /// A plain number with this many decimals.
    Decimals(usize),
}

impl Report<'_> {
    /// The figure at JSON pointer `at`: its median, and `[min–max]` after several rounds.
    fn fig(&self, at: &str, unit: Unit) -> String {
        let show = |value: &Value, suffix: &str| match (value.as_f64(), unit) {
            (Some(n), Unit::Whole) => format!("{n:.0}"),
            (Some(n), Unit::Ratio) => format!("{n:.2}{suffix}"),
            (Some(n), Unit::Decimals(places)) => format!("{n:.places$}"),
            (None, _) => "-".to_owned(),
        };
        let median = self
            .figures
            .pointer(at)
            .map_or_else(|| "-".to_owned(), |v| show(v, "x"));
        match self.spread.as_ref().and_then(|s| s.pointer(at)) {
            Some(Value::Array(range)) if range.len() == 2 => {
                format!("{median} [{}–{}]", show(&range[0], ""), show(&range[1], ""))
            }
            _ => median,
        }
    }

    fn has(&self, at: &str) -> bool {
        self.figures.pointer(at).is_some()
    }

    fn render(&self, args: &BenchArgs, label: &str) -> String {
        use std::fmt::Write;
        let whole = |at: &str| self.fig(at, Unit::Whole);
        let text = |at: &str| {
            self.figures
                .pointer(at)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let mut out = format!("dlock bench against {label} ({:?} per phase", args.duration);
        if args.rounds > 1 {
            let _ = write!(
                out,
                "; {} rounds: medians, [min–max] over the rounds",
                args.rounds
            );
        }
        out.push_str(")\n\n");
        let cpu = |at: &str| self.fig(&format!("{at}/cpu_us_per_op"), Unit::Decimals(1));
        let switches =
            |at: &str| self.fig(&format!("{at}/context_switches_per_op"), Unit::Decimals(2));
        let mut rows = vec![row([
            "phase",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "CPU µs/op",
            "switches/op",
        ])];
        rows.push(vec![
            "uncontended acquire+release".to_owned(),
            whole("/uncontended/ops_per_sec"),
            whole("/uncontended/p50_us"),
            whole("/uncontended/p99_us"),
            cpu("/uncontended"),
            switches("/uncontended"),
        ]);
        if self.has("/raw_floor") {
            rows.push(vec![
                format!("raw floor: {}", text("/raw_floor/op")),
                whole("/raw_floor/ops_per_sec"),
                whole("/raw_floor/p50_us"),
                whole("/raw_floor/p99_us"),
                cpu("/raw_floor"),
                switches("/raw_floor"),
            ]);
        }
        rows.push(vec![
            format!("hand-off ({} clients, hold {:?})", args.waiters, args.hold),
            whole("/handoff/acquisitions_per_sec"),
            whole("/handoff/p50_us"),
            whole("/handoff/p99_us"),
        ]);
        if self.has("/raw_handoff_floor") {
            rows.push(vec![
                format!("raw hand-off floor: {}", text("/raw_handoff_floor/op")),
                String::new(),
                whole("/raw_handoff_floor/p50_us"),
                whole("/raw_handoff_floor/p99_us"),
            ]);
        }
        out.push_str(&table(&rows));
        out.push_str(
            "(CPU and switches: this process's CPU time and context switches, all threads, per \
             uncontended pair)\n",
        );
        let floor = self.has("/raw_parallel_floor");
        let mut rows = vec![if floor {
            row([
                "many names, one client",
                "dlock pairs/s",
                "raw floor pairs/s",
                "dlock / floor",
                "dlock CPU µs/pair",
                "floor CPU µs/pair",
            ])
        } else {
            row([
                "many names, one client",
                "dlock pairs/s",
                "dlock CPU µs/pair",
            ])
        }];
        let entries = self
            .figures
            .pointer("/parallel_names")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        for i in 0..entries {
            let tasks = self.figures["parallel_names"][i]["tasks"]
                .as_u64()
                .unwrap_or(0);
            let at = |key: &str| format!("/parallel_names/{i}/{key}");
            let mut line = vec![
                format!("{tasks} {}", if tasks == 1 { "task" } else { "tasks" }),
                whole(&at("ops_per_sec")),
            ];
            if floor {
                line.push(whole(&at("floor_ops_per_sec")));
                line.push(self.fig(&at("vs_floor"), Unit::Ratio));
            }
            line.push(self.fig(&at("cpu_us_per_op"), Unit::Decimals(1)));
            if floor {
                line.push(self.fig(&at("floor_cpu_us_per_op"), Unit::Decimals(1)));
            }
            rows.push(line);
        }
        out.push('\n');
        out.push_str(&table(&rows));
        if floor {
            let _ = writeln!(
                out,
                "(raw floor: {} pairs, a key per task, the tasks sharing {})",
                text("/raw_parallel_floor/op"),
                text("/raw_parallel_floor/client")
            );
        }
        out.push_str(
            "(CPU µs/pair: this process's CPU time while the tasks ran, all threads, over the \
             pairs they finished)\n",
        );
        if self.has("/ratios") {
            let ratio = |at: &str| self.fig(at, Unit::Ratio);
            let _ = write!(
                out,
                "\nuncontended throughput = {} the floor\n\
                 hand-off p50 = {} the raw hand-off floor\n\
                 hand-off p50 = {} the floor's round trip (pair p50 / 2)\n",
                ratio("/ratios/uncontended_throughput_vs_floor"),
                ratio("/ratios/handoff_p50_vs_raw_handoff_floor"),
                ratio("/ratios/handoff_p50_vs_floor_round_trip"),
            );
        }
        out
    }
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|&c| c.to_owned()).collect()
}

/// Lays `rows` out in columns: the first left-aligned, the others right-aligned.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in rows {
        let mut line = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[c] - cell.chars().count());
            if c == 0 {
                line.push_str(cell);
                line.push_str(&pad);
            } else {
                line.push_str("  ");
                line.push_str(&pad);
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A dlock client contending in the hand-off phase.
struct DlockContender {
    client: Arc<dyn DistributedLock>,
    name: LockName,
    options: LockOptions,
    guard: Option<LockGuard>,
}

impl Contender for DlockContender {
    async fn lock(&mut self) -> Result<(), LockError> {
        self.guard = Some(self.client.acquire(&self.name, &self.options).await?);
        Ok(())
    }

    async fn unlock(&mut self) -> Result<(), LockError> {
        match self.guard.take() {
            Some(guard) => guard.release().await,
            None => Ok(()),
        }
    }
}

async fn handoff(
    clients: Vec<Arc<dyn DistributedLock>>,
    name: LockName,
    duration: Duration,
    hold: Duration,
) -> Result<Samples, LockError> {
    let options = LockOptions::new().with_wait_timeout(duration + Duration::from_secs(30));
    let contenders = clients
        .into_iter()
        .map(|client| DlockContender {
            client,
            name: name.clone(),
            options: options.clone(),
            guard: None,
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
    use super::*;

    fn round(ops: f64, samples: u64, ratio: f64, tasks_ops: f64) -> Value {
        json!({
            "uncontended": {"ops_per_sec": ops, "p50_us": 100.0, "samples": samples},
            "handoff": {"waiters": 4, "hold_us": 2000, "p50_us": 300.0},
            "parallel_names": [{"tasks": 16, "ops_per_sec": tasks_ops, "vs_floor": ratio}],
            "raw_floor": {"op": "SET NX PX", "ops_per_sec": 2.0 * ops},
            "ratios": {"uncontended_throughput_vs_floor": ratio},
        })
    }

    #[test]
    fn rounds_make_medians_and_spreads_of_every_figure_and_ratio() {
        let rounds = [
            round(300.0, 30, 0.9, 3000.0),
            round(100.0, 10, 0.5, 1000.0),
            round(200.0, 21, 0.77, 2000.0),
        ];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["ops_per_sec"], json!(200.0));
        assert_eq!(median["uncontended"]["samples"], json!(21));
        assert_eq!(median["raw_floor"]["ops_per_sec"], json!(400.0));
        assert_eq!(
            median["ratios"]["uncontended_throughput_vs_floor"],
            json!(0.77)
        );
        assert_eq!(median["parallel_names"][0]["tasks"], json!(16));
        assert_eq!(median["parallel_names"][0]["vs_floor"], json!(0.77));
        // Settings and text as given.
        assert_eq!(median["handoff"]["waiters"], json!(4));
        assert_eq!(median["raw_floor"]["op"], json!("SET NX PX"));

        let spread = Combine::Spread.rounds(&rounds).unwrap();
        assert_eq!(spread["uncontended"]["ops_per_sec"], json!([100.0, 300.0]));
        assert_eq!(spread["uncontended"]["samples"], json!([10, 30]));
        assert_eq!(
            spread["ratios"]["uncontended_throughput_vs_floor"],
            json!([0.5, 0.9])
        );
        assert_eq!(
            spread["parallel_names"][0]["ops_per_sec"],
            json!([1000.0, 3000.0])
        );
        // No spread of what does not vary by nature.
        assert!(spread["handoff"].get("waiters").is_none(), "{spread}");
        assert!(spread["raw_floor"].get("op").is_none(), "{spread}");
        assert!(
            spread["parallel_names"][0].get("tasks").is_none(),
            "{spread}"
        );
    }

    #[test]
    fn an_even_count_of_rounds_takes_the_mean_of_the_middle_two() {
        let rounds = [round(100.0, 10, 0.5, 1.0), round(201.0, 11, 0.6, 2.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["ops_per_sec"], json!(151.0));
        assert_eq!(median["uncontended"]["samples"], json!(11));
        assert_eq!(
            median["ratios"]["uncontended_throughput_vs_floor"],
            json!(0.55)
        );
    }

    #[test]
    fn a_figure_a_round_could_not_measure_has_no_median() {
        let mut empty = round(100.0, 0, 0.5, 1.0);
        empty["uncontended"]["p50_us"] = Value::Null;
        let rounds = [empty, round(100.0, 10, 0.5, 1.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["p50_us"], Value::Null);
    }

    #[test]
    fn the_table_shows_medians_with_their_spread_after_several_rounds() {
        let rounds = [round(100.0, 10, 0.5, 1000.0), round(300.0, 30, 0.9, 3000.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        let report = Report {
            figures: &median,
            spread: Combine::Spread.rounds(&rounds),
        };
        assert_eq!(
            report.fig("/uncontended/ops_per_sec", Unit::Whole),
            "200 [100–300]"
        );
        assert_eq!(
            report.fig("/ratios/uncontended_throughput_vs_floor", Unit::Ratio),
            "0.70x [0.50–0.90]"
        );
        let single = Report {
            figures: &rounds[0],
            spread: None,
        };
        assert_eq!(single.fig("/uncontended/ops_per_sec", Unit::Whole), "100");
        assert_eq!(single.fig("/handoff/p99_us", Unit::Whole), "-");
    }

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
            per_sec: 4000.0,
            pairs: 3,
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
}
