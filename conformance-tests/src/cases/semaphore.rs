//! Semaphores: at most N holders, permits that come back, releases that add nothing, limits
//! refused before the network. Ported in dlock's words from the peers' own semaphore tests
//! (madelson's `DistributedSemaphoreCoreTestCases`, Curator's `TestInterProcessSemaphore`,
//! Redisson's `RedissonSemaphoreTest`), and from the bugs their users met: a crashed holder's
//! permit kept forever (Redisson #4462), a double release that adds a permit (Redisson #5066),
//! a non-blocking acquire past the maximum (kazoo #213).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_api::{LockError, LockOptions, Renewal};

use crate::{CaseResult, Ctx, Failure, ensure};

/// The number of permits the cases use.
const PERMITS: u32 = 3;

/// Permits are taken up to the limit and no further: the next `try` gets `None` at once, and a
/// release lets exactly one more in (madelson `TestMaxCount`, kazoo #213).
pub async fn try_beyond_the_limit_returns_none(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("sem");
    let opts = LockOptions::new();
    let mut held = Vec::new();
    for i in 0..PERMITS {
        let client = if i % 2 == 0 { &a } else { &b };
        let permit = client.try_acquire_permit(&name, PERMITS, &opts).await?;
        held.push(permit.ok_or_else(|| {
            Failure(format!(
                "permit {} of {PERMITS} was refused",
                i.saturating_add(1)
            ))
        })?);
    }
    let beyond = b.try_acquire_permit(&name, PERMITS, &opts).await?;
    ensure!(
        beyond.is_none(),
        "a permit beyond the {PERMITS} was granted"
    );
    let count = a.count_permits(&name).await?;
    ensure!(count == PERMITS, "count says {count}, {PERMITS} are held");
    if let Some(permit) = held.pop() {
        permit.release().await?;
    }
    let again = b.try_acquire_permit(&name, PERMITS, &opts).await?;
    let again = again.ok_or_else(|| Failure("a released permit was not free again".into()))?;
    let count = a.count_permits(&name).await?;
    ensure!(count == PERMITS, "count says {count}, {PERMITS} are held");
    again.release().await?;
    for permit in held {
        permit.release().await?;
    }
    Ok(())
}

/// Many tasks over several clients, each waiting for a permit: never more than N hold at once,
/// every task gets one in the end, and the tokens of the grants are all different
/// (Curator `testThreads`, Redisson `testConcurrency_MultiInstance`).
pub async fn at_most_n_hold_at_once(ctx: Ctx) -> CaseResult {
    const TASKS: u32 = 12;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ctx.client().await?);
    }
    let name = ctx.name("sem");
    let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let client = clients[(t as usize).checked_rem(clients.len()).unwrap_or(0)].clone();
        let (name, opts) = (name.clone(), opts.clone());
        let (holding, most) = (holding.clone(), most.clone());
        tasks.spawn(async move {
            let permit = client.acquire_permit(&name, PERMITS, &opts).await?;
            let now = holding.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            most.fetch_max(now, Ordering::SeqCst);
            // Long enough for the others to pile up behind the limit.
            tokio::time::sleep(Duration::from_millis(5)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            let token = permit.fencing_token();
            permit.release().await?;
            Ok::<_, LockError>(token)
        });
    }
    let mut tokens = Vec::new();
    for result in ctx
        .join_all("every task to get and give back a permit", tasks)
        .await?
    {
        tokens.push(result?);
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(most <= PERMITS, "{most} held at once, {PERMITS} permits");
    let fenced = ctx.client().await?.capabilities().fencing != dlock_api::Fencing::None;
    if fenced {
        let mut distinct = tokens.clone();
        distinct.sort();
        distinct.dedup();
        ensure!(
            distinct.len() == tokens.len(),
            "two grants shared a fencing token: {tokens:?}"
        );
    }
    let count = clients[0].count_permits(&name).await?;
    ensure!(
        count == 0,
        "count says {count} after every permit went back"
    );
    Ok(())
}

