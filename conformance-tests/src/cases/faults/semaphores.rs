//! The fault suite on semaphores: worker processes each take one of N permits of a name
//! instead of the lock, while the harness pauses, kills and cuts them off; the checker counts
//! the holds valid at each moment against N (see [`crate::history::checker`], "Semaphores").
//!
//! What "nothing lost" means for a semaphore: its permits. A holder paused past its lease,
//! killed, or cut off gives its permit back, so after each case all N permits of every name
//! can be held at once again, and nothing is left on the server.

use std::time::Duration;

use dlock_api::{LockName, LockOptions};

use super::shared_names::{paused_and_killed, six_workers_checked_clean};
use super::steps::{holding, proxied, verify};
use crate::history::{Count, Edge, Expect, Input, Report};
use crate::nemesis::Run;
use crate::{CaseResult, Ctx, Failure, Harness, ensure};

/// The permits of every semaphore in these cases.
const PERMITS: u32 = 3;

/// The longest a worker thinks between reading and writing the register: long enough for
/// several holders of a name to meet.
const THINK: Duration = Duration::from_millis(50);

/// A negative control: the history judged with a limit one below the most permits it held at
/// once must show holders over that limit. Nothing else is judged: with the limit lowered, the
/// register's findings between concurrent holders mean nothing.
const OVER_THE_LIMIT: Expect = Expect {
    overlaps: Count::AtLeast(1),
    ..Expect::ANY
};

/// **Semaphores, history-checked.** Six worker processes run rounds of take a permit → read
/// the register → think → write → give the permit back, over two names of three permits each.
/// No more than three holds of a name may be valid at any moment, no two grants share a token
/// and each is above every grant that returned before it was asked for, the register keeps its
/// rule and one token is one permit, every permit comes back (all three of each name can be held
/// at once afterwards) and nothing is left on the server.
///
/// CONTRACT: "At most N", "Permits come back", "Fenced" (Semaphores), across processes.
pub async fn semaphore_workers_keep_to_the_limit(ctx: Ctx) -> CaseResult {
    let names = [ctx.name("a"), ctx.name("b")];
    let (run, input, report) = six_workers_checked_clean(&ctx, &names, (10, THINK), |spec| {
        spec.permits = Some(PERMITS);
    })
    .await?;
    every_permit_comes_back(&ctx, &**ctx.harness(), &names).await?;
    lowered_limit_is_caught(&run, &input, &report)?;
    run.discard();
    Ok(())
}

/// **A paused and a killed permit holder.** Of a name's three permits, one is held by a worker
/// stopped with `SIGSTOP` between reading the register and writing it, for three lease TTLs,
/// and one by a worker killed (`SIGKILL`) while it holds; four more workers run rounds on that
/// name and a second one meanwhile, then the paused one resumes and writes and releases late, as a process that
/// does not check would.
///
/// - TTL leases: the paused holder's permit ends at its deadline and the dead one's at its TTL,
///   so the others get all three permits; the checker must never see more than three holds
///   valid at once (the paused hold counts until its deadline, the dead one's until its death).
/// - Session leases: the paused process's session keeps its permit until it resumes, the dead
///   one's until the server ends its session; the others share what is left. Same verdict.
///
/// Either way every permit comes back (all three can be held at once afterwards), tokens are
/// unique and rise, and nothing is left.
///
/// CONTRACT: "At most N" and "Permits come back" (Semaphores) under a paused and a dead holder.
pub async fn semaphore_workers_paused_and_killed(ctx: Ctx) -> CaseResult {
    // The paused and the killed holder hold permits of the first name; the others work on both.
    let names = [ctx.name("sem"), ctx.name("other")];
    let (run, input, report) = paused_and_killed(
        &ctx,
        (&names[0], &names[0], &names),
        (24, THINK.saturating_mul(2)),
        |spec, _| spec.permits = Some(PERMITS),
    )
    .await?;
    every_permit_comes_back(&ctx, &**ctx.harness(), &names).await?;
    lowered_limit_is_caught(&run, &input, &report)?;
    run.discard();
    Ok(())
}

