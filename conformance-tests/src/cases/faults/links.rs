//! Faults done to the link between a worker and the server, through fault proxies: cut, slowed,
//! replies thrown away or held back.

use std::time::Duration;

use dlock_api::{LeaseKind, LockName};

use super::steps::{READY_PAUSE, SURVIVED, THINK, holding, proxied, ready, verify};
use crate::history::{Count, Expect};
use crate::nemesis::link::Link;
use crate::nemesis::{Run, WorkerProcess};
use crate::{CaseResult, Ctx, Failure, ensure};

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
    partitioned_holder(ctx, false).await
}

/// [`partitioned_holder_is_fenced_off`], with the workers taking the lock or (`elect`) campaigning
/// for the name as leaders.
pub(super) async fn partitioned_holder(ctx: Ctx, elect: bool) -> CaseResult {
    let (target, proxy) = proxied(&ctx).await?;
    let linked = (target.reach_at)(&proxy.addrs());
    let client = target.harness.client().await?;
    let ttl_lease = client.capabilities().lease == LeaseKind::Ttl;
    let run = Run::start(&ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let mut cut_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl.saturating_mul(2));
    cut_spec.announce = true;
    cut_spec.elect = elect;
    let mut cut = run.spawn_via(&cut_spec, &*linked)?;
    holding(&ctx, &mut cut).await?;
    proxy.set_mode(dlock_test_servers::ProxyMode::Blackhole);
    run.log(crate::history::Edge::Start, "blackhole worker 1's link");
    let mut other_spec = run.spec(
        2,
        &names,
        2,
        ttl,
        ttl.saturating_mul(4).saturating_add(timing.bound),
        THINK,
    );
    other_spec.elect = elect;
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
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let (case, cut) = proxied_holder(&ctx, ttl.saturating_mul(3)).await?;
    let ProxiedCase {
        target,
        proxy,
        run,
        names,
    } = &case;
    proxy.set_mode(dlock_test_servers::ProxyMode::Blackhole);
    run.log(crate::history::Edge::Start, "blackhole worker 1's link");
    // The next holder keeps the lock well past the cut-off worker's release.
    let mut next_spec = run.spec(
        2,
        names,
        1,
        ttl,
        ttl.saturating_mul(4).saturating_add(timing.bound),
        ttl.saturating_mul(4),
    );
    next_spec.announce = true;
    let mut next = run.spawn_via(&next_spec, &*target.harness)?;
    let next_holds = tokio::time::timeout(ttl.saturating_mul(2), holding(&ctx, &mut next)).await;
    // Where the lease is a session, the server still counts the cut-off worker as holding:
    // the next holder waits for the heal.
    proxy.reset();
    proxy.heal();
    run.log(
        crate::history::Edge::Stop,
        "heal worker 1's link (its connections reset)",
    );
    let third_spec = run.spec(
        3,
        names,
        1,
        ttl,
        ttl.saturating_mul(8).saturating_add(timing.bound),
        THINK,
    );
    let third = run.spawn_via(&third_spec, &*target.harness)?;
    ctx.within("the cut-off worker's late write and release", cut.finish())
        .await??;
    if next_holds.is_err() {
        holding(&ctx, &mut next).await?;
    }
    let expect = Expect {
        // The cut-off worker writes before the next holder's first write (which comes after a
        // long think, so that the late release lands during that hold): the register has seen
        // no newer token yet and takes it, and the next holder's write, made from its earlier
        // read, drops that element. Fencing refuses only a token older than one the resource
        // has seen; the release, not the write, is under test here.
        lost_updates: Count::Any,
        ..SURVIVED
    };
    each_held_once(&ctx, case, [next, third], &expect).await
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
    proxy.set_mode(dlock_test_servers::ProxyMode::Latency(
        ttl.checked_div(20).unwrap_or_default(),
    ));
    let jittery_proxy = Link::start(&target.upstreams)?;
    let (min, max) = (
        ttl.checked_div(40).unwrap_or_default(),
        ttl.checked_div(10).unwrap_or_default(),
    );
    jittery_proxy.set_mode(dlock_test_servers::ProxyMode::Jitter { min, max });
    let slow = (target.reach_at)(&proxy.addrs());
    let jittery = (target.reach_at)(&jittery_proxy.addrs());
    let run = Run::start(&ctx).await?;
    run.log(
        crate::history::Edge::Start,
        format!(
            "{:?} latency each way on worker 1, {min:?}..{max:?} on worker 2",
            ttl.checked_div(20).unwrap_or_default()
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
    match tokio::time::timeout(timing.short_ttl.saturating_mul(2), took_effect).await {
        Ok(result) => result?,
        Err(_) => run.log(
            crate::history::Edge::Start,
            "the linked worker's request did not reach the server",
        ),
    }
    let direct_spec = run.spec(
        2,
        &names,
        2,
        ttl,
        ttl.saturating_mul(4).saturating_add(timing.bound),
        THINK,
    );
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
        report
            .liveness
            .indeterminate
            .saturating_add(report.liveness.failed)
            >= 1,
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
    let timing = ctx.timing();
    let ttl = timing.short_ttl;
    let (case, linked) = proxied_holder(&ctx, THINK.saturating_mul(10)).await?;
    let ProxiedCase {
        target,
        proxy,
        run,
        names,
    } = &case;
    // It thinks for a while yet, then writes (the register is reached directly) and releases.
    proxy.set_mode(dlock_test_servers::ProxyMode::DropReplies);
    run.log(
        crate::history::Edge::Start,
        "drop the replies on worker 1's link, before its release",
    );
    // The next holder keeps the lock (renewing it) long enough for any retry to land.
    let mut next_spec = run.spec(
        2,
        names,
        1,
        ttl,
        ttl.saturating_mul(4).saturating_add(timing.bound),
        ttl.saturating_mul(2),
    );
    next_spec.announce = true;
    let mut next = run.spawn_via(&next_spec, &*target.harness)?;
    holding(&ctx, &mut next).await?;
    let third_spec = run.spec(
        3,
        names,
        1,
        ttl,
        ttl.saturating_mul(4).saturating_add(timing.bound),
        THINK,
    );
    let third = run.spawn_via(&third_spec, &*target.harness)?;
    ctx.within("the worker whose release reply is lost", linked.finish())
        .await??;
    proxy.heal();
    run.log(crate::history::Edge::Stop, "heal worker 1's link");
    each_held_once(&ctx, case, [next, third], &SURVIVED).await
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
        ttl.saturating_mul(3).checked_div(4).unwrap_or_default(),
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
    tokio::time::sleep(ttl.saturating_mul(3).checked_div(4).unwrap_or_default()).await;
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

/// A link case's deployment behind its fault proxies, its run and its one name.
struct ProxiedCase {
    target: crate::ProxyTarget,
    proxy: Link,
    run: Run,
    names: [LockName; 1],
}

/// Worker 1, reaching the server through fault proxies, once it holds the lock (it thinks for
/// `think` before its write).
async fn proxied_holder(
    ctx: &Ctx,
    think: Duration,
) -> Result<(ProxiedCase, WorkerProcess), Failure> {
    let (target, proxy) = proxied(ctx).await?;
    let run = Run::start(ctx).await?;
    let names = [ctx.name("lock")];
    let timing = ctx.timing();
    let mut spec = run.spec(1, &names, 1, timing.short_ttl, timing.bound, think);
    spec.announce = true;
    let mut holder = run.spawn_via(&spec, &*(target.reach_at)(&proxy.addrs()))?;
    holding(ctx, &mut holder).await?;
    let case = ProxiedCase {
        target,
        proxy,
        run,
        names,
    };
    Ok((case, holder))
}

/// The end of a case whose first worker has finished: the other `workers` finish, nothing is
/// left on the server, the history passes `expect`, and each of the three held the lock once.
async fn each_held_once(
    ctx: &Ctx,
    case: ProxiedCase,
    workers: [WorkerProcess; 2],
    expect: &Expect,
) -> CaseResult {
    let [next, third] = workers;
    ctx.within("the next holder", next.finish()).await??;
    ctx.within("the third worker", third.finish()).await??;
    let residue = ctx
        .settled_residue_on(&*case.target.harness, &case.names)
        .await?;
    let report = verify(&case.run, expect, &case.run.input(residue)?)?;
    ensure!(
        report.liveness.granted == 3,
        "expected each of the three workers to hold the lock once: {report}"
    );
    case.run.discard();
    Ok(())
}
