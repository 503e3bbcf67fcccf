//! `dlock bench`: uncontended acquire+release latency and throughput, and contended hand-off.
//!
//! Definitions: a *pair* is acquire + release on one name
//! by one client, back to back; *hand-off* is the time from the holder issuing its release to the
//! next holder's acquire returning, with `--waiters` clients on one name each holding `--hold`.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};

use dlock::BackendScheme;
use tokio::sync::Notify;

use crate::{BackendArgs, parse_duration};

/// Arguments of `dlock bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// How long each phase runs.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    duration: Duration,
    /// Clients contending for one name in the hand-off phase.
    #[arg(long, default_value_t = 4)]
    waiters: usize,
    /// How long each contending client holds the lock.
    #[arg(long, value_parser = parse_duration, default_value = "2ms")]
    hold: Duration,
    /// Task counts for the many-names phase: that many tasks share one client, each locking its
    /// own name.
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
}

impl Samples {
    /// Adds another slice's samples.
    fn extend(&mut self, other: Samples) {
        self.micros.extend(other.micros);
        self.elapsed += other.elapsed;
    }

    /// Samples from back-to-back measurements (their sum is the phase's duration).
    fn from_durations(samples: &[Duration]) -> Self {
        Self {
            micros: samples.iter().map(|d| d.as_secs_f64() * 1e6).collect(),
            elapsed: samples.iter().sum(),
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
    // dlock and the raw floor run in alternating slices, so drift in the machine's speed over the
    // run (common on shared VMs) affects both alike and the ratio stays fair.
    let url = args.backend.url()?;
    let name = LockName::new(format!("{run}/uncontended"))?;
    let slice = args.duration / SLICES;
    let mut uncontended_samples = Samples::default();
    let mut floor: Option<(&'static str, Samples)> = None;
    for _ in 0..SLICES {
        uncontended_samples.extend(uncontended(&client, &name, slice).await?);
        if let Some((op, samples)) = raw_floor(&url, slice).await? {
            floor
                .get_or_insert((op, Samples::default()))
                .1
                .extend(samples);
        }
    }
    let uncontended = uncontended_samples;
    let mut clients = Vec::with_capacity(args.waiters);
    for _ in 0..args.waiters {
        clients.push(args.backend.connect().await?);
    }
    let handoff = handoff(
        clients,
        LockName::new(format!("{run}/handoff"))?,
        args.duration,
        args.hold,
    )
    .await?;
    let mut parallel = Vec::new();
    for &tasks in &args.parallel {
        let phase = args.duration / 2;
        parallel.push((tasks, many_names(&client, &run, tasks.max(1), phase).await?));
    }
    let handoff_floor = raw_handoff_floor(&args.backend.url()?, args.duration).await?;
    let ratio = |ours: f64, floor: f64| (ours / floor * 100.0).round() / 100.0;

    if args.json {
        let json = serde_json::json!({
            "backend": label,
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
        let mut json = json;
        json["parallel_names"] = parallel
            .iter()
            .map(|(tasks, ops)| serde_json::json!({"tasks": tasks, "ops_per_sec": ops.round()}))
            .collect();
        if let Some((op, floor)) = &floor {
            json["raw_floor"] = serde_json::json!({
                "op": op,
                "ops_per_sec": floor.per_sec().round(),
                "p50_us": floor.percentile(50.0).round(),
                "p99_us": floor.percentile(99.0).round(),
            });
            if let Some((op, hf)) = &handoff_floor {
                json["raw_handoff_floor"] = serde_json::json!({
                    "op": op,
                    "p50_us": hf.percentile(50.0).round(),
                    "p99_us": hf.percentile(99.0).round(),
                });
                json["ratios"]["handoff_p50_vs_raw_handoff_floor"] =
                    serde_json::json!(ratio(handoff.percentile(50.0), hf.percentile(50.0)));
            }
            let extra = json["ratios"].take();
            json["ratios"] = serde_json::json!({
                "uncontended_throughput_vs_floor": ratio(uncontended.per_sec(), floor.per_sec()),
                "handoff_p50_vs_floor_round_trip": ratio(handoff.percentile(50.0), floor.percentile(50.0) / 2.0),
            });
            if let serde_json::Value::Object(extra) = extra {
                for (key, value) in extra {
                    json["ratios"][key] = value;
                }
            }
        }
        println!("{json}");
    } else {
        println!(
            "dlock bench against {label} ({:?} per phase)\n",
            args.duration
        );
        println!(
            "{:<44} {:>12} {:>10} {:>10}",
            "phase", "ops/s", "p50 µs", "p99 µs"
        );
        println!(
            "{:<44} {:>12.0} {:>10.0} {:>10.0}",
            "uncontended acquire+release",
            uncontended.per_sec(),
            uncontended.percentile(50.0),
            uncontended.percentile(99.0)
        );
        println!(
            "{:<44} {:>12.0} {:>10.0} {:>10.0}",
            format!("hand-off ({} clients, hold {:?})", args.waiters, args.hold),
            handoff.per_sec(),
            handoff.percentile(50.0),
            handoff.percentile(99.0)
        );
        for (tasks, ops) in &parallel {
            println!(
                "{:<44} {:>12.0}",
                format!("{tasks} tasks, one client, a name each"),
                ops
            );
        }
        if let Some((op, floor)) = &floor {
            println!(
                "{:<44} {:>12.0} {:>10.0} {:>10.0}",
                format!("raw floor: {op}"),
                floor.per_sec(),
                floor.percentile(50.0),
                floor.percentile(99.0)
            );
            if let Some((op, hf)) = &handoff_floor {
                println!(
                    "{:<44} {:>12} {:>10.0} {:>10.0}",
                    format!("raw hand-off floor: {op}"),
                    "",
                    hf.percentile(50.0),
                    hf.percentile(99.0)
                );
                println!(
                    "\nhand-off p50 = {:.2}x the raw hand-off floor",
                    ratio(handoff.percentile(50.0), hf.percentile(50.0))
                );
            }
            println!(
                "uncontended throughput = {:.2}x the floor; hand-off p50 = {:.2}x the floor's round trip (pair p50 / 2)",
                ratio(uncontended.per_sec(), floor.per_sec()),
                ratio(handoff.percentile(50.0), floor.percentile(50.0) / 2.0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The backend's raw hand-off floor (release → the next holder's acquire answered), if measured.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(unused_variables)
)]
async fn raw_handoff_floor(
    url: &str,
    duration: Duration,
) -> Result<Option<(&'static str, Samples)>, LockError> {
    let floor: Option<(&'static str, Vec<Duration>)> = match BackendScheme::parse(url)? {
        #[cfg(feature = "redis")]
        BackendScheme::Redis => Some((
            "DEL+PUBLISH, subscriber SET NX",
            dlock_redis::raw_handoff_floor(url, duration).await?,
        )),
        #[cfg(feature = "mysql")]
        BackendScheme::MySql => Some((
            "RELEASE_LOCK, then the waiter's blocking GET_LOCK answers",
            dlock_mysql::raw_handoff_floor(url, duration).await?,
        )),
        #[cfg(feature = "postgres")]
        BackendScheme::Postgres => Some((
            "pg_advisory_unlock, then the waiter's blocking pg_advisory_lock answers",
            dlock_postgres::raw_handoff_floor(url, duration).await?,
        )),
        #[cfg(feature = "etcd")]
        BackendScheme::Etcd => Some((
            "guarded delete, then the waiter's watch (from the read's revision + 1) fires",
            dlock_etcd::raw_handoff_floor(url, duration).await?,
        )),
        #[cfg(feature = "zookeeper")]
        BackendScheme::ZooKeeper => Some((
            "delete, then the waiter's exists-watch fires and its listing answers",
            dlock_zookeeper::raw_handoff_floor(url, duration).await?,
        )),
        _ => None,
    };
    Ok(floor.map(|(op, pairs)| (op, Samples::from_durations(&pairs))))
}

/// The backend's raw protocol floor, measured in the same run (none for the memory backend).
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(unused_variables)
)]
async fn raw_floor(
    url: &str,
    duration: Duration,
) -> Result<Option<(&'static str, Samples)>, LockError> {
    let floor: Option<(&'static str, Vec<Duration>)> = match BackendScheme::parse(url)? {
        #[cfg(feature = "redis")]
        BackendScheme::Redis => Some((
            "SET NX PX + EVALSHA compare-and-delete",
            dlock_redis::raw_floor(url, duration).await?,
        )),
        #[cfg(feature = "redlock")]
        BackendScheme::Redlock => Some((
            "parallel SET NX PX x N + parallel EVALSHA compare-and-delete x N",
            dlock_redlock::raw_floor(url, duration).await?,
        )),
        #[cfg(feature = "mysql")]
        BackendScheme::MySql => Some((
            "GET_LOCK(n,0) + RELEASE_LOCK(n), prepared",
            dlock_mysql::raw_floor(url, duration).await?,
        )),
        #[cfg(feature = "postgres")]
        BackendScheme::Postgres => Some((
            "pg_try_advisory_lock + pg_advisory_unlock, prepared",
            dlock_postgres::raw_floor(url, duration).await?,
        )),
        #[cfg(feature = "etcd")]
        BackendScheme::Etcd => Some((
            "txn create (create_revision = 0, put on a lease) + txn delete guarded by create revision",
            dlock_etcd::raw_floor(url, duration).await?,
        )),
        #[cfg(feature = "zookeeper")]
        BackendScheme::ZooKeeper => Some((
            "create ephemeral-sequential + delete with its version",
            dlock_zookeeper::raw_floor(url, duration).await?,
        )),
        _ => None,
    };
    Ok(floor.map(|(op, pairs)| (op, Samples::from_durations(&pairs))))
}

async fn uncontended(
    client: &Arc<dyn DistributedLock>,
    name: &LockName,
    duration: Duration,
) -> Result<Samples, LockError> {
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    // Warm up connections and script caches before measuring.
    for _ in 0..50 {
        client.acquire(name, &opts).await?.release().await?;
    }
    let mut micros = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        let guard = client.acquire(name, &opts).await?;
        guard.release().await?;
        micros.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(Samples {
        micros,
        elapsed: started.elapsed(),
    })
}

/// `tasks` tasks on one client, each acquiring and releasing its own name back to back: how
/// throughput scales with concurrency when nothing contends.
async fn many_names(
    client: &Arc<dyn DistributedLock>,
    run: &str,
    tasks: usize,
    duration: Duration,
) -> Result<f64, LockError> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::new();
    for i in 0..tasks {
        let (client, name) = (
            client.clone(),
            LockName::new(format!("{run}/parallel/{tasks}/{i}"))?,
        );
        workers.push(tokio::spawn(async move {
            let opts = LockOptions::new();
            let mut pairs = 0u64;
            while Instant::now() < deadline {
                client.acquire(&name, &opts).await?.release().await?;
                pairs += 1;
            }
            Ok::<u64, LockError>(pairs)
        }));
    }
    let mut total = 0;
    for worker in workers {
        total += worker.await.map_err(|e| LockError::backend("dlock", e))??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Who holds the lock in the hand-off phase, and when the last holder let go.
#[derive(Default)]
struct Baton {
    released_at: Option<Instant>,
    generation: u64,
    samples: Vec<f64>,
}

async fn handoff(
    clients: Vec<Arc<dyn DistributedLock>>,
    name: LockName,
    duration: Duration,
    hold: Duration,
) -> Result<Samples, LockError> {
    let baton = Arc::new(Mutex::new(Baton::default()));
    let changed = Arc::new(Notify::new());
    let opts = LockOptions::new().with_wait_timeout(duration + Duration::from_secs(30));
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::new();
    for client in clients {
        let (baton, changed, name, opts) =
            (baton.clone(), changed.clone(), name.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let guard = client.acquire(&name, &opts).await?;
                let acquired = Instant::now();
                {
                    let mut b = baton.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(released) = b.released_at.take() {
                        b.samples.push((acquired - released).as_secs_f64() * 1e6);
                    }
                    b.generation += 1;
                }
                changed.notify_waiters();
                tokio::time::sleep(hold).await;
                let mine = {
                    let mut b = baton.lock().unwrap_or_else(|e| e.into_inner());
                    b.released_at = Some(Instant::now());
                    b.generation
                };
                guard.release().await?;
                // Let someone else take it before competing again, so every release has waiters.
                while Instant::now() < deadline {
                    let notified = changed.notified();
                    if baton.lock().unwrap_or_else(|e| e.into_inner()).generation != mine {
                        break;
                    }
                    let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
                }
            }
            Ok::<(), LockError>(())
        }));
    }
    for worker in workers {
        worker.await.map_err(|e| LockError::backend("dlock", e))??;
    }
    let elapsed = started.elapsed();
    let samples = std::mem::take(&mut baton.lock().unwrap_or_else(|e| e.into_inner()).samples);
    Ok(Samples {
        micros: samples,
        elapsed,
    })
}
