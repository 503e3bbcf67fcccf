//! Faults done to the worker processes: none (the baseline), paused holders and waiters, killed
//! holders, workers killed at random points of their rounds.

use std::time::Duration;

use dlock_api::{LeaseKind, LockName};

use super::steps::{THINK, announced, holding, verify};
use crate::history::{Count, Expect};
use crate::nemesis::Run;
use crate::{CaseResult, Ctx, ensure};

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

/// **The coupon scenario, history-checked.** A hundred requests, from four worker processes,
/// each take one of a hundred coupons under the lock: read what was taken, think, write it back
/// with one more take. None may be left, none taken twice, and the checker must find the
/// history clean: no overlap, no refused or lost write (in the unfenced shadow either), tokens
/// rising. The in-process `exclusion::coupon_100_tasks_leave_zero` shows the count; this shows
/// it across processes, from the records alone.
pub async fn coupon_100_requests_leave_zero(ctx: Ctx) -> CaseResult {
    const COUPONS: usize = 100;
    const WORKERS: u32 = 4;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("coupon")];
    let timing = ctx.timing();
    let mut workers = Vec::new();
    for id in 1..=WORKERS {
        let rounds = (COUPONS as u32) / WORKERS;
        let spec = run.spec(id, &names, rounds, timing.short_ttl, timing.bound, THINK);
        workers.push(run.spawn(&spec)?);
    }
    for worker in workers {
        ctx.within("a worker's requests", worker.finish()).await??;
    }
    let residue = ctx.settled_residue(&names).await?;
    let input = run.input(residue)?;
    let report = verify(&run, &Expect::CLEAN, &input)?;
    let taken = |register: &crate::history::RegisterSnapshot| {
        register
            .sets
            .get(names[0].as_str())
            .map_or(0, |set| set.len())
    };
    ensure!(
        report.liveness.granted == COUPONS && report.liveness.failed == 0,
        "{} of {COUPONS} requests got the lock ({} failed): {report}",
        report.liveness.granted,
        report.liveness.failed
    );
    ensure!(
        taken(&input.register) == COUPONS,
        "{} coupons left: {report}",
        COUPONS.saturating_sub(taken(&input.register))
    );
    if let Some(shadow) = &input.shadow {
        ensure!(
            taken(shadow) == COUPONS,
            "{} coupons left in the unfenced shadow: {report}",
            COUPONS.saturating_sub(taken(shadow))
        );
    }
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
    let pause = ttl.saturating_mul(3);
    let mut frozen_spec = run.spec(1, &names, 1, ttl, timing.bound, Duration::from_millis(300));
    frozen_spec.announce = true;
    let mut frozen = run.spawn(&frozen_spec)?;
    holding(&ctx, &mut frozen).await?;
    run.pause(&frozen)?;
    let other_spec = run.spec(2, &names, 2, ttl, pause.saturating_add(timing.bound), THINK);
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

/// **A paused waiter** (a GC pause while queued): a worker asks for a held lock and is stopped
/// (`SIGSTOP`) for three lease TTLs; the holder releases, and a third worker wants the lock too.
/// A backend that hands the lock to the first in line hands it to a process that cannot answer.
///
/// - TTL leases: that grant must run out like any lease nobody renews, the third worker must
///   get the lock meanwhile, and when the paused worker resumes **while the third one holds**,
///   it must not take a grant that reached it late for a fresh one (the checker sees any
///   overlap); its write, if it makes one, is refused.
/// - Session leases: the paused process's connection keeps what it was granted until it
///   resumes; the third worker waits for it.
///
/// Either way: no overlap, nothing stale accepted, nothing left.
pub async fn paused_waiter_takes_no_stale_grant(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let ttl_lease = client.capabilities().lease == LeaseKind::Ttl;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let pause = ttl.saturating_mul(3);
    let mut holder_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl);
    holder_spec.announce = true;
    let mut holder = run.spawn(&holder_spec)?;
    holding(&ctx, &mut holder).await?;
    let mut waiter_spec = run.spec(2, &names, 1, ttl, pause.saturating_add(timing.bound), THINK);
    waiter_spec.announce = true;
    let mut waiter = run.spawn(&waiter_spec)?;
    announced(&ctx, &mut waiter, "acquiring").await?;
    // The request still has to reach the server's queue. Safety holds either way; a pause that
    // comes first only makes the case test less.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run.pause(&waiter)?;
    let mut behind_spec = run.spec(
        3,
        &names,
        1,
        ttl,
        pause.saturating_add(timing.bound),
        ttl.saturating_mul(2),
    );
    behind_spec.announce = true;
    let mut behind = run.spawn(&behind_spec)?;
    ctx.within("the holder", holder.finish()).await??;
    if ttl_lease {
        holding(&ctx, &mut behind).await?;
    } else {
        tokio::time::sleep(pause).await;
    }
    run.resume(&waiter)?;
    ctx.within("the paused waiter after it resumed", waiter.finish())
        .await??;
    ctx.within("the worker behind it", behind.finish())
        .await??;
    let residue = ctx.settled_residue(&names).await?;
    let report = verify(
        &run,
        &Expect {
            stale_attempts: Count::Any,
            shadow_lost: Count::Any,
            ..Expect::CLEAN
        },
        &run.input(residue)?,
    )?;
    ensure!(
        report.liveness.granted >= 2,
        "the worker behind the paused one never got the lock: {report}"
    );
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

