//! A deployment that forgets a held lock (the negative control the checker must catch), and the
//! same deployment configured as the backend's docs advise (the lock must survive).

use std::time::Duration;

use dlock_api::LockName;

use super::steps::{READY_PAUSE, THINK, announced, holding, ready, verify};
use crate::history::Expect;
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, ensure};

/// **A server that forgets a granted lock** (negative control): where the backend has such a
/// hazard ([`crate::Amnesia`]: Redis eviction, a Sentinel failover to a replica that missed the
/// grant, Redlock nodes restarted without persistence), a worker takes the lock with a lease
/// long enough that neither it nor its renewal can notice in time, the deployment forgets the
/// lock, and a second worker takes it. Both then believe they hold it: the checker **must**
/// report the overlap, and the fenced register must still take no stale write (the forgotten
/// holder's token is not above the new one's, whatever the server's counter did). This is why
/// the backend documents its hazard, and why a protected resource checks tokens.
pub async fn server_that_forgets_a_lock_is_caught(ctx: Ctx) -> CaseResult {
    let amnesia = ctx.require_faults()?.amnesia().await.map_err(Failure)?;
    let HeldThroughTheAct {
        run,
        names,
        holder,
        hazard,
    } = held_through_the_act(&ctx, &*amnesia).await?;
    let (harness, timing) = (amnesia.harness(), ctx.timing());
    let other = run.spawn_via(
        &run.spec(2, &names, 1, timing.short_ttl, timing.bound, THINK),
        &*harness,
    )?;
    ctx.within("the other worker", other.finish()).await??;
    run.resume(&holder)?;
    ctx.within("the forgotten holder", holder.finish())
        .await??;
    let residue = ctx.settled_residue_on(&*harness, &names).await?;
    verify(&run, &amnesia.expect(), &run.input(residue)?)?;
    // What the checker found (printed by `verify`) is the point of a negative control.
    eprintln!(
        "{}: {hazard}; the checker's report above is its verdict",
        ctx.case()
    );
    run.discard();
    Ok(())
}

/// A worker holding a lock on an [`Amnesia`](crate::Amnesia) deployment, paused (`SIGSTOP`)
/// between its read and its write, and the deployment's act done meanwhile.
struct HeldThroughTheAct {
    run: Run,
    names: [LockName; 1],
    holder: WorkerProcess,
    hazard: String,
}

async fn held_through_the_act(
    ctx: &Ctx,
    amnesia: &dyn crate::Amnesia,
) -> Result<HeldThroughTheAct, Failure> {
    let harness = amnesia.harness();
    let run = Run::start(ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    // The act may chain waits of its own (a Sentinel failover, then the old primary rejoining
    // as a replica), each of which can take seconds on a loaded machine.
    let act_bound = timing.bound.saturating_mul(3);
    // A lease the holder neither renews nor outlives while the case runs: the act, not an
    // expiry, is what could free the lock.
    let long_lease = act_bound.saturating_add(timing.bound);
    let mut holder_spec = run.spec(1, &names, 1, long_lease, timing.bound, timing.short_ttl);
    holder_spec.announce = true;
    holder_spec.ready_pause = Some(READY_PAUSE);
    let mut holder = run.spawn_via(&holder_spec, &*harness)?;
    ready(ctx, &mut holder).await?;
    ctx.within("the fault to be armed", amnesia.arm())
        .await?
        .map_err(Failure)?;
    holding(ctx, &mut holder).await?;
    // Held still between its read and its write until the other worker is done, however long
    // the act takes (a failover takes seconds).
    run.pause(&holder)?;
    let hazard = amnesia.hazard();
    run.log(crate::history::Edge::Start, format!("the act: {hazard}"));
    ctx.within_for("the deployment's act", act_bound, amnesia.forget(&names[0]))
        .await?
        .map_err(|e| Failure(format!("{hazard}: {e}")))?;
    run.log(crate::history::Edge::Stop, "the act is over");
    Ok(HeldThroughTheAct {
        run,
        names,
        holder,
        hazard,
    })
}

/// **The same hazard, mitigated**: the deployment of
/// [`server_that_forgets_a_lock_is_caught`], configured as the backend's docs advise
/// ([`Faults::amnesia_mitigated`](crate::Faults::amnesia_mitigated)), is put through the same act
/// while a worker holds the lock; a second worker asks for it meanwhile. The lock must survive:
/// the second worker gets it only after the holder released, and the history is clean.
pub async fn mitigated_server_keeps_the_lock(ctx: Ctx) -> CaseResult {
    let amnesia = ctx
        .require_faults()?
        .amnesia_mitigated()
        .await
        .map_err(Failure)?;
    let HeldThroughTheAct {
        run,
        names,
        holder,
        hazard: _,
    } = held_through_the_act(&ctx, &*amnesia).await?;
    let (harness, timing) = (amnesia.harness(), ctx.timing());
    let mut other_spec = run.spec(
        2,
        &names,
        1,
        timing.short_ttl,
        timing.bound.saturating_mul(2),
        THINK,
    );
    other_spec.announce = true;
    let mut other = run.spawn_via(&other_spec, &*harness)?;
    announced(&ctx, &mut other, "acquiring").await?;
    // Its request needs a moment to reach the servers; it must find the lock held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run.resume(&holder)?;
    ctx.within("the holder", holder.finish()).await??;
    ctx.within("the other worker", other.finish()).await??;
    let residue = ctx.settled_residue_on(&*harness, &names).await?;
    let report = verify(&run, &Expect::CLEAN, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted == 2,
        "expected the holder's and then the other worker's grant: {report}"
    );
    run.discard();
    Ok(())
}