/// A waiter beyond the limit is woken by one release, not by a poll (Curator
/// `testReleaseInChunks`, madelson `TestSemaphoreWaitsForRelease`).
pub async fn release_wakes_one_waiter(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("sem");
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        held.push(
            a.try_acquire_permit(&name, PERMITS, &long)
                .await?
                .ok_or_else(|| Failure("a free permit was refused".into()))?,
        );
    }
    let waiting = {
        let (b, name) = (b.clone(), name.clone());
        let opts = long.clone().with_wait_timeout(ctx.timing().bound);
        tokio::spawn(async move { b.acquire_permit(&name, PERMITS, &opts).await })
    };
    if let Some(permit) = held.pop() {
        permit.release().await?;
    }
    let permit = ctx
        .within("the waiter after one release", waiting)
        .await?
        .map_err(|e| Failure(format!("the waiter task panicked: {e}")))??;
    let count = a.count_permits(&name).await?;
    ensure!(count == PERMITS, "count says {count}, {PERMITS} are held");
    permit.release().await?;
    for permit in held {
        permit.release().await?;
    }
    Ok(())
}

/// A holder that vanishes without releasing (a crash: its guard forgotten, its renewal gone)
/// gives its permit back when its lease ends (Redisson #4462, #2045: a bare counter keeps it
/// forever).
pub async fn forgotten_permit_comes_back(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("sem");
    let short = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::auto());
    for _ in 0..PERMITS {
        a.acquire_permit(&name, PERMITS, &short).await?.forget();
    }
    let busy = b
        .try_acquire_permit(&name, PERMITS, &LockOptions::new())
        .await?;
    ensure!(
        busy.is_none(),
        "a forgotten permit was free before its lease ended"
    );
    let timing = ctx.timing();
    let wait = LockOptions::new().with_wait_timeout(
        timing
            .short_ttl
            .saturating_add(timing.bound.checked_div(2).unwrap_or_default()),
    );
    let permit = b.acquire_permit(&name, PERMITS, &wait).await.map_err(|e| {
        Failure(format!(
            "no forgotten permit came back within half the bound after its {:?} lease: {e}",
            timing.short_ttl
        ))
    })?;
    permit.release().await?;
    Ok(())
}

/// A permit whose lease ended cannot be given back a second time: its release says `NotHeld`
/// and adds nothing, so the semaphore never lets N + 1 in (Redisson #5066).
pub async fn stale_release_adds_nothing(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("sem");
    let short = LockOptions::new()
        .with_ttl(ctx.timing().short_ttl)
        .with_renewal(Renewal::Off);
    let stale = a.acquire_permit(&name, PERMITS, &short).await?;
    ctx.within("the unrenewed permit's lease to end", stale.lost())
        .await?;
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    // A server may free an ended lease a little after its holder saw it end (etcd's sweep):
    // the permits are waited for, as a lock's new holder is.
    let waiting = long.clone().with_wait_timeout(ctx.timing().bound);
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        held.push(
            b.acquire_permit(&name, PERMITS, &waiting)
                .await
                .map_err(|e| Failure(format!("an expired permit still counted: {e}")))?,
        );
    }
    let released = stale.release().await;
    ensure!(
        matches!(
            released,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "the release of an expired permit answered {released:?}, not NotHeld or Lost"
    );
    let beyond = a.try_acquire_permit(&name, PERMITS, &long).await?;
    ensure!(
        beyond.is_none(),
        "after a stale release, a permit beyond the {PERMITS} was granted"
    );
    for permit in held {
        permit.release().await?;
    }
    Ok(())
}

/// Each permit's fencing token is above every earlier grant's of the name.
pub async fn tokens_rise(ctx: Ctx) -> CaseResult {
    let a = ctx.client().await?;
    let name = ctx.name("sem");
    let opts = LockOptions::new();
    let mut last = None;
    for _ in 0..2 {
        let mut held = Vec::new();
        for _ in 0..PERMITS {
            let permit = a
                .try_acquire_permit(&name, PERMITS, &opts)
                .await?
                .ok_or_else(|| Failure("a free permit was refused".into()))?;
            let token = permit.fencing_token();
            ensure!(
                last.is_none_or(|last| token > last),
                "token {token:?} after {last:?}"
            );
            last = Some(token);
            held.push(permit);
        }
        for permit in held {
            permit.release().await?;
        }
    }
    Ok(())
}

