//! What the fault cases share: the pauses they give workers, reading a worker's announcements,
//! checking a history, and reaching the harness's own server or a proxied deployment.

use std::time::Duration;

use crate::history::{Count, Expect, Input, Report};
use crate::nemesis::link::Link;
use crate::nemesis::{Run, WorkerProcess};
use crate::{Ctx, Failure, ensure};

/// How long a worker behind a fault proxy waits, once connected, before it asks for the lock.
pub(super) const READY_PAUSE: Duration = Duration::from_millis(500);

/// The longest a worker thinks between reading and writing the register.
pub(super) const THINK: Duration = Duration::from_millis(20);

/// Checks `input` against `expect`; on failure the run is dumped and its path named.
pub(in crate::cases) fn verify(
    run: &Run,
    expect: &Expect,
    input: &Input,
) -> Result<Report, Failure> {
    let report = expect.verify(input, &run.dir).map_err(Failure)?;
    // A passing verdict is worth reading too: how late lost signals came, how soon the lock
    // came back after each fault, what fencing refused.
    eprintln!("{}: the checker reports:\n{report}", run.id);
    Ok(report)
}

/// The next line of a worker in announce mode that starts with `what` (`holding`,
/// `acquiring`), without it.
pub(in crate::cases) async fn announced(
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
pub(super) async fn holding(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<u64, Failure> {
    let rest = announced(ctx, worker, "holding ").await?;
    rest.split_whitespace()
        .nth(1)
        .and_then(|token| token.parse().ok())
        .ok_or_else(|| Failure(format!("the worker said holding {rest:?}")))
}

/// A case's own server, or the reason the harness cannot give one.
pub(crate) async fn own_server(ctx: &Ctx) -> Result<crate::OwnServer, Failure> {
    ctx.require_faults()?.own_server().await.map_err(Failure)
}

/// A deployment to reach through fault proxies, and the link of proxies in front of it.
pub(super) async fn proxied(ctx: &Ctx) -> Result<(crate::ProxyTarget, Link), Failure> {
    let target = ctx
        .require_faults()?
        .proxy_target()
        .await
        .map_err(Failure)?;
    let link = Link::start(&target.upstreams)?;
    Ok((target, link))
}

/// Waits for the `ready` line of a worker started with a ready pause.
pub(super) async fn ready(ctx: &Ctx, worker: &mut WorkerProcess) -> Result<(), Failure> {
    let line = ctx
        .within("a worker to connect", worker.next_line())
        .await??;
    ensure!(
        line.as_deref() == Some("ready"),
        "the worker said {line:?} instead of ready"
    );
    Ok(())
}

/// The profile of a link fault: nothing unsafe and nothing left, whatever the timing made of
/// refusals.
pub(super) const SURVIVED: Expect = Expect {
    stale_attempts: Count::Any,
    ..Expect::FENCED_FAULT
};
