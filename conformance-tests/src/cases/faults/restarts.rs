//! Faults done to the server process: restarted cleanly or after a crash, frozen, killed.

use std::time::Duration;

use dlock_api::LockName;

use super::steps::{SURVIVED, THINK, holding, own_server, verify};
use crate::nemesis::Run;
use crate::{CaseResult, Ctx, Failure, ensure};

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

/// `client`'s acquire of `name` with `options`, within the case's bound, asked again while
/// the answer is retryable (a restarted server not answering yet, a stale connection).
pub(crate) async fn acquire_riding_out(
    ctx: &Ctx,
    client: &dyn dlock_api::DistributedLock,
    name: &LockName,
    options: &dlock_api::LockOptions,
) -> Result<dlock_api::LockGuard, Failure> {
    // The answers while it retries: a timeout says which it kept getting, or that the acquire
    // itself never returned.
    let answers = std::sync::Mutex::new((0_u32, None::<dlock_api::LockError>));
    let riding = ctx.within("the same client's lock after the restart", async {
        loop {
            match client.acquire(name, options).await {
                Ok(guard) => return Ok(guard),
                Err(e) if e.is_retryable() => {
                    if let Ok(mut answers) = answers.lock() {
                        answers.0 = answers.0.saturating_add(1);
                        answers.1 = Some(e);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(Failure::from(e)),
            }
        }
    });
    match riding.await {
        Ok(outcome) => outcome,
        Err(Failure(timed_out)) => {
            let (count, last) = answers.into_inner().unwrap_or_default();
            Err(Failure(format!(
                "{timed_out}, after {count} retryable answers, the last {last:?}"
            )))
        }
    }
}

/// Stops the case's own server (with `SIGKILL` when `crash`, else cleanly) and starts it again.
pub(crate) fn restart(own: &crate::OwnServer, crash: bool) -> Result<(), Failure> {
    if crash {
        own.process.kill();
    }
    let process = &own.process;
    tokio::task::block_in_place(|| process.restart())
        .map_err(|e| Failure(format!("the server did not come back: {e}")))
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
        restart(&own, crash)?;
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
    let acquire_again = || acquire_riding_out(&ctx, &*client, &name, &wait);
    let mut last = 0;
    for crash in [false, true] {
        let guard = acquire_again().await?;
        let token = guard.fencing_token().get();
        ensure!(token > last, "token {token} after {last} (crash: {crash})");
        last = token;
        restart(&own, crash)?;
        // A lost hold must be reported within two lease TTLs (a renewal finds it gone); one
        // kept that long survived the restart. A session lease may still be suspended then
        // (reconnecting, checking its nodes): wait, within the bound, until it is one or the
        // other.
        let mut lost = tokio::time::timeout(timing.short_ttl.saturating_mul(2), guard.lost()).await;
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
    let mut holder_spec = run.spec(1, &names, 1, ttl, timing.bound, ttl.saturating_mul(4));
    holder_spec.announce = true;
    let mut holder = run.spawn_via(&holder_spec, &*own.harness)?;
    holding(&ctx, &mut holder).await?;
    let other_spec = run.spec(
        2,
        &names,
        2,
        ttl,
        ttl.saturating_mul(6).saturating_add(timing.bound),
        THINK,
    );
    let other = run.spawn_via(&other_spec, &*own.harness)?;
    own.process.pause();
    run.log(crate::history::Edge::Start, "freeze the server");
    // The freeze's length is what is under test.
    tokio::time::sleep(ttl.saturating_mul(3)).await;
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
