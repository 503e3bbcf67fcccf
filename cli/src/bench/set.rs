//! `dlock bench --set 4`: a set of four names taken with `acquire_all` and released, next to the
//! same four names taken one by one with `acquire` and released last first, uncontended, on one
//! client, in alternating slices of the same run. Reported: sets per second and p50/p99 of each
//! way, and the ratio (what taking a set in one call buys over taking its members in a row).

use std::process::ExitCode;
use std::sync::Arc;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions};
use serde_json::{Value, json};

use super::{BenchArgs, SLICES, Samples, ratio};
use crate::floor::{self, WarmUp};

/// One round's sets, taken each way.
struct Round {
    together: Samples,
    one_by_one: Samples,
}

pub(super) async fn bench(
    args: &BenchArgs,
    members: usize,
    client: &Arc<dyn DistributedLock>,
    label: &str,
    run: &str,
) -> Result<ExitCode, LockError> {
    if members == 0 {
        return Err(LockError::invalid("--set", "a set needs at least one name"));
    }
    let names = (0..members)
        .map(|i| LockName::new(format!("{run}/set/{i:04}")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        rounds.push(measure(args, client, &names).await?);
    }
    let median = |figure: &dyn Fn(&Round) -> f64| -> f64 {
        let mut values: Vec<f64> = rounds.iter().map(figure).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let together = median(&|r| r.together.per_sec());
    let one_by_one = median(&|r| r.one_by_one.per_sec());
    let percentiles = |samples: &dyn Fn(&Round) -> &Samples| -> Value {
        json!({
            "p50_us": median(&|r| samples(r).percentile(50.0)).round(),
            "p99_us": median(&|r| samples(r).percentile(99.0)).round(),
        })
    };
    let report = json!({
        "names": members,
        "acquire_all_sets_per_sec": together.round(),
        "acquire_all": percentiles(&|r| &r.together),
        "one_by_one_sets_per_sec": one_by_one.round(),
        "one_by_one": percentiles(&|r| &r.one_by_one),
        "acquire_all_vs_one_by_one": ratio(together, one_by_one),
    });
    if args.json {
        println!(
            "{}",
            json!({ "backend": label, "rounds": args.rounds, "set": report })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "dlock bench --set {members} against {label}: {:?} a way, {} round(s) (median), uncontended",
        args.duration, args.rounds
    );
    let singles = format!("acquire x{members} + release x{members}");
    for (way, per_sec, figures) in [
        ("acquire_all + release", together, &report["acquire_all"]),
        (singles.as_str(), one_by_one, &report["one_by_one"]),
    ] {
        println!(
            "{way:<36} {per_sec:>9.0} sets/s  p50 {:.0} µs  p99 {:.0} µs",
            figures["p50_us"].as_f64().unwrap_or(f64::NAN),
            figures["p99_us"].as_f64().unwrap_or(f64::NAN)
        );
    }
    println!(
        "acquire_all / one by one: {:.2}x",
        ratio(together, one_by_one)
    );
    Ok(ExitCode::SUCCESS)
}

/// One round: both ways in [`SLICES`] alternating slices, each way first in turn, so drift in
/// the machine's speed hits both alike.
async fn measure(
    args: &BenchArgs,
    client: &Arc<dyn DistributedLock>,
    names: &[LockName],
) -> Result<Round, LockError> {
    let slice = args.duration.checked_div(SLICES).unwrap_or_default();
    let options = LockOptions::new();
    let mut round = Round {
        together: Samples::default(),
        one_by_one: Samples::default(),
    };
    for slice_no in 0..SLICES {
        for together in if slice_no % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let sets = if together {
                floor::sample(WarmUp::Rounds(20), slice, async || {
                    client.acquire_all(names, &options).await?.release().await
                })
                .await?
            } else {
                floor::sample(WarmUp::Rounds(20), slice, async || {
                    one_by_one(client, names, &options).await
                })
                .await?
            };
            let samples = if together {
                &mut round.together
            } else {
                &mut round.one_by_one
            };
            samples.extend(Samples::from_measured(&sets));
        }
    }
    Ok(round)
}

/// Each of `names` taken with `acquire` in a row, then released last first, as a set is.
async fn one_by_one(
    client: &Arc<dyn DistributedLock>,
    names: &[LockName],
    options: &LockOptions,
) -> Result<(), LockError> {
    let mut guards = Vec::with_capacity(names.len());
    for name in names {
        guards.push(client.acquire(name, options).await?);
    }
    while let Some(guard) = guards.pop() {
        guard.release().await?;
    }
    Ok(())
}
