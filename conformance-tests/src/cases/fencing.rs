//! Fencing tokens rise with every acquire, and a fencing gate refuses a stale holder's write.

use dlock_api::{FencingGate, LockError, LockOptions, Renewal};

use crate::{CaseResult, Ctx, Failure, ensure};

/// Tokens strictly increase across acquires and across clients.
pub async fn tokens_strictly_increase(ctx: Ctx) -> CaseResult {
    let clients = [ctx.client().await?, ctx.client().await?];
    let name = ctx.name("lock");
    let mut last = None;
    for i in 0..10 {
        let guard = clients[i % 2].acquire(&name, &LockOptions::new()).await?;
        let token = guard.fencing_token();
        if let Some(last) = last {
            ensure!(token > last, "token {token} after {last}");
        }
        last = Some(token);
        guard.release().await?;
    }
    Ok(())
}

/// The GC-pause scenario: A's lease ends while it is paused, B acquires and writes; A's
/// late write carries an older token and the gate refuses it.
pub async fn stale_write_rejected_by_gate(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("lock");
    let gate = FencingGate::new();
    let short = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::Off);
    let paused = a.acquire(&name, &short).await?;
    // "GC pause": A does nothing until its lease is gone.
    ctx.within("A's lease to end", paused.lost()).await?;
    let fresh = b
        .acquire(
            &name,
            &LockOptions::new().with_wait_timeout(ctx.timing().bound),
        )
        .await?;
    gate.admit(name.as_str(), fresh.fencing_token())?;
    let late = gate.admit(name.as_str(), paused.fencing_token());
    ensure!(
        matches!(late, Err(LockError::Fenced { .. })),
        "the stale write was admitted: {late:?}"
    );
    fresh.release().await?;
    let _ = paused.release().await;
    Ok::<(), Failure>(())
}
