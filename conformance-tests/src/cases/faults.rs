//! Fault cases decided by the history checker: worker **processes** take locks and update a
//! fenced register while the harness pauses and kills them; afterwards the checker reads what
//! was recorded (see [`crate::history`]) and the case asserts its expectation profile. A failing
//! case names the directory where the whole run was dumped.

use std::time::Duration;

use dlock_api::{LeaseKind, LockName};

use crate::history::{Count, Expect, Input, Report};
use crate::nemesis::link::Link;
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, ensure};

/// How long a worker behind a fault proxy waits, once connected, before it asks for the lock.
const READY_PAUSE: Duration = Duration::from_millis(500);

/// The longest a worker thinks between reading and writing the register.
const THINK: Duration = Duration::from_millis(20);

/// Checks `input` against `expect`; on failure the run is dumped and its path named.
pub(super) fn verify(run: &Run, expect: &Expect, input: &Input) -> Result<Report, Failure> {
    expect.verify(input, &run.dir).map_err(Failure)
}

/// The next line of a worker in announce mode that starts with `what` (`holding`,
/// `acquiring`), without it.
pub(super) async fn announced(
    ctx: &Ctx,
    worker: &mut WorkerProcess,
    what: &str,
) -> Result<String, Failure> {
    loop {
        let line = ctx
            .within("a worker's announcement", worker.next_line())
            .await??
            .ok_or_else(|| Failure(format!("the worker exited before it said {what}")))?;
        if let Some(rest) = line.strip_prefix(what) {
            return Ok(rest.trim().to_owned());
        }
        // An earlier step's announcement, e.g. `acquiring` before `holding`.
    }
}