/// No permits, more than the backend keeps, or another number than the name is in use with
/// (a lock being a semaphore of one): refused with `InvalidArgument` before any network call,
/// and nothing taken. Where the server keeps no limit per name
/// (`Capabilities::one_limit_per_name` false), another number and the name's lock are other
/// semaphores, as documented: granted beside the permit, each keeping its own count.
pub async fn bad_limits_refused(ctx: Ctx) -> CaseResult {
    let a = ctx.client().await?;
    let name = ctx.name("sem");
    let opts = LockOptions::new();
    let zero = a.try_acquire_permit(&name, 0, &opts).await;
    ensure!(
        matches!(zero, Err(LockError::InvalidArgument { .. })),
        "0 permits answered {zero:?}"
    );
    let max = a.capabilities().max_permits;
    if let Some(beyond) = max.checked_add(1) {
        let got = a.acquire_permit(&name, beyond, &opts).await;
        ensure!(
            matches!(got, Err(LockError::InvalidArgument { .. })),
            "{beyond} permits (the backend keeps {max}) answered {got:?}"
        );
    }
    let held = a
        .try_acquire_permit(&name, PERMITS, &opts)
        .await?
        .ok_or_else(|| Failure("a free permit was refused".into()))?;
    if a.capabilities().one_limit_per_name {
        other_limits_refused(a.as_ref(), &name, &opts).await?;
    } else {
        other_limits_apart(a.as_ref(), &name, &opts).await?;
    }
    held.release().await?;
    let count = a.count_permits(&name).await?;
    ensure!(
        count == 0,
        "count says {count} after the only permit went back"
    );
    Ok(())
}

/// Another number, and a lock, on a name held with [`PERMITS`]: refused, naming both numbers.
async fn other_limits_refused(
    a: &dyn dlock_api::DistributedLock,
    name: &dlock_api::LockName,
    opts: &LockOptions,
) -> CaseResult {
    let more = PERMITS.saturating_add(1);
    let other = a.try_acquire_permit(name, more, opts).await;
    match &other {
        Err(LockError::InvalidArgument { reason, .. })
            if reason.contains(&PERMITS.to_string()) && reason.contains(&more.to_string()) => {}
        _ => {
            return Err(Failure(format!(
                "{more} permits on a name in use with {PERMITS} answered {other:?}, not an \
                 InvalidArgument naming both"
            )));
        }
    }
    let as_lock = a.try_acquire(name, opts).await;
    ensure!(
        matches!(as_lock, Err(LockError::InvalidArgument { .. })),
        "a lock on a name in use as a semaphore of {PERMITS} answered {as_lock:?}"
    );
    Ok(())
}

/// Another number, and a lock, on a name held with [`PERMITS`], where a semaphore is its name
/// and its number: each is granted as a semaphore of its own, and the count of the name is the
/// sum of its semaphores' permits.
async fn other_limits_apart(
    a: &dyn dlock_api::DistributedLock,
    name: &dlock_api::LockName,
    opts: &LockOptions,
) -> CaseResult {
    let more = PERMITS.saturating_add(1);
    let other = a
        .try_acquire_permit(name, more, opts)
        .await?
        .ok_or_else(|| Failure(format!("{more} permits, a semaphore of its own, refused")))?;
    let as_lock = a
        .try_acquire(name, opts)
        .await?
        .ok_or_else(|| Failure("the name's lock, apart from its semaphores, refused".into()))?;
    let count = a.count_permits(name).await?;
    ensure!(
        count == 2,
        "count says {count} with one permit of {PERMITS} and one of {more} held"
    );
    as_lock.release().await?;
    other.release().await?;
    Ok(())
}

/// Waits for permits cut short at every point (wait timeouts, timeouts around the call, aborted
/// tasks) leave no permit held: the count is 0 and all N are free after (Curator
/// CURATOR-315/462: orphan lease nodes after an interrupt).
pub async fn cancel_storm_leaves_count_zero(ctx: Ctx) -> CaseResult {
    const TASKS: usize = 30;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ctx.client().await?);
    }
    let name = ctx.name("sem");
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    let clients_ref = &clients;
    super::cancel::cut_short_round(&ctx, TASKS, &long, |t, opts, hold| {
        let client = clients_ref[t.checked_rem(clients_ref.len()).unwrap_or(0)].clone();
        let name = name.clone();
        async move {
            let permit = client.acquire_permit(&name, PERMITS, &opts).await?;
            tokio::time::sleep(hold).await;
            permit.release().await
        }
    })
    .await?;
    let fresh = ctx.client().await?;
    ctx.until("every cut-short permit to come back (count 0)", || async {
        Ok(fresh.count_permits(&name).await? == 0)
    })
    .await?;
    let mut held = Vec::new();
    for _ in 0..PERMITS {
        held.push(
            fresh
                .try_acquire_permit(&name, PERMITS, &long)
                .await?
                .ok_or_else(|| Failure("a permit stayed taken after the storm".into()))?,
        );
    }
    for permit in held {
        permit.release().await?;
    }
    Ok(())
}
