//! Fault cases decided by the history checker: worker **processes** take locks and update a
//! fenced register while the harness pauses and kills them; afterwards the checker reads what
//! was recorded (see [`crate::history`]) and the case asserts its expectation profile. A failing
//! case names the directory where the whole run was dumped.

use std::time::Duration;

use dlock_api::{LeaseKind, LockName};

use crate::history::{Count, Expect, Input, Report};
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, ensure};

/// The longest a worker thinks between reading and writing the register.
const THINK: Duration = Duration::from_millis(20);

/// Checks `input` against `expect`; on failure the run is dumped and its path named.
fn verify(run: &Run, expect: &Expect, input: &Input) -> Result<Report, Failure> {
    expect.verify(input, &run.dir).map_err(Failure)
}

/// Waits for the line a worker in announce mode prints once it holds a lock.
async fn holding(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<u64, Failure> {
    let line = ctx
        .within("a worker to take the lock", worker.next_line())
        .await??
        .ok_or_else(|| Failure("the worker exited without taking the lock".into()))?;
    line.strip_prefix("holding ")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|token| token.parse().ok())
        .ok_or_else(|| Failure(format!("the worker said {line:?}")))
}

/// **Exclusion, history-checked.** Four worker processes run rounds of acquire → read the
/// register → think → write → release over two names. No two holds of a name may overlap, the
/// fenced register refuses nothing (without faults, any refusal means belief and reality
/// diverged), no update is lost even in the unfenced shadow, tokens rise, nothing is left.
pub async fn exclusion_is_history_checked(ctx: Ctx) -> CaseResult {
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("a"), ctx.name("b")];
    let timing = ctx.timing();
    let mut workers = Vec::new();
    for id in 1..=4 {
        let spec = run.spec(id, &names, 12, timing.short_ttl, timing.bound, THINK);
        workers.push(run.spawn(&spec)?);
    }
    for worker in workers {
        ctx.within("a worker's rounds", worker.finish()).await??;
    }
    let residue = ctx.settled_residue(&names).await?;
    let report = verify(&run, &Expect::CLEAN, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted >= 4,
        "only {} acquires succeeded: {report}",
        report.liveness.granted
    );
    run.discard();
    Ok(())
}

/// **A paused holder** (a GC pause, a frozen VM): a worker is stopped with `SIGSTOP` while it
/// holds the lock, between reading the register and writing it, for three lease TTLs; another
/// worker takes the lock meanwhile (where the lease expires) and writes; then the paused one
/// resumes and writes with its old token, as a process that does not check would.
///
/// - TTL leases: the checker must see no overlap (the paused hold ended at its deadline), the
///   fenced register must have refused the stale write and taken none, and the unfenced shadow
///   must have lost the other worker's update (the fault really bit). As negative controls, the
///   same history is checked as if the library had promised the paused holder its lock forever
///   (an overlap must be reported) and as if the shadow were the protected resource (the stale
///   write must be reported as accepted).
/// - Session leases (the connection is the lease, and a paused process's connection stays
///   open): the paused worker keeps the lock, the other waits for it, and the history is clean.
pub async fn paused_holder_is_fenced_off(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let caps = client.capabilities();
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let pause = ttl * 3;
    let mut frozen_spec = run.spec(1, &names, 1, ttl, timing.bound, Duration::from_millis(300));
    frozen_spec.announce = true;
    let mut frozen = run.spawn(&frozen_spec)?;
    holding(&ctx, &mut frozen).await?;
    run.pause(&frozen)?;
    let other_spec = run.spec(2, &names, 2, ttl, pause + timing.bound, THINK);
    let other = run.spawn(&other_spec)?;
    let ttl_lease = caps.lease == LeaseKind::Ttl;
    if ttl_lease {
        ctx.within(
            "the other worker, while the holder is paused",
            other.finish(),
        )
        .await??;
        run.resume(&frozen)?;
        ctx.within("the paused worker after it resumed", frozen.finish())
            .await??;
    } else {
        // The session lives on: the other worker waits for the paused holder.
        tokio::time::sleep(pause).await;
        run.resume(&frozen)?;
        ctx.within("the paused worker after it resumed", frozen.finish())
            .await??;
        ctx.within("the other worker", other.finish()).await??;
    }
    let residue = ctx.settled_residue(&names).await?;
    let input = run.input(residue)?;
    if !ttl_lease {
        verify(&run, &Expect::CLEAN, &input)?;
        run.discard();
        return Ok(());
    }
    verify(
        &run,
        &Expect {
            shadow_lost: Count::AtLeast(1),
            ..Expect::FENCED_FAULT
        },
        &input,
    )?;
    // Negative control 1: a lock that never told the paused holder its lease ended.
    let mut forever = input.clone();
    for event in &mut forever.events {
        event.valid_until = None;
    }
    verify(&run, &Expect::NEGATIVE_CONTROL, &forever)?;
    // Negative control 2: the unfenced shadow as the resource: its stale write is caught.
    let mut unfenced = input.clone();
    unfenced.register = input.shadow.clone().unwrap_or_default();
    verify(
        &run,
        &Expect {
            overlaps: Count::Zero,
            stale_accepted: Count::AtLeast(1),
            ..Expect::NEGATIVE_CONTROL
        },
        &unfenced,
    )?;
    run.discard();
    Ok(())
}

/// **A killed holder process** (`SIGKILL`: no release, no goodbye) while it holds the lock
/// between read and write: the lock comes free (at its TTL, or when the server sees the
/// connection gone), another worker takes it with a higher token, and the dead holder's hold
/// ends at its death in the history: no overlap, nothing stale, nothing left.
pub async fn killed_holder_process_frees_the_lock(ctx: Ctx) -> CaseResult {
    let run = Run::start(&ctx).await?;
    let names: [LockName; 1] = [ctx.name("lock")];
    let timing = ctx.timing();
    let mut doomed_spec = run.spec(1, &names, 1, timing.short_ttl, timing.bound, THINK);
    doomed_spec.announce = true;
    let mut doomed = run.spawn(&doomed_spec)?;
    holding(&ctx, &mut doomed).await?;
    run.kill(doomed).await?;
    let other = run.spawn(&run.spec(2, &names, 2, timing.short_ttl, timing.bound, THINK))?;
    ctx.within("the other worker after the holder died", other.finish())
        .await??;
    let residue = ctx.settled_residue(&names).await?;
    let report = verify(&run, &Expect::CLEAN, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted == 3,
        "expected the dead holder's and two more grants: {report}"
    );
    run.discard();
    Ok(())
}
