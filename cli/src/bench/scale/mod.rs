//! `dlock bench --scale`: what the work costs as it grows, next to the backend's raw floor and
//! the server's own counters, read in the same run.
//!
//! - **held**: N locks acquired on one client, held through several renewal intervals (a short
//!   TTL, so this takes seconds), released: the client's CPU and the server's requests per held
//!   lock per second while they are held, the client's memory per guard, and acquire and release
//!   throughput at each N against the smallest N.
//! - **queue**: W waiters over a few clients on one name, each release handing the lock to the
//!   next: hand-off p50/p99 at each W against one waiter, and the server's requests per hand-off.
//! - **names**: M distinct names, each acquired and released once: throughput, and what the
//!   server stores per name once the leases are over.
//!
//! Every phase writes its figures into one JSON report; the table ([`report`]) and the curves
//! ([`plot`]) are drawn from it.

mod phases;
mod plot;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError};
use serde_json::{Value, json};

use super::BenchArgs;
use crate::floor::Floors;
use crate::floor::census::Census;

/// One phase of `--scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Phase {
    Held,
    Queue,
    Names,
}

/// The settings of `--scale`, from `dlock bench`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ScaleArgs {
    /// Instead of the phases above: the cost as the work grows, in the phases listed (held: many
    /// locks held on one client; queue: many waiters on one name; names: many names used once),
    /// each against the backend's raw floor and the server's counters, e.g. `--scale held,queue`.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 0..=1,
        default_missing_value = "held,queue,names",
        conflicts_with_all = ["permits", "flood", "read_mostly", "set"]
    )]
    pub(crate) scale: Option<Vec<Phase>>,
    /// Locks held at once in the held phase, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    scale_held: Vec<usize>,
    /// Waiters on one name in the queue phase (one waiter is always measured too, as the base).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    scale_queue: Vec<usize>,
    /// Distinct names in the names phase, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "100000")]
    scale_names: Vec<usize>,
    /// The TTL of every lock of the scale phases: short, so that holding them spans several
    /// renewal intervals in seconds.
    #[arg(long, value_parser = crate::parse_duration, default_value = "3s")]
    scale_ttl: Duration,
    /// How long the held phase holds its locks.
    #[arg(long, value_parser = crate::parse_duration, default_value = "10s")]
    scale_hold: Duration,
    /// Write the curves of the scale phases to this SVG file.
    #[arg(long, requires = "scale")]
    plot: Option<PathBuf>,
}

/// Clients the queue phase spreads its waiters over.
const QUEUE_CLIENTS: usize = 8;

/// Tasks on one client that acquire and release at once in the held and names phases (and in
/// the floor they are measured against).
const TASKS: usize = 64;

/// What every phase shares.
struct Bench<'a> {
    args: &'a BenchArgs,
    scale: &'a ScaleArgs,
    client: &'a Arc<dyn DistributedLock>,
    floors: Option<&'a Floors>,
    census: Option<&'a Census>,
    run: &'a str,
}

pub(super) async fn bench(
    args: &BenchArgs,
    client: &Arc<dyn DistributedLock>,
    label: &str,
    run: &str,
) -> Result<ExitCode, LockError> {
    let scale = &args.scale;
    let phases = scale.scale.as_deref().unwrap_or_default();
    for (flag, sizes) in [
        ("--scale-held", &scale.scale_held),
        ("--scale-queue", &scale.scale_queue),
        ("--scale-names", &scale.scale_names),
    ] {
        if sizes.is_empty() || sizes.contains(&0) {
            return Err(LockError::invalid(flag, "each size must be at least 1"));
        }
    }
    if scale.scale_ttl.is_zero() {
        return Err(LockError::invalid("--scale-ttl", "must be above zero"));
    }
    let url = args.backend.url()?;
    let floors = Floors::for_url(&url)?;
    let census = Census::for_url(&url)?;
    let bench = Bench {
        args,
        scale,
        client,
        floors: floors.as_ref(),
        census: census.as_ref(),
        run,
    };
    let mut report = json!({
        "backend": label,
        "settings": {
            "ttl_ms": scale.scale_ttl.as_millis() as u64,
            "hold_ms": scale.scale_hold.as_millis() as u64,
            "tasks": TASKS,
            "queue_clients": QUEUE_CLIENTS,
        },
        "server_requests": census.as_ref().map(Census::requests_what),
        "server_stored": census.as_ref().map(Census::stored_what),
    });
    if let Some(floors) = &floors {
        report["floor_op"] = json!(floors.ops().pair);
        report["floor_handoff_op"] = json!(floors.ops().handoff);
    }
    if phases.contains(&Phase::Held) {
        report["held"] = bench.held().await?;
    }
    if phases.contains(&Phase::Queue) {
        report["queue"] = bench.queue().await?;
    }
    if phases.contains(&Phase::Names) {
        report["names"] = bench.names().await?;
    }
    if let Some(path) = &scale.plot {
        plot::draw(&report, path)
            .map_err(|e| LockError::invalid("--plot", format!("{}: {e}", path.display())))?;
    }
    if args.json {
        println!("{}", json!({ "scale": report }));
    } else {
        print!("{}", report::render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// `value / base`, to two decimals; `null` where either is missing or the base is zero.
fn against(value: Option<f64>, base: Option<f64>) -> Value {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => json!(super::ratio(v, b)),
        _ => Value::Null,
    }
}
