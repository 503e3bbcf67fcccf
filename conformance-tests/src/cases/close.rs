//! Closing a client: a service that stops frees its locks at once instead of leaving them until
//! their leases run out (palantir/atlasdb #3162, #1816), ends its waits, and says which names it
//! could not free when the server does not answer.

use std::time::Duration;

use dlock_api::{
    DistributedLockExt, LeaseKind, LockError, LockName, LockOptions, LockStatus, LostReason,
};

use crate::wait_for::spawned_acquire;
use crate::{CaseResult, Ctx, Failure, ensure};

/// **`close` frees every name at once**: a client holding two locks (and a permit and a
/// reader's share where the backend has them), running work under a third in `with_lock`, and
/// waiting for a name another client holds, is closed. The other client's waiter gets the
/// first name within the case's bound, though the leases were asked for twice that long; the
/// closed client's wait ends with `Closed`, its work is stopped with `Lost(ClientClosed)`, its
/// guards read lost and their releases say so without touching the new holder; every later
/// call answers `Closed`; closing again is clean.
pub async fn frees_every_name_at_once(ctx: Ctx) -> CaseResult {
    let (closing, other) = (ctx.client().await?, ctx.client().await?);
    let caps = closing.capabilities();
    let bound = ctx.timing().bound;
    // Longer than the bound: a name the waiter gets within it was freed by close, not expiry.
    let long = match caps.lease {
        LeaseKind::Ttl => {
            let ttl = bound.saturating_mul(2);
            LockOptions::new().with_ttl(caps.max_ttl.map_or(ttl, |max| ttl.min(max)))
        }
        _ => LockOptions::new(),
    };
    let [first, second, worked, theirs, permits, shared] =
        ["first", "second", "worked", "theirs", "permits", "shared"].map(|n| ctx.name(n));
    let held = [
        closing.acquire(&first, &long).await?,
        closing.acquire(&second, &long).await?,
    ];
    let permit = match caps.max_permits {
        0 => None,
        _ => Some(closing.acquire_permit(&permits, 2, &long).await?),
    };
    let share = match caps.reader_writer {
        true => Some(closing.read(&shared, &long).await?),
        false => None,
    };
    let (work_started, started) = tokio::sync::oneshot::channel();
    let work = {
        let (closing, worked, long) = (closing.clone(), worked.clone(), long.clone());
        tokio::spawn(async move {
            closing
                .with_lock(worked.as_str(), &long, |_token| async move {
                    let _ = work_started.send(());
                    std::future::pending::<()>().await
                })
                .await
        })
    };
    ctx.within("the work under with_lock to start", started)
        .await?
        .map_err(|_| Failure("the work under with_lock never started".into()))?;
    let blocker = other.acquire(&theirs, &LockOptions::new()).await?;
    let closing_waits = spawned_acquire(bound, &closing, &theirs);
    let other_waits = spawned_acquire(bound, &other, &first);
    ctx.until_queued(&*other, &first).await?;
    ctx.until_queued(&*other, &theirs).await?;

    let report = ctx.within("close", closing.close(bound)).await??;
    ensure!(report.is_clean(), "close left {:?} held", report.unreleased);

    let next = ctx
        .within("the waiter on a closed client's name", other_waits)
        .await?
        .map_err(|e| Failure(format!("the waiter's task: {e}")))??;
    let waited = ctx
        .within("the closed client's wait", closing_waits)
        .await?
        .map_err(|e| Failure(format!("the closed client's waiting task: {e}")))?;
    ensure!(
        matches!(waited, Err(LockError::Closed { .. })),
        "a wait on a closed client ended with {:?}, not Closed",
        waited.map(|g| g.fencing_token())
    );
    let worked_out = ctx
        .within("with_lock's work to stop", work)
        .await?
        .map_err(|e| Failure(format!("the with_lock task: {e}")))?;
    ensure!(
        matches!(
            worked_out,
            Err(LockError::Lost {
                reason: LostReason::ClientClosed,
                ..
            })
        ),
        "with_lock on a closed client ended with {worked_out:?}"
    );
    for name in [&second, &worked] {
        ensure!(
            other
                .try_acquire(name, &LockOptions::new())
                .await?
                .is_some(),
            "`{name}` still taken after close"
        );
    }
    if permit.is_some() {
        ensure!(
            other.count_permits(&permits).await? == 0,
            "a permit still counted after close"
        );
    }
    if share.is_some() {
        ensure!(
            other
                .try_acquire(&shared, &LockOptions::new())
                .await?
                .is_some(),
            "a reader's share kept the writer out after close"
        );
    }
    for guard in held.into_iter().chain(permit).chain(share) {
        ensure!(
            guard.status() == LockStatus::Lost(LostReason::ClientClosed),
            "`{}` reads {:?} after close",
            guard.name(),
            guard.status()
        );
        let released = guard.release().await;
        ensure!(
            matches!(
                released,
                Err(LockError::Lost {
                    reason: LostReason::ClientClosed,
                    ..
                })
            ),
            "release after close: {released:?}"
        );
    }
    ensure!(
        other
            .try_acquire(&first, &LockOptions::new())
            .await?
            .is_none(),
        "a closed client's release freed the next holder's lock"
    );
    refuses_everything(&closing, &first).await?;
    let again = ctx.within("close again", closing.close(bound)).await??;
    ensure!(again.is_clean(), "a second close reported {again:?}");
    next.release().await?;
    blocker.release().await?;
    Ok(())
}

