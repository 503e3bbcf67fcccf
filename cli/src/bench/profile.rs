//! `dlock bench --profile dlock|floor|fenced-floor --pairs N`: one side's uncontended pairs
//! alone, a fixed number of them, for a profiler (`valgrind --tool=callgrind`, `perf record`) to
//! count what one pair costs the client: two runs with different `--pairs` differ by exactly that
//! many pairs, so the difference of their counts (instructions, allocations, tasks spawned,
//! timers armed) divided by it is one pair's, with connecting and warming up cancelled out.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};

use super::BenchArgs;
use crate::floor::{self, Floors, Measured, Throughput, WarmUp};

/// Which side's pairs `--profile` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ProfileSide {
    /// dlock's acquire and release.
    Dlock,
    /// The backend driver's plain pair.
    Floor,
    /// The driver's pair that also takes a fencing token, where the backend has one.
    FencedFloor,
}

pub(super) async fn bench(
    args: &BenchArgs,
    side: ProfileSide,
    client: &Arc<dyn DistributedLock>,
    run: &str,
) -> Result<ExitCode, LockError> {
    if let Some(tasks) = args.profile_tasks {
        return many_tasks(args, (side, tasks), client, run).await;
    }
    let pairs = args.pairs.unwrap_or(u64::MAX);
    floor::limit_pairs(pairs);
    // With a count, the duration only bounds a run that cannot reach it.
    let duration = match args.pairs {
        Some(_) => args.duration.max(Duration::from_secs(3600)),
        None => args.duration,
    };
    let measured: Measured = match side {
        ProfileSide::Dlock => {
            let name = LockName::new(format!("{run}/profile"))?;
            let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
            floor::sample(WarmUp::Rounds(50), duration, async || {
                let guard = match args.profile_permits {
                    Some(permits) => client.acquire_permit(&name, permits, &opts).await?,
                    None => client.acquire(&name, &opts).await?,
                };
                guard.release().await
            })
            .await?
        }
        // A semaphore's floor takes its tokens: it is the fenced floor too.
        ProfileSide::Floor | ProfileSide::FencedFloor if args.profile_permits.is_some() => {
            let permits = args.profile_permits.unwrap_or(1);
            floors_of(args)?
                .permit_pairs(permits, duration)
                .await?
                .ok_or_else(|| {
                    LockError::invalid("--profile-permits", "this backend has no semaphore floor")
                })?
        }
        ProfileSide::Floor | ProfileSide::FencedFloor => {
            let floors = floors_of(args)?;
            let measured = match side {
                ProfileSide::Floor => Some(floors.pairs(duration).await?),
                _ => floors.fenced_pairs(duration).await?,
            };
            measured.ok_or_else(|| {
                LockError::invalid("--profile", "this backend has no fenced floor")
            })?
        }
    };
    let done = measured.latencies.len() as u64;
    println!(
        "{side:?}: {done} pairs, CPU {:.1} µs/pair, {:.2} context switches/pair",
        measured.cost.cpu_us_per(done),
        measured.cost.switches_per(done)
    );
    Ok(ExitCode::SUCCESS)
}

/// `--profile-tasks N`: one side's many-names phase alone, `tasks` tasks sharing one client for
/// `--duration`, so that a profiler sees only that side's pairs (`strace -c -f` counts its
/// system calls, whose number over the pairs printed is one pair's).
async fn many_tasks(
    args: &BenchArgs,
    (side, tasks): (ProfileSide, usize),
    client: &Arc<dyn DistributedLock>,
    run: &str,
) -> Result<ExitCode, LockError> {
    let run: Throughput = match side {
        ProfileSide::Dlock => {
            let names = (0..tasks)
                .map(|i| LockName::new(format!("{run}/profile/{i}")))
                .collect::<Result<_, _>>()?;
            let pairs = Arc::new(super::DlockPairs {
                client: client.clone(),
                names,
                opts: LockOptions::new(),
            });
            floor::many(pairs, tasks, args.duration).await?
        }
        ProfileSide::Floor | ProfileSide::FencedFloor => {
            let floors = floors_of(args)?;
            let run = match side {
                ProfileSide::Floor => Some(floors.parallel(tasks, args.duration).await?),
                _ => floors.fenced_parallel(tasks, args.duration).await?,
            };
            run.ok_or_else(|| LockError::invalid("--profile", "this backend has no fenced floor"))?
        }
    };
    println!(
        "{side:?}, {tasks} tasks: {} pairs, {:.0} pairs/s, CPU {:.1} µs/pair, {:.2} context switches/pair",
        run.pairs,
        run.per_sec(),
        run.cost.cpu_us_per(run.pairs),
        run.cost.switches_per(run.pairs)
    );
    Ok(ExitCode::SUCCESS)
}

/// The backend's floors, for a profile of a floor's side.
fn floors_of(args: &BenchArgs) -> Result<Floors, LockError> {
    Floors::for_url(&args.backend.url()?)?
        .ok_or_else(|| LockError::invalid("--profile", "this backend has no floor"))
}