/// **A partitioned permit holder.** A worker reaching the server through a fault proxy takes
/// one of three permits, reads the register, and is cut off (the proxy answers nothing) while
/// it thinks for two TTLs; four workers connected directly run rounds on the name meanwhile;
/// then the link heals.
///
/// - TTL leases: the cut-off permit's lease runs out, and the others may hold all three; the
///   cut-off holder's hold ends at its deadline in the history, so no more than three holds are
///   ever valid at once.
/// - Session leases: the server cannot tell a silent link from a slow one, so the permit stays
///   the cut-off worker's until the link heals and its connection closes; the others share two.
///
/// Either way: never more than three at once, every permit comes back, nothing is left.
///
/// CONTRACT: "At most N" and "Permits come back" (Semaphores) across a partition.
pub async fn semaphore_partitioned_holder_keeps_to_the_limit(ctx: Ctx) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let linked = (target.reach_at)(&proxy.addrs());
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("sem")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut cut_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl.saturating_mul(2));
    cut_spec.announce = true;
    cut_spec.permits = Some(PERMITS);
    let mut cut = run.spawn_via(&cut_spec, &*linked)?;
    holding(&ctx, &mut cut).await?;
    proxy.set_mode(dlock_test_servers::ProxyMode::Blackhole);
    run.log(Edge::Start, "blackhole worker 1's link");
    let mut others = Vec::new();
    for id in 2..=5 {
        let wait = ttl.saturating_mul(4).saturating_add(timing.bound);
        let mut spec = run.spec(id, &names, 6, ttl, wait, THINK.saturating_mul(2));
        spec.permits = Some(PERMITS);
        others.push(run.spawn_via(&spec, &*target.harness)?);
    }
    ctx.within("the cut-off worker to give up", cut.finish())
        .await??;
    proxy.heal();
    run.log(Edge::Stop, "heal worker 1's link");
    for worker in others {
        ctx.within("a directly connected worker", worker.finish())
            .await??;
    }
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    let input = run.input(residue)?;
    let report = verify(&run, &Expect::CLEAN, &input)?;
    ensure!(
        report.liveness.granted >= 5,
        "only {} permits were granted: {report}",
        report.liveness.granted
    );
    every_permit_comes_back(&ctx, &*target.harness, &names).await?;
    lowered_limit_is_caught(&run, &input, &report)?;
    run.discard();
    Ok(())
}

/// Nothing lost: every permit of each of `names` can be held at once again, each by a fresh
/// client of `harness` (waiting, up to the bound, for any the server still gives back), and
/// the server counts them all.
async fn every_permit_comes_back(
    ctx: &Ctx,
    harness: &dyn Harness,
    names: &[LockName],
) -> CaseResult {
    let options = LockOptions::new()
        .with_ttl(ctx.timing().bound)
        .with_wait_timeout(ctx.timing().bound);
    for name in names {
        let mut held = Vec::new();
        for _ in 0..PERMITS {
            let client = harness.client().await?;
            let permit = client
                .acquire_permit(name, PERMITS, &options)
                .await
                .map_err(|e| {
                    Failure(format!(
                        "permit {} of {PERMITS} of {name} did not come back: {e}",
                        held.len().saturating_add(1)
                    ))
                })?;
            held.push((client, permit));
        }
        let count = held[0].0.count_permits(name).await?;
        ensure!(
            count == PERMITS,
            "{name}: {PERMITS} permits held, the server counts {count}"
        );
        for (_, permit) in held {
            permit.release().await?;
        }
    }
    Ok(())
}

/// The negative control: if the run held more than one permit of a name at once, the same
/// history judged with a limit one lower must be caught over it. (A run that never held two at
/// once has nothing to lower; it is safe, and says so in its verdict.)
fn lowered_limit_is_caught(run: &Run, input: &Input, report: &Report) -> Result<(), Failure> {
    let Some(peak) = report.peak_holders.values().copied().max() else {
        return Ok(());
    };
    let Some(lowered) = u32::try_from(peak).ok().and_then(|p| p.checked_sub(1)) else {
        return Ok(());
    };
    if lowered == 0 {
        return Ok(());
    }
    let mut tighter = input.clone();
    for event in &mut tighter.events {
        if event.permits.is_some() {
            event.permits = Some(lowered);
        }
    }
    verify(run, &OVER_THE_LIMIT, &tighter).map(|_| ())
}
