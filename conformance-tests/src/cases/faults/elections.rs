//! The fault suite on elections: worker processes campaign for a name each round instead of
//! taking the lock, and write the fenced register with their term, while the harness pauses,
//! kills and cuts off leaders. A leadership is a lock's hold, so the checker judges it as one:
//! no two leaders' holds valid at once, terms unique and rising, a deposed leader's late write
//! refused by its term, nothing left on the server.

use std::time::Duration;

use dlock_api::LeaseKind;

use super::steps::{THINK, holding, verify};
use crate::history::{Count, Expect};
use crate::nemesis::Run;
use crate::{CaseResult, Ctx, ensure};

/// **A paused and a killed leader.** One worker leads and is stopped with `SIGSTOP` between
/// reading the register and writing it, for three lease TTLs; another, leading next, is killed
/// (`SIGKILL`) while it leads; four more candidates campaign round after round meanwhile; then
/// the paused leader resumes and writes late, as a leader that does not check would.
///
/// - TTL leases: the paused leader's term ends at its deadline, so the others lead in turn with
///   higher terms; its late write carries an old term and must be refused.
/// - Session leases: the paused process's session keeps its leadership until it resumes (no
///   one else leads meanwhile), the dead one's ends with its session.
///
/// Either way: never two leaders at once, terms rise, nothing stale accepted, nothing left.
///
/// CONTRACT: "One leader" and "Terms fence" (Leader election) under a paused and a dead leader.
pub async fn election_leaders_paused_and_killed(ctx: Ctx) -> CaseResult {
    let ttl_lease = ctx.client().await?.capabilities().lease == LeaseKind::Ttl;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("election")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let pause = ttl.saturating_mul(3);
    let mut frozen_spec = run.spec(1, &names, 1, ttl, timing.bound, Duration::from_millis(300));
    frozen_spec.announce = true;
    frozen_spec.elect = true;
    let mut frozen = run.spawn(&frozen_spec)?;
    holding(&ctx, &mut frozen).await?;
    run.pause(&frozen)?;
    let wait = pause
        .saturating_add(timing.crash_bound)
        .saturating_add(timing.bound);
    let mut doomed_spec = run.spec(2, &names, 1, ttl, wait, ttl);
    doomed_spec.announce = true;
    doomed_spec.elect = true;
    let mut doomed = Some(run.spawn(&doomed_spec)?);
    if ttl_lease {
        // It leads once the paused leader's term has run out; the kill lands while it leads.
        if let Some(mut leader) = doomed.take() {
            holding(&ctx, &mut leader).await?;
            run.kill(leader).await?;
        }
    }
    let mut others = Vec::new();
    for id in 3..=6 {
        let mut spec = run.spec(id, &names, 4, ttl, wait, THINK);
        spec.elect = true;
        others.push(run.spawn(&spec)?);
    }
    // The pause's length is what is under test: a TTL leader's term runs out meanwhile.
    tokio::time::sleep(pause).await;
    run.resume(&frozen)?;
    ctx.within("the paused leader after it resumed", frozen.finish())
        .await??;
    if let Some(mut leader) = doomed.take() {
        // The session kept the paused leader's term; the next leads now, and dies leading.
        holding(&ctx, &mut leader).await?;
        run.kill(leader).await?;
    }
    for worker in others {
        ctx.within(
            "a candidate beside the paused and the dead leader",
            worker.finish(),
        )
        .await??;
    }
    let residue = ctx.settled_residue(&names).await?;
    let input = run.input(residue)?;
    let expect = if ttl_lease {
        Expect::FENCED_FAULT
    } else {
        Expect {
            residue: Count::Any,
            ..Expect::CLEAN
        }
    };
    let report = verify(&run, &expect, &input)?;
    ensure!(
        report.liveness.granted >= 6,
        "only {} terms were granted: {report}",
        report.liveness.granted
    );
    run.discard();
    Ok(())
}

/// **A partitioned leader.** A leader reaching the server through a fault proxy reads the
/// register and is cut off (the proxy answers nothing) while it thinks for two TTLs; another
/// candidate, connected directly, campaigns meanwhile; then the link heals (the lock's
/// `partitioned_holder_is_fenced_off`, campaigning).
///
/// - TTL leases: the cut-off leader's term runs out, the others lead with higher terms, and its
///   late write is refused.
/// - Session leases: the server cannot tell a silent link from a slow one, so the term stays
///   the cut-off leader's until the link heals and its connection closes; the others wait.
///
/// Either way: never two leaders at once, nothing stale accepted.
///
/// CONTRACT: "Terms fence" (Leader election) across a partition.
pub async fn election_partitioned_leader_is_fenced_off(ctx: Ctx) -> CaseResult {
    super::links::partitioned_holder(ctx, true).await
}