/// Waves of workers killed at random points, and the workers in each.
const KILL_WAVES: u32 = 6;
const VICTIMS_PER_WAVE: u32 = 3;

/// **Workers killed at random points** of acquire, read, write, release and the next
/// acquire: in each of six waves, three worker processes run quick rounds on one name and each
/// is killed (`SIGKILL`) between 0 and 30 ms (drawn from the run's seed) after it starts asking
/// for the lock; then a prober takes the name. Whatever the kills interrupted, the name must
/// come free within the crash bound, no two holds may overlap, and nothing may be left on the
/// server. The bound is the harness's [crash bound](crate::Timing::crash_bound) per dead worker
/// of the wave, plus one: a backend that queues waiters on the server (Redis's grant queue) may
/// hand the lock to a waiter that died in line, whose grant then runs out like any other
/// unrenewed lease.
pub async fn killed_at_random_points_leaves_nothing(ctx: Ctx) -> CaseResult {
    use rand::{Rng, SeedableRng};
    let run = Run::start(&ctx).await?;
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut rng = rand::rngs::StdRng::seed_from_u64(run.seed);
    let names: Vec<LockName> = (0..KILL_WAVES)
        .map(|wave| ctx.name(&format!("wave{wave}")))
        .collect();
    // The waves run side by side, each on its name: a wave's victims are workers
    // `wave * (VICTIMS_PER_WAVE + 1) + 1..`, its prober the last of its ids.
    let waves = names.iter().zip(0u32..).map(|(name, wave)| {
        let delays: Vec<Duration> = (0..VICTIMS_PER_WAVE)
            .map(|_| Duration::from_millis(rng.random_range(0..=30)))
            .collect();
        let (ctx, run) = (&ctx, &run);
        async move {
            let wave_names = std::slice::from_ref(name);
            let first_id = wave.saturating_mul(VICTIMS_PER_WAVE + 1).saturating_add(1);
            let mut kills = Vec::new();
            for (id, delay) in (first_id..).zip(delays) {
                let mut spec = run.spec(
                    id,
                    wave_names,
                    4,
                    ttl,
                    timing.bound,
                    Duration::from_millis(5),
                );
                spec.announce = true;
                let mut victim = run.spawn(&spec)?;
                kills.push(async move {
                    announced(ctx, &mut victim, "acquiring").await?;
                    tokio::time::sleep(delay).await;
                    run.kill(victim).await
                });
            }
            futures::future::try_join_all(kills).await?;
            let prober_id = first_id.saturating_add(VICTIMS_PER_WAVE);
            let prober =
                run.spawn(&run.spec(prober_id, wave_names, 1, ttl, timing.bound, THINK))?;
            ctx.within("the prober after the kills", prober.finish())
                .await?
        }
    });
    futures::future::try_join_all(waves).await?;
    let residue = ctx.settled_residue(&names).await?;
    let report = verify(
        &run,
        &Expect {
            // A worker killed between its fenced and its shadow write leaves the shadow short.
            shadow_lost: Count::Any,
            recovery_within: Some(timing.crash_bound.saturating_mul(VICTIMS_PER_WAVE + 1)),
            ..Expect::CLEAN
        },
        &run.input(residue)?,
    )?;
    let probers = usize::try_from(KILL_WAVES).unwrap_or(usize::MAX);
    ensure!(
        report.liveness.granted >= probers,
        "{} grants, fewer than the {probers} probers': {report}",
        report.liveness.granted
    );
    run.discard();
    Ok(())
}