/// Every call on a closed client answers `Closed`, before any network call.
async fn refuses_everything(
    closing: &std::sync::Arc<dyn dlock_api::DistributedLock>,
    name: &LockName,
) -> CaseResult {
    let closed = |what: &str, got: Option<LockError>| match got {
        Some(LockError::Closed { .. }) => Ok(()),
        other => Err(Failure(format!(
            "{what} on a closed client: {other:?}, not Closed"
        ))),
    };
    let options = LockOptions::new();
    closed(
        "try_acquire",
        closing.try_acquire(name, &options).await.err(),
    )?;
    closed("acquire", closing.acquire(name, &options).await.err())?;
    closed(
        "acquire_all",
        closing
            .acquire_all(std::slice::from_ref(name), &options)
            .await
            .err(),
    )?;
    Ok(())
}

/// **`close` with the server frozen** (`SIGSTOP`) returns by its deadline, naming the locks
/// whose release the server did not confirm, instead of hanging; once the server thaws, the
/// names are free again (released late, or ended with their lease or session).
pub async fn frozen_server_reports_what_it_could_not_release(ctx: Ctx) -> CaseResult {
    let own = ctx.require_faults()?.own_server().await.map_err(Failure)?;
    let timing = ctx.timing();
    let client = own.harness.client().await?;
    let caps = client.capabilities();
    let options = match caps.lease {
        LeaseKind::Ttl => LockOptions::new().with_ttl(timing.short_ttl),
        _ => LockOptions::new(),
    };
    let names = [ctx.name("one"), ctx.name("two")];
    let mut held = Vec::new();
    for name in &names {
        held.push(client.acquire(name, &options).await?);
    }
    own.process.pause();
    let closed = ctx
        .within(
            "close on a frozen server",
            client.close(Duration::from_secs(1)),
        )
        .await;
    own.process.resume();
    let report = closed??;
    ensure!(
        report.unreleased == names,
        "close on a frozen server reported {:?} unreleased, not {names:?}",
        report.unreleased
    );
    for guard in &held {
        ensure!(
            guard.status() == LockStatus::Lost(LostReason::ClientClosed),
            "`{}` reads {:?} after close",
            guard.name(),
            guard.status()
        );
    }
    let other = own.harness.client().await?;
    let wait =
        LockOptions::new().with_wait_timeout(timing.crash_bound.saturating_add(timing.bound));
    for name in &names {
        ctx.within_for(
            "a name left by a close on a frozen server to be free again",
            timing.crash_bound.saturating_add(timing.bound),
            other.acquire(name, &wait),
        )
        .await??
        .release()
        .await?;
    }
    drop(held);
    Ok(())
}