/// Waits for the line a worker in announce mode prints once it holds a lock; returns its token.
async fn holding(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<u64, Failure> {
    let rest = announced(ctx, worker, "holding ").await?;
    rest.split_whitespace()
        .nth(1)
        .and_then(|token| token.parse().ok())
        .ok_or_else(|| Failure(format!("the worker said holding {rest:?}")))
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
    let pause = ttl * 3;
    let mut holder_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl);
    holder_spec.announce = true;
    let mut holder = run.spawn(&holder_spec)?;
    holding(&ctx, &mut holder).await?;
    let mut waiter_spec = run.spec(2, &names, 1, ttl, pause + timing.bound, THINK);
    waiter_spec.announce = true;
    let mut waiter = run.spawn(&waiter_spec)?;
    announced(&ctx, &mut waiter, "acquiring").await?;
    // The request still has to reach the server's queue. Safety holds either way; a pause that
    // comes first only makes the case test less.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run.pause(&waiter)?;
    let mut behind_spec = run.spec(3, &names, 1, ttl, pause + timing.bound, ttl * 2);
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
    let waves = names.iter().zip(0..).map(|(name, wave)| {
        let delays: Vec<Duration> = (0..VICTIMS_PER_WAVE)
            .map(|_| Duration::from_millis(rng.random_range(0..=30)))
            .collect();
        let (ctx, run) = (&ctx, &run);
        async move {
            let wave_names = std::slice::from_ref(name);
            let first_id = wave * (VICTIMS_PER_WAVE + 1) + 1;
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
            let prober_id = first_id + VICTIMS_PER_WAVE;
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
            recovery_within: Some(timing.crash_bound * (VICTIMS_PER_WAVE + 1)),
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

/// A case's own server, or the reason the harness cannot give one.
async fn own_server(ctx: &Ctx) -> Result<crate::OwnServer, Failure> {
    ctx.require_faults()?.own_server().await.map_err(Failure)
}

/// A deployment to reach through fault proxies, and the link of proxies in front of it.
async fn proxied(ctx: &Ctx) -> Result<(crate::ProxyTarget, Link), Failure> {
    let target = ctx
        .require_faults()?
        .proxy_target()
        .await
        .map_err(Failure)?;
    let link = Link::start(&target.upstreams)?;
    Ok((target, link))
}

/// Acquires `name` on `harness`'s deployment, riding out the moments a restarted server is not
/// answering yet.
async fn acquire_after_restart(
    ctx: &Ctx,
    harness: &dyn crate::Harness,
    name: &LockName,
) -> Result<dlock_api::LockGuard, Failure> {
    let wait = dlock_api::LockOptions::new().with_wait_timeout(ctx.timing().bound);
    ctx.within("the lock after the server restarted", async {
        loop {
            match harness.client().await {
                Ok(client) => match client.acquire(name, &wait).await {
                    Ok(guard) => return Ok(guard),
                    Err(e) if e.is_retryable() => {}
                    Err(e) => return Err(Failure::from(e)),
                },
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(Failure::from(e)),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await?
}

/// **Tokens across restarts**: a server restarted cleanly, then one that crashed (`SIGKILL`)
/// and came back, each time hands out a token above every token before it. A protected
/// resource that remembers the highest token it saw would otherwise refuse every later holder,
/// or take a stale one.
pub async fn tokens_rise_across_server_restarts(ctx: Ctx) -> CaseResult {
    let own = own_server(&ctx).await?;
    let name = ctx.name("lock");
    let mut last = 0;
    for crash in [false, true, false] {
        let guard = acquire_after_restart(&ctx, &*own.harness, &name).await?;
        let token = guard.fencing_token().get();
        ensure!(
            token > last,
            "token {token} after {last} (the restart before was a {})",
            if crash { "clean one" } else { "crash" }
        );
        last = token;
        guard.release().await?;
        if crash {
            own.process.kill();
        }
        let process = &own.process;
        tokio::task::block_in_place(|| process.restart())
            .map_err(|e| Failure(format!("the server did not come back: {e}")))?;
    }
    Ok(())
}

/// **The server restarts while a lock is held**, cleanly and then after a crash (`SIGKILL`).
/// The holder either hears that it lost the lock (`lost` fires: a session the restart closed, a
/// lease the server forgot) or, where the hold survives the restart (a durable lease, a session
/// that outlives the outage), keeps it while no other client can take it. Its release then says
/// which (an error once lost, `Ok` if kept), the **same client** acquires again once the server
/// is back (stale connections and all), and every token is above the ones before.
pub async fn server_restart_while_held_is_lost_or_kept(ctx: Ctx) -> CaseResult {
    let own = own_server(&ctx).await?;
    let name = ctx.name("lock");
    let timing = ctx.timing();
    let client = own.harness.client().await?;
    let wait = dlock_api::LockOptions::new()
        .with_ttl(timing.short_ttl)
        .with_wait_timeout(timing.bound);
    let acquire_again = || async {
        ctx.within("the same client's lock after the restart", async {
            loop {
                match client.acquire(&name, &wait).await {
                    Ok(guard) => return Ok(guard),
                    Err(e) if e.is_retryable() => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(Failure::from(e)),
                }
            }
        })
        .await?
    };
    let mut last = 0;
    for crash in [false, true] {
        let guard = acquire_again().await?;
        let token = guard.fencing_token().get();
        ensure!(token > last, "token {token} after {last} (crash: {crash})");
        last = token;
        if crash {
            own.process.kill();
        }
        let process = &own.process;
        tokio::task::block_in_place(|| process.restart())
            .map_err(|e| Failure(format!("the server did not come back: {e}")))?;
        // A lost hold must be reported within two lease TTLs (a renewal finds it gone); one
        // kept that long survived the restart. A session lease may still be suspended then
        // (reconnecting, checking its nodes): wait, within the bound, until it is one or the
        // other.
        let mut lost = tokio::time::timeout(timing.short_ttl * 2, guard.lost()).await;
        if lost.is_err() {
            ctx.within("a suspended guard to be held again or lost", async {
                while matches!(guard.status(), dlock_api::LockStatus::Suspended { .. }) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await?;
            if let dlock_api::LockStatus::Lost(reason) = guard.status() {
                lost = Ok(reason);
            }
        }
        match lost {
            Ok(reason) => {
                eprintln!(
                    "{}: lost after the restart (crash: {crash}): {reason:?}",
                    ctx.case()
                );
                ensure!(
                    !guard.is_held(),
                    "lost fired, yet the guard says it is held"
                );
                ensure!(
                    guard.release().await.is_err(),
                    "the release of a lost guard succeeded (crash: {crash})"
                );
            }
            Err(_kept) => {
                eprintln!("{}: kept across the restart (crash: {crash})", ctx.case());
                ensure!(guard.is_held(), "the guard is neither held nor lost");
                let other = own.harness.client().await?;
                let taken = other
                    .try_acquire(&name, &dlock_api::LockOptions::new())
                    .await?;
                ensure!(
                    taken.is_none(),
                    "a hold that survived the restart was granted to another client too"
                );
                guard.release().await?;
            }
        }
    }
    let next = acquire_again().await?;
    ensure!(
        next.fencing_token().get() > last,
        "token {} after {last} once the restarts were over",
        next.fencing_token()
    );
    next.release().await?;
    Ok(())
}

/// **A partitioned holder**: a worker reaching the server through a fault proxy takes the
/// lock, reads the register, and is cut off (the proxy drops nothing, answers nothing) while it
/// thinks for two TTLs; another worker, connected directly, wants the lock; then the link heals.
///
/// - TTL leases: the lease expires, the other worker takes the lock with a higher token and
///   writes; the cut-off worker's late write must be refused, and no two holds overlap.
/// - Session leases: the server cannot tell a silent link from a slow one (the proxy's kernel
///   still acknowledges), so the lock stays the cut-off worker's until the link heals and its
///   connection closes; the other worker waits. No overlap, nothing stale accepted.
pub async fn partitioned_holder_is_fenced_off(ctx: Ctx) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let linked = (target.reach_at)(&proxy.addrs());
    let client = target.harness.client().await?;
    let ttl_lease = client.capabilities().lease == LeaseKind::Ttl;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut cut_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl * 2);
    cut_spec.announce = true;
    let mut cut = run.spawn_via(&cut_spec, &*linked)?;
    holding(&ctx, &mut cut).await?;
    proxy.set_mode(dlock_test_servers::ProxyMode::Blackhole);
    run.log(crate::history::Edge::Start, "blackhole worker 1's link");
    let other_spec = run.spec(2, &names, 2, ttl, ttl * 4 + timing.bound, THINK);
    let other = run.spawn_via(&other_spec, &*target.harness)?;
    ctx.within("the cut-off worker to give up", cut.finish())
        .await??;
    proxy.heal();
    run.log(crate::history::Edge::Stop, "heal worker 1's link");
    ctx.within("the other worker", other.finish()).await??;
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    let expect = Expect {
        stale_attempts: if ttl_lease {
            Count::AtLeast(1)
        } else {
            Count::Any
        },
        ..Expect::FENCED_FAULT
    };
    verify(&run, &expect, &run.input(residue)?)?;
    run.discard();
    Ok(())
}

/// **A late release after a partition**: a worker behind a fault proxy holds the lock and is
/// cut off (blackholed) while it thinks; another worker takes the lock once the lease runs out
/// and keeps it, renewing; then the link heals (its stuck connections reset, as a client's
/// would be) while the cut-off worker still thinks, so its write and its **release arrive at
/// the server while the other worker holds**. The release must not free the other's lock (a
/// release without the owner check would): a third worker waiting for the lock would be let
/// in early, an overlap the checker sees. The late write is refused by its token. On session
/// leases the cut-off worker keeps the lock until its connection closes; nothing unsafe may
/// happen either way.
pub async fn late_release_after_a_partition_spares_the_next_holder(ctx: Ctx) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut cut_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl * 3);
    cut_spec.announce = true;
    let mut cut = run.spawn_via(&cut_spec, &*(target.reach_at)(&proxy.addrs()))?;
    holding(&ctx, &mut cut).await?;
    proxy.set_mode(dlock_test_servers::ProxyMode::Blackhole);
    run.log(crate::history::Edge::Start, "blackhole worker 1's link");
    // The next holder keeps the lock well past the cut-off worker's release.
    let mut next_spec = run.spec(2, &names, 1, ttl, ttl * 4 + timing.bound, ttl * 4);
    next_spec.announce = true;
    let mut next = run.spawn_via(&next_spec, &*target.harness)?;
    let next_holds = tokio::time::timeout(ttl * 2, holding(&ctx, &mut next)).await;
    // Where the lease is a session, the server still counts the cut-off worker as holding:
    // the next holder waits for the heal.
    proxy.reset();
    proxy.heal();
    run.log(
        crate::history::Edge::Stop,
        "heal worker 1's link (its connections reset)",
    );
    let third_spec = run.spec(3, &names, 1, ttl, ttl * 8 + timing.bound, THINK);
    let third = run.spawn_via(&third_spec, &*target.harness)?;
    ctx.within("the cut-off worker's late write and release", cut.finish())
        .await??;
    if next_holds.is_err() {
        holding(&ctx, &mut next).await?;
    }
    ctx.within("the next holder", next.finish()).await??;
    ctx.within("the third worker", third.finish()).await??;
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    let expect = Expect {
        // The cut-off worker writes before the next holder's first write (which comes after a
        // long think, so that the late release lands during that hold): the register has seen
        // no newer token yet and takes it, and the next holder's write, made from its earlier
        // read, drops that element. Fencing refuses only a token older than one the resource
        // has seen; the release, not the write, is under test here.
        lost_updates: Count::Any,
        ..SURVIVED
    };
    let report = verify(&run, &expect, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted == 3,
        "expected each of the three workers to hold the lock once: {report}"
    );
    run.discard();
    Ok(())
}

/// **A slow link, and a jittery one**: one worker reaches the server through a fault proxy that
/// delays every chunk by a twentieth of the lease TTL each way (a round trip of a tenth of the
/// lease, 200 ms for a 2 s lease: a congested WAN link), one through a proxy whose delay is drawn
/// per chunk between a fortieth and a tenth of the TTL, two connect directly, and all four run
/// rounds on one name. Slow or uneven requests and replies must not let a lease look longer to
/// its holder than it is on the server (a deadline counted from the reply, not the request,
/// would): the history must come out clean.
pub async fn slow_link_keeps_exclusion(ctx: Ctx) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    proxy.set_mode(dlock_test_servers::ProxyMode::Latency(ttl / 20));
    let jittery_proxy = Link::start(&target.upstreams)?;
    let (min, max) = (ttl / 40, ttl / 10);
    jittery_proxy.set_mode(dlock_test_servers::ProxyMode::Jitter { min, max });
    let slow = (target.reach_at)(&proxy.addrs());
    let jittery = (target.reach_at)(&jittery_proxy.addrs());
    let run = Run::start(&ctx).await?;
    run.log(
        crate::history::Edge::Start,
        format!(
            "{:?} latency each way on worker 1, {min:?}..{max:?} on worker 2",
            ttl / 20
        ),
    );
    let names = [ctx.name("lock")];
    let mut workers = Vec::new();
    for id in 1..=4 {
        let spec = run.spec(id, &names, 4, ttl, timing.bound, THINK);
        let via = match id {
            1 => &*slow,
            2 => &*jittery,
            _ => &*target.harness,
        };
        workers.push(run.spawn_via(&spec, via)?);
    }
    for worker in workers {
        ctx.within("a worker's rounds", worker.finish()).await??;
    }
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    let report = verify(&run, &Expect::CLEAN, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted >= 4,
        "only {} acquires succeeded over the slow link: {report}",
        report.liveness.granted
    );
    run.discard();
    Ok(())
}

/// Waits for the `ready` line of a worker started with a ready pause.
async fn ready(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<(), Failure> {
    let line = ctx
        .within("a worker to connect", worker.next_line())
        .await??;
    ensure!(
        line.as_deref() == Some("ready"),
        "the worker said {line:?} instead of ready"
    );
    Ok(())
}

/// A worker behind a fault proxy and a direct one; the link fault starts once the linked worker
/// has connected and before it asks for the lock.
struct LinkedPair {
    target: crate::ProxyTarget,
    proxy: Link,
    run: Run,
    names: [LockName; 1],
    linked: WorkerProcess,
    direct: WorkerProcess,
}

async fn linked_pair(
    ctx: &Ctx,
    mode: dlock_test_servers::ProxyMode,
    think: Duration,
) -> Result<LinkedPair, Failure> {
    let (target, proxy) = proxied(ctx).await?;
    let run = Run::start(ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut linked_spec = run.spec(1, &names, 1, ttl, timing.bound, think);
    linked_spec.announce = true;
    linked_spec.ready_pause = Some(READY_PAUSE);
    let mut linked = run.spawn_via(&linked_spec, &*(target.reach_at)(&proxy.addrs()))?;
    ready(ctx, &mut linked).await?;
    proxy.set_mode(mode);
    run.log(
        crate::history::Edge::Start,
        format!("{mode:?} on worker 1's link"),
    );
    // The other worker starts once the linked worker's request has taken the lock on the
    // server, so that it contends for it. A client whose acquire needs an answer before its
    // request (ZooKeeper re-creating a parent node that emptied) never gets that far: then the
    // case goes on after a while and checks that nothing unsafe happened either way.
    let took_effect = async {
        // Read-only: what the server holds of the name.
        while target
            .harness
            .residue(&names)
            .await
            .map_err(Failure)?
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok::<_, Failure>(())
    };
    match tokio::time::timeout(timing.short_ttl * 2, took_effect).await {
        Ok(result) => result?,
        Err(_) => run.log(
            crate::history::Edge::Start,
            "the linked worker's request did not reach the server",
        ),
    }
    let direct_spec = run.spec(2, &names, 2, ttl, ttl * 4 + timing.bound, THINK);
    let direct = run.spawn_via(&direct_spec, &*target.harness)?;
    Ok(LinkedPair {
        target,
        proxy,
        run,
        names,
        linked,
        direct,
    })
}

/// The profile of a link fault: nothing unsafe and nothing left, whatever the timing made of
/// refusals.
const SURVIVED: Expect = Expect {
    stale_attempts: Count::Any,
    ..Expect::FENCED_FAULT
};

/// **Lost replies**: a worker's acquire reaches the server, which grants it, but every
/// reply is thrown away: the worker cannot know whether it holds the lock (its acquire ends
/// "outcome unknown"), and it must not leave the lock behind. Another worker gets the lock;
/// no overlap, nothing stale accepted, nothing left.
pub async fn lost_acquire_reply_leaves_nothing(ctx: Ctx) -> CaseResult {
    let pair = linked_pair(&ctx, dlock_test_servers::ProxyMode::DropReplies, THINK).await?;
    ctx.within("the worker whose replies are lost", pair.linked.finish())
        .await??;
    pair.proxy.heal();
    pair.run
        .log(crate::history::Edge::Stop, "heal worker 1's link");
    ctx.within("the direct worker", pair.direct.finish())
        .await??;
    let residue = ctx
        .settled_residue_on(&*pair.target.harness, &pair.names)
        .await?;
    let report = verify(&pair.run, &SURVIVED, &pair.run.input(residue)?)?;
    ensure!(
        report.liveness.indeterminate + report.liveness.failed >= 1,
        "the worker behind the dropped replies acquired anyway: {report}"
    );
    pair.run.discard();
    Ok(())
}

/// **A lost release reply**: a worker behind a fault proxy holds the lock; its link starts
/// dropping every reply just before it releases, so its release reaches the server but the
/// answer never comes back, and whatever the client retries (a reconnect, the same request
/// again, a background clean-up) happens while **another worker already holds the lock**. A
/// retry must never release that newer hold: a third worker waits for the lock meanwhile, and
/// would be let in early (an overlap the checker sees) if the newer hold were deleted.
pub async fn lost_release_reply_spares_the_next_holder(ctx: Ctx) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut linked_spec = run.spec(1, &names, 1, ttl, timing.bound, THINK * 10);
    linked_spec.announce = true;
    let mut linked = run.spawn_via(&linked_spec, &*(target.reach_at)(&proxy.addrs()))?;
    holding(&ctx, &mut linked).await?;
    // It thinks for a while yet, then writes (the register is reached directly) and releases.
    proxy.set_mode(dlock_test_servers::ProxyMode::DropReplies);
    run.log(
        crate::history::Edge::Start,
        "drop the replies on worker 1's link, before its release",
    );
    // The next holder keeps the lock (renewing it) long enough for any retry to land.
    let mut next_spec = run.spec(2, &names, 1, ttl, ttl * 4 + timing.bound, ttl * 2);
    next_spec.announce = true;
    let mut next = run.spawn_via(&next_spec, &*target.harness)?;
    holding(&ctx, &mut next).await?;
    let third_spec = run.spec(3, &names, 1, ttl, ttl * 4 + timing.bound, THINK);
    let third = run.spawn_via(&third_spec, &*target.harness)?;
    ctx.within("the worker whose release reply is lost", linked.finish())
        .await??;
    proxy.heal();
    run.log(crate::history::Edge::Stop, "heal worker 1's link");
    ctx.within("the next holder", next.finish()).await??;
    ctx.within("the third worker", third.finish()).await??;
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    let report = verify(&run, &SURVIVED, &run.input(residue)?)?;
    ensure!(
        report.liveness.granted == 3,
        "expected each of the three workers to hold the lock once: {report}"
    );
    run.discard();
    Ok(())
}

/// **A reply held back past most of the lease** (the network delays the grant): the server
/// grants the lock at once, but the reply reaches the worker three quarters of a TTL later, and
/// every later reply is held again (its renewals fail). Its guard is valid only until the
/// request's send time plus the TTL — not the reply's arrival plus the TTL — so when the lease
/// expires on the server and the direct worker takes the lock, the two holds must not overlap
/// in the history. A library that dates validity from the reply is caught here. Where a session
/// keepalive shares the link (SQL connections, etcd's keep-alive stream), it notices the held
/// replies first and closes the connection: the acquire's outcome is then unknown, and the
/// history must be as safe.
pub async fn delayed_grant_counts_from_the_request(ctx: Ctx) -> CaseResult {
    let ttl = ctx.timing().short_ttl;
    let pair = linked_pair(
        &ctx,
        dlock_test_servers::ProxyMode::HoldReplies,
        ttl * 3 / 4,
    )
    .await?;
    let LinkedPair {
        target,
        proxy,
        run,
        names,
        linked,
        direct,
    } = pair;
    // The fault's length is what is under test here: the grant arrives three quarters of a TTL
    // after the request took effect.
    tokio::time::sleep(ttl * 3 / 4).await;
    proxy.release_held();
    run.log(
        crate::history::Edge::Stop,
        "deliver worker 1's held replies",
    );
    ctx.within("the worker with the delayed grant", linked.finish())
        .await??;
    proxy.heal();
    run.log(crate::history::Edge::Stop, "heal worker 1's link");
    ctx.within("the direct worker", direct.finish()).await??;
    let residue = ctx.settled_residue_on(&*target.harness, &names).await?;
    verify(&run, &SURVIVED, &run.input(residue)?)?;
    run.discard();
    Ok(())
}

/// **A frozen server** (`SIGSTOP` on the server process, as a stalled VM or a long GC in
/// the server would): a worker holds the lock between read and write while the server is
/// frozen for three TTLs; another worker waits for the lock meanwhile. After the thaw, whoever
/// the server lets in, no two holds may overlap and no stale write may be accepted: a holder
/// that could not renew through the freeze must have stopped believing at its deadline.
pub async fn frozen_server_holds_no_one_twice(ctx: Ctx) -> CaseResult {
    let own = own_server(&ctx).await?;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut holder_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl * 4);
    holder_spec.announce = true;
    let mut holder = run.spawn_via(&holder_spec, &*own.harness)?;
    holding(&ctx, &mut holder).await?;
    let other_spec = run.spec(2, &names, 2, ttl, ttl * 6 + timing.bound, THINK);
    let other = run.spawn_via(&other_spec, &*own.harness)?;
    own.process.pause();
    run.log(crate::history::Edge::Start, "freeze the server");
    // The freeze's length is what is under test.
    tokio::time::sleep(ttl * 3).await;
    own.process.resume();
    run.log(crate::history::Edge::Stop, "thaw the server");
    ctx.within("the holder after the thaw", holder.finish())
        .await??;
    ctx.within("the other worker after the thaw", other.finish())
        .await??;
    let residue = ctx.settled_residue_on(&*own.harness, &names).await?;
    verify(&run, &SURVIVED, &run.input(residue)?)?;
    run.discard();
    Ok(())
}

/// **A frozen, then a dead server answers `Unavailable`, never a hang**: with the
/// server frozen (`SIGSTOP`), an attempt fails with [`LockError::Unavailable`] within its
/// command timeout; with the server killed, attempts and new clients fail the same way; bad
/// input is still refused before any network call, with `InvalidArgument`.
///
/// [`LockError::Unavailable`]: dlock_api::LockError::Unavailable
pub async fn dead_or_frozen_server_answers_unavailable(ctx: Ctx) -> CaseResult {
    use dlock_api::{LockError, LockOptions};
    let own = own_server(&ctx).await?;
    let client = own.harness.client().await?;
    let name = ctx.name("lock");
    let unavailable = |what: &str, got: &dlock_api::Result<Option<dlock_api::LockGuard>>| {
        if matches!(got, Err(LockError::Unavailable { .. })) {
            Ok(())
        } else {
            Err(Failure(format!("{what}: {got:?}, not Unavailable")))
        }
    };
    own.process.pause();
    let frozen = ctx
        .within(
            "an attempt on a frozen server",
            client.try_acquire(&name, &LockOptions::new()),
        )
        .await;
    own.process.resume();
    unavailable("an attempt on a frozen server", &frozen?)?;
    own.process.kill();
    let dead = ctx
        .within(
            "an attempt on a dead server",
            client.try_acquire(&name, &LockOptions::new()),
        )
        .await?;
    unavailable("an attempt on a dead server", &dead)?;
    let bad = client
        .try_acquire(&name, &LockOptions::new().with_ttl(Duration::ZERO))
        .await;
    ensure!(
        matches!(bad, Err(LockError::InvalidArgument { .. })),
        "bad input on a dead server: {bad:?}, not InvalidArgument"
    );
    let connect = ctx
        .within("a new client of a dead server", own.harness.client())
        .await?;
    ensure!(
        matches!(connect, Err(LockError::Unavailable { .. })),
        "a new client of a dead server: {:?}, not Unavailable",
        connect.map(|c| c.to_string())
    );
    Ok(())
}

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
    let report = verify(&run, &amnesia.expect(), &run.input(residue)?)?;
    // What the checker found is the point of a negative control: show it.
    eprintln!("{}: {hazard}; the checker reports:\n{report}", ctx.case());
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
    let act_bound = timing.bound * 3;
    // A lease the holder neither renews nor outlives while the case runs: the act, not an
    // expiry, is what could free the lock.
    let long_lease = act_bound + timing.bound;
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
    let mut other_spec = run.spec(2, &names, 1, timing.short_ttl, timing.bound * 2, THINK);
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
