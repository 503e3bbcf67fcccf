//! `dlock bench --permits 1,8`: a semaphore of each number of permits, its uncontended pair and
//! the hand-off of its last free permit, next to the backend's raw floor of the same algorithm
//! ([`Protocol::permit_pairs`](crate::floor::Protocol::permit_pairs)) measured in the same run.
//! The lock's phases are not run: `dlock bench` without `--permits` gives them, so a change to
//! the shared engine shows in both.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use serde_json::{Value, json};

use super::{BenchArgs, Holding, SLICES, Samples, handoff, ratio};
use crate::floor::{self, Floors, WarmUp};

/// One number of permits, measured in one round.
struct Measured {
    permits: u32,
    pairs: Samples,
    floor_pairs: Option<Samples>,
    handoff: Samples,
    floor_handoff: Option<Samples>,
}

pub(super) async fn bench(
    args: &BenchArgs,
    permits: &[u32],
    client: &Arc<dyn DistributedLock>,
    label: &str,
    run: &str,
) -> Result<ExitCode, LockError> {
    let floors = Floors::for_url(&args.backend.url()?)?;
    let mut clients = Vec::with_capacity(args.waiters);
    for _ in 0..args.waiters {
        clients.push(args.backend.connect().await?);
    }
    let mut rounds: Vec<Vec<Measured>> = Vec::new();
    for _ in 0..args.rounds {
        let mut round = Vec::new();
        for &n in permits {
            round.push(measure(args, n, (client, &clients), floors.as_ref(), run).await?);
        }
        rounds.push(round);
    }
    let report: Vec<Value> = permits
        .iter()
        .enumerate()
        .map(|(i, &n)| summary(n, rounds.iter().map(|round| &round[i])))
        .collect();
    if args.json {
        println!(
            "{}",
            json!({ "backend": label, "rounds": args.rounds, "permits": report })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "dlock bench --permits against {label}: {:?} a phase, {} round(s) (median over rounds), \
         hand-off with {} clients holding {:?}",
        args.duration, args.rounds, args.waiters, args.hold
    );
    println!(
        "{:>7}  {:>13}  {:>13}  {:>8}  {:>14}  {:>14}  {:>8}  {:>15}  {:>15}",
        "permits",
        "dlock pairs/s",
        "floor pairs/s",
        "ratio",
        "dlock hand-off",
        "floor hand-off",
        "ratio",
        "dlock CPU/pair",
        "floor CPU/pair"
    );
    let cell = |v: &Value, unit: &str| {
        v.as_f64()
            .map_or_else(|| "-".to_owned(), |v| format!("{v}{unit}"))
    };
    for row in &report {
        println!(
            "{:>7}  {:>13}  {:>13}  {:>8}  {:>14}  {:>14}  {:>8}  {:>15}  {:>15}",
            row["permits"],
            cell(&row["pairs_per_sec"], ""),
            cell(&row["floor_pairs_per_sec"], ""),
            cell(&row["pairs_vs_floor"], "x"),
            cell(&row["handoff_p50_us"], " µs"),
            cell(&row["floor_handoff_p50_us"], " µs"),
            cell(&row["handoff_p50_vs_floor"], "x"),
            cell(&row["cpu_us_per_pair"], " µs"),
            cell(&row["floor_cpu_us_per_pair"], " µs"),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One round at `permits`: dlock's pairs and the floor's in alternating slices, then dlock's
/// hand-off of the last free permit and the floor's.
async fn measure(
    args: &BenchArgs,
    permits: u32,
    (client, clients): (&Arc<dyn DistributedLock>, &[Arc<dyn DistributedLock>]),
    floors: Option<&Floors>,
    run: &str,
) -> Result<Measured, LockError> {
    let name = LockName::new(format!("{run}/permits-{permits}"))?;
    let slice = args.duration.checked_div(SLICES).unwrap_or_default();
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let mut pairs = Samples::default();
    let mut floor_pairs: Option<Samples> = None;
    for slice_no in 0..SLICES {
        let floor_first = slice_no % 2 == 1;
        for floor_side in [floor_first, !floor_first] {
            if !floor_side {
                let measured = floor::sample(WarmUp::Rounds(50), slice, async || {
                    let permit = client.acquire_permit(&name, permits, &opts).await?;
                    permit.release().await
                })
                .await?;
                pairs.extend(Samples::from_measured(&measured));
            } else if let Some(floors) = floors
                && let Some(measured) = floors.permit_pairs(permits, slice).await?
            {
                floor_pairs
                    .get_or_insert_with(Samples::default)
                    .extend(Samples::from_measured(&measured));
            }
        }
    }
    let handoff_name = LockName::new(format!("{run}/permit-handoff-{permits}"))?;
    let parked = park(client, &handoff_name, permits).await?;
    let handoff = handoff(
        clients.to_vec(),
        (handoff_name, Holding::Permit(permits)),
        args.duration,
        args.hold,
    )
    .await;
    for permit in parked {
        permit.release().await?;
    }
    let floor_handoff = match floors {
        Some(floors) => floors
            .permit_handoffs(permits, args.duration, (args.waiters, args.hold))
            .await?
            .map(|samples| Samples::from_durations(&samples)),
        None => None,
    };
    Ok(Measured {
        permits,
        pairs,
        floor_pairs,
        handoff: handoff?,
        floor_handoff,
    })
}

/// `permits - 1` permits of `name`, held (and renewed) while the hand-off runs, so that the
/// contenders pass the last one between them.
async fn park(
    client: &Arc<dyn DistributedLock>,
    name: &LockName,
    permits: u32,
) -> Result<Vec<LockGuard>, LockError> {
    let mut parked = Vec::new();
    for _ in 1..permits {
        parked.push(
            client
                .acquire_permit(name, permits, &LockOptions::new())
                .await?,
        );
    }
    Ok(parked)
}

/// The median over rounds of each figure of one number of permits.
fn summary<'a>(permits: u32, rounds: impl Iterator<Item = &'a Measured>) -> Value {
    let mut figures: [Vec<f64>; 8] = Default::default();
    for round in rounds {
        let floor_pairs = round.floor_pairs.as_ref().map(Samples::per_sec);
        let floor_handoff = round.floor_handoff.as_ref().map(|s| s.percentile(50.0));
        let (ours, handoff) = (round.pairs.per_sec(), round.handoff.percentile(50.0));
        let values = [
            Some(ours),
            floor_pairs,
            floor_pairs.map(|floor| ratio(ours, floor)),
            Some(handoff),
            floor_handoff,
            floor_handoff.map(|floor| ratio(handoff, floor)),
            round.pairs.cpu_per_op(),
            round.floor_pairs.as_ref().and_then(Samples::cpu_per_op),
        ];
        for (figure, value) in figures.iter_mut().zip(values) {
            figure.extend(value);
        }
        debug_assert_eq!(round.permits, permits);
    }
    let median = |values: &mut Vec<f64>| -> Value {
        if values.is_empty() {
            return Value::Null;
        }
        values.sort_by(f64::total_cmp);
        let middle = values[values.len() / 2];
        json!(if middle < 10.0 {
            super::rounded(middle, 2)
        } else {
            middle.round()
        })
    };
    let [
        ours,
        floor,
        vs,
        handoff,
        floor_handoff,
        handoff_vs,
        cpu,
        floor_cpu,
    ] = &mut figures;
    json!({
        "permits": permits,
        "pairs_per_sec": median(ours),
        "floor_pairs_per_sec": median(floor),
        "pairs_vs_floor": median(vs),
        "handoff_p50_us": median(handoff),
        "floor_handoff_p50_us": median(floor_handoff),
        "handoff_p50_vs_floor": median(handoff_vs),
        "cpu_us_per_pair": median(cpu),
        "floor_cpu_us_per_pair": median(floor_cpu),
    })
}
