//! The client's wall clock stepped under a holder: leases are timed on the monotonic clock, so
//! a step of the wall clock (an NTP correction, a VM resumed, an operator's `date -s`) must
//! change nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::history::{End, Expect};
use crate::nemesis::clock::SteppedClock;
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, ensure};

use super::faults::{announced, verify};

const HOUR_MS: i64 = 3_600_000;

/// How far a worker's wall clock may be from the expected step and still count as stepped:
/// the clock file is re-read once a second, and the reading crosses a pipe.
const SKEW_TOLERANCE_MS: i64 = 60_000;

/// The next `holding` line of `worker`: how far its wall clock is ahead of ours, in ms.
async fn holding_skew(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<i64, Failure> {
    let rest = announced(ctx, worker, "holding ").await?;
    let wall: i64 = rest
        .split_whitespace()
        .nth(2)
        .and_then(|ms| ms.parse().ok())
        .ok_or_else(|| Failure(format!("the worker said holding {rest:?}")))?;
    let ours = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Ok(wall.saturating_sub(ours))
}

/// **Client wall-clock steps change nothing.** Two worker processes run with libfaketime
/// preloaded; one of them announces its holds, each lasting two lease TTLs (so renewal runs
/// through it where the backend renews). Just after its first hold begins, the workers' wall
/// clock jumps an hour ahead; after its second, an hour behind; after its third, back to the
/// truth. Each announcement also shows the worker's wall clock, so the case knows the step bit.
/// Nothing may change: no overlap, nothing refused, no guard lost or expired (every hold ends by
/// its release), tokens rising, nothing left on the server.
pub async fn client_wall_clock_steps_change_nothing(ctx: Ctx) -> CaseResult {
    let run = Run::start(&ctx).await?;
    let clock = SteppedClock::new(&run)?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let think: Duration = ttl.saturating_mul(2);
    let rounds: u32 = 3;
    let wait = timing
        .bound
        .saturating_add(think.saturating_mul(rounds.saturating_mul(2).saturating_add(2)));
    let mut announcer_spec = run.spec(1, &names, rounds, ttl, wait, think);
    announcer_spec.announce = true;
    let mut announcer = run.spawn_with(&announcer_spec, &clock.env())?;
    let other = run.spawn_with(&run.spec(2, &names, rounds, ttl, wait, think), &clock.env())?;
    // (the skew this hold must show, the step to make once it is seen)
    let schedule = [(0, "+1h"), (HOUR_MS, "-1h"), (-HOUR_MS, "+0")];
    for (expected, step) in schedule {
        let skew = holding_skew(&ctx, &mut announcer).await?;
        ensure!(
            skew.saturating_sub(expected).saturating_abs() < SKEW_TOLERANCE_MS,
            "the worker's wall clock is {skew} ms from ours, expected about {expected} ms: \
             libfaketime did not take hold of the worker (is it preloaded?)"
        );
        clock.step(&run, step)?;
    }
    ctx.within("the announcing worker", announcer.finish())
        .await??;
    ctx.within("the other worker", other.finish()).await??;
    let residue = ctx.settled_residue(&names).await?;
    let report = verify(&run, &Expect::CLEAN, &run.input(residue)?)?;
    let cut_short: Vec<String> = report
        .holds
        .iter()
        .filter(|hold| hold.ended_by != End::Release)
        .map(|hold| format!("{:?} ended by {:?}", hold.id, hold.ended_by))
        .collect();
    ensure!(
        cut_short.is_empty(),
        "holds ended otherwise than by their release across the steps: {cut_short:?}\n{report}"
    );
    ensure!(
        report.liveness.granted == (rounds as usize).saturating_mul(2)
            && report.liveness.failed == 0,
        "every acquire must succeed: {report}"
    );
    run.discard();
    Ok(())
}
