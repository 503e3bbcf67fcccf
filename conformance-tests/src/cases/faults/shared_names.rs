//! The two runs the fault suite makes of every primitive whose name several may hold at once
//! (semaphores' permits, reader-writer locks' readers): six workers checked clean, and a
//! paused and a killed holder among others. A case gives its workers their kind of hold and
//! then checks what is particular to it (that every place comes back, its negative control).

use std::time::Duration;

use dlock_api::LockName;

use super::steps::{holding, verify};
use crate::history::{Expect, Input, Report};
use crate::nemesis::Run;
use crate::nemesis::worker::WorkerSpec;
use crate::{Ctx, Failure, ensure};

/// Which worker of a [`paused_and_killed`] run a spec is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Paused (`SIGSTOP`) while it holds, for three lease TTLs, then resumed.
    Paused,
    /// Killed (`SIGKILL`) while it holds.
    Killed,
    /// One of the four that run rounds meanwhile.
    Beside,
}

/// Six workers run `rounds` rounds over `names`, each thinking up to `think`, with specs shaped
/// by `kind`; their history must be clean, with at least six grants. Returns the run (to
/// discard once the case is done), what it recorded, and the verdict.
pub(super) async fn six_workers_checked_clean(
    ctx: &Ctx,
    names: &[LockName],
    (rounds, think): (u32, Duration),
    kind: impl Fn(&mut WorkerSpec),
) -> Result<(Run, Input, Report), Failure> {
    let run = Run::start(ctx).await?;
    let timing = ctx.timing();
    let mut workers = Vec::new();
    for id in 1..=6 {
        let mut spec = run.spec(id, names, rounds, timing.short_ttl, timing.bound, think);
        kind(&mut spec);
        workers.push(run.spawn(&spec)?);
    }
    for worker in workers {
        ctx.within("a worker's rounds", worker.finish()).await??;
    }
    let residue = ctx.settled_residue(names).await?;
    let input = run.input(residue)?;
    let report = verify(&run, &Expect::CLEAN, &input)?;
    ensure!(
        report.liveness.granted >= 6,
        "only {} grants were made: {report}",
        report.liveness.granted
    );
    Ok((run, input, report))
}

/// A worker on `paused_on` paused while it holds for three lease TTLs, a worker on `killed_on`
/// killed while it holds, and four more running `rounds` rounds over `names` (thinking up to
/// `think`) meanwhile; then the paused one resumes and finishes late, as a process that does not
/// check would. Specs are shaped by `kind`, told each worker's [`Role`]. The history must be
/// clean, and the four beside must have been granted something. Returns as
/// [`six_workers_checked_clean`].
pub(super) async fn paused_and_killed(
    ctx: &Ctx,
    (paused_on, killed_on, names): (&LockName, &LockName, &[LockName]),
    (rounds, think): (u32, Duration),
    kind: impl Fn(&mut WorkerSpec, Role),
) -> Result<(Run, Input, Report), Failure> {
    let run = Run::start(ctx).await?;
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let pause = ttl.saturating_mul(3);
    let mut paused_spec = run.spec(
        1,
        std::slice::from_ref(paused_on),
        1,
        ttl,
        timing.bound,
        Duration::from_millis(300),
    );
    paused_spec.announce = true;
    kind(&mut paused_spec, Role::Paused);
    let mut paused = run.spawn(&paused_spec)?;
    holding(ctx, &mut paused).await?;
    run.pause(&paused)?;
    // It would think a whole lease: the kill lands while it holds.
    let mut killed_spec = run.spec(
        2,
        std::slice::from_ref(killed_on),
        1,
        ttl,
        timing.bound,
        ttl,
    );
    killed_spec.announce = true;
    kind(&mut killed_spec, Role::Killed);
    let mut killed = run.spawn(&killed_spec)?;
    holding(ctx, &mut killed).await?;
    run.kill(killed).await?;
    let mut beside = Vec::new();
    for id in 3..=6 {
        let wait = pause
            .saturating_add(timing.crash_bound)
            .saturating_add(timing.bound);
        let mut spec = run.spec(id, names, rounds, ttl, wait, think);
        kind(&mut spec, Role::Beside);
        beside.push(run.spawn(&spec)?);
    }
    // The pause's length is what is under test: the paused holder's lease runs out meanwhile.
    tokio::time::sleep(pause).await;
    run.resume(&paused)?;
    ctx.within("the paused worker after it resumed", paused.finish())
        .await??;
    for worker in beside {
        ctx.within(
            "a worker beside the paused and the killed one",
            worker.finish(),
        )
        .await??;
    }
    let residue = ctx.settled_residue(names).await?;
    let input = run.input(residue)?;
    let report = verify(&run, &Expect::CLEAN, &input)?;
    ensure!(
        report.liveness.granted >= 6,
        "the workers beside the paused and the killed one got only {} grants: {report}",
        report.liveness.granted.saturating_sub(2)
    );
    Ok((run, input, report))
}
