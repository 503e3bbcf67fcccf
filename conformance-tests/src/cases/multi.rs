//! Several locks at once: one order for every caller, one wait for the set, nothing left held
//! by a set that cannot be completed. Ported in dlock's words from Redisson's
//! `RedissonMultiLockTest` (opposite orders, redisson/redisson #1160) and Curator's
//! `TestInterProcessMultiMutex` (a set that fails part-way releases what it took).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::{
    Capabilities, DistributedLock, DistributedLockExt, LockError, LockGuard, LockName, LockOptions,
};

use crate::{CaseResult, Ctx, Failure, ensure};

/// Two clients take the same two names in opposite orders, round after round, at once: every
/// round finishes (no deadlock), the two sets never hold together, and each member carries its
/// own name's token.
pub async fn opposite_orders_finish(ctx: Ctx) -> CaseResult {
    const ROUNDS: usize = 10;
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let (x, y) = (ctx.name("x"), ctx.name("y"));
    let holding = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for (client, names) in [(a, [x.clone(), y.clone()]), (b, [y.clone(), x.clone()])] {
        let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound);
        let holding = holding.clone();
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let set = client.acquire_all(&names, &opts).await?;
                let at_once = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
                holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let order: Vec<&LockName> = set.names().collect();
                let sorted = order.windows(2).all(|w| w[0] < w[1]);
                set.release().await?;
                if at_once > 0 || !sorted {
                    return Ok::<_, LockError>(false);
                }
            }
            Ok(true)
        });
    }
    for result in ctx.join_all("both clients' rounds", tasks).await? {
        ensure!(
            result?,
            "two sets over the same names held at once, or a set was taken out of order"
        );
    }
    Ok(())
}

/// A set waits **once**, for the options' wait timeout, not once per member (Curator's
/// multi-lock gives each member the whole wait): a member taken after a wait leaves the next
/// member only what is left of the set's wait. Checked on the waits the set hands its members,
/// not on a clock.
pub async fn one_wait_for_the_set(ctx: Ctx) -> CaseResult {
    /// The least the set spends waiting for its first member: the holder lets go this long
    /// after the set queued.
    const HELD_ON: Duration = Duration::from_millis(20);
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let (x, y) = (ctx.name("x"), ctx.name("y"));
    let held = a.acquire(&x, &LockOptions::new()).await?;
    let recorder = Arc::new(RecordsWaits {
        inner: b,
        waits: Mutex::default(),
    });
    let wait = ctx.timing().bound;
    let set = {
        let (recorder, names) = (recorder.clone(), [y.clone(), x.clone()]);
        let opts = LockOptions::new().with_wait_timeout(wait);
        tokio::spawn(async move { recorder.acquire_all(&names, &opts).await })
    };
    ctx.until_queued(&*a, &x).await?;
    // Scheduled, not measured: the set's wait for `x` lasts at least this.
    tokio::time::sleep(HELD_ON).await;
    held.release().await?;
    let set = ctx
        .within("the set once its first member was free", set)
        .await?
        .map_err(|e| Failure(format!("the set's task panicked: {e}")))??;
    set.release().await?;
    let waits = recorder
        .waits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let [(first, Some(first_wait)), (second, Some(second_wait))] = waits.as_slice() else {
        return Err(Failure(format!(
            "the set's members were asked with {waits:?}"
        )));
    };
    ensure!(
        *first == x && *second == y,
        "the set took {first} then {second}, not in the names' order"
    );
    ensure!(
        *first_wait <= wait,
        "the first member was given {first_wait:?} of a {wait:?} wait"
    );
    ensure!(
        second_wait.saturating_add(HELD_ON) <= *first_wait,
        "after waiting for its first member, the set gave the second {second_wait:?} of its \
         {wait:?} wait (the first had {first_wait:?})"
    );
    Ok(())
}

/// A client that records the wait timeout each acquire through it was given.
#[derive(Debug)]
struct RecordsWaits {
    inner: Arc<dyn DistributedLock>,
    waits: Mutex<Vec<(LockName, Option<Duration>)>>,
}

impl std::fmt::Display for RecordsWaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait::async_trait]
impl DistributedLock for RecordsWaits {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        options: &LockOptions,
    ) -> dlock_api::Result<Option<LockGuard>> {
        self.inner.try_acquire(name, options).await
    }

    async fn acquire(
        &self,
        name: &LockName,
        options: &LockOptions,
    ) -> dlock_api::Result<LockGuard> {
        self.waits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.clone(), options.wait_timeout()));
        self.inner.acquire(name, options).await
    }
}

/// A set that cannot be completed leaves nothing held: its `try` returns `None` and its wait a
/// `Timeout`, and every member it took before is free again at once.
pub async fn timeout_leaves_nothing_held(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let names = [ctx.name("a"), ctx.name("b"), ctx.name("c")];
    let last = a.acquire(&names[2], &LockOptions::new()).await?;
    let tried = b.try_acquire_all(&names, &LockOptions::new()).await?;
    ensure!(tried.is_none(), "a set with a held member was granted");
    let waited = b
        .acquire_all(
            &names,
            &LockOptions::new().with_wait_timeout(Duration::from_millis(50)),
        )
        .await;
    ensure!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "a set with a held member returned {waited:?}"
    );
    for name in &names[..2] {
        let free = a.try_acquire(name, &LockOptions::new()).await?;
        let free =
            free.ok_or_else(|| Failure(format!("{name} stayed held after its set failed")))?;
        free.release().await?;
    }
    last.release().await?;
    Ok(())
}

/// Sets dropped while they wait, or cut short at once, leave no member held and no waiter.
pub async fn dropped_acquire_all_leaves_nothing(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let names = [ctx.name("a"), ctx.name("b"), ctx.name("c")];
    let blocker = a.acquire(&names[1], &LockOptions::new()).await?;
    for delay_ms in [0u64, 1, 5, 20] {
        let _ = tokio::time::timeout(
            Duration::from_millis(delay_ms),
            b.acquire_all(
                &names,
                &LockOptions::new().with_wait_timeout(ctx.timing().bound),
            ),
        )
        .await;
    }
    blocker.release().await?;
    let set = ctx
        .within(
            "a set after the dropped ones",
            a.acquire_all(
                &names,
                &LockOptions::new().with_wait_timeout(ctx.timing().bound),
            ),
        )
        .await??;
    set.release().await?;
    Ok(())
}

/// A name given twice is taken once, and no names at all are refused before any network call.
pub async fn duplicates_taken_once_and_empty_refused(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let name = ctx.name("twice");
    let set = client
        .acquire_all(&[name.clone(), name.clone()], &LockOptions::new())
        .await?;
    ensure!(
        set.guards().len() == 1,
        "a name given twice was taken {} times",
        set.guards().len()
    );
    ensure!(
        set.fencing_token(&name).is_some(),
        "the set has no token for its name"
    );
    set.release().await?;
    let empty = client.acquire_all(&[], &LockOptions::new()).await;
    ensure!(
        matches!(empty, Err(LockError::InvalidArgument { .. })),
        "an empty set returned {empty:?}"
    );
    Ok(())
}

/// A member lost while the set is held loses the set: `with_locks` stops its work and says so.
pub async fn lost_member_loses_the_set(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let names = [ctx.name("a"), ctx.name("b")];
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let work = {
        let (client, names, started) = (client.clone(), names.clone(), started.clone());
        let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound);
        tokio::spawn(async move {
            client
                .with_locks(&names, &opts, |_tokens| async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                })
                .await
        })
    };
    ctx.within("the set's work to start", started.notified())
        .await?;
    ctx.require_faults()?
        .kill_holder(&names[1])
        .await
        .map_err(Failure)?;
    let ended = ctx
        .within("with_locks after a member was killed", work)
        .await?
        .map_err(|e| Failure(format!("the set's task panicked: {e}")))?;
    ensure!(
        matches!(ended, Err(LockError::Lost { .. })),
        "with_locks returned {ended:?} after a member was lost"
    );
    Ok(())
}

/// A free set taken by `try_acquire_all` (in one step of the server where the backend has one)
/// is made of single locks: each member excludes others and carries a token above its name's
/// last, a waiter queued on a member is woken by the set's release, and each name's next holder
/// gets a higher token.
pub async fn members_taken_together_are_single_locks(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let names = [ctx.name("a"), ctx.name("b"), ctx.name("c")];
    let before = a.acquire(&names[0], &LockOptions::new()).await?;
    let earlier = before.fencing_token();
    before.release().await?;
    // A lease far longer than the bound: only the set's release lets the waiter in.
    let long = LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4));
    let set = b
        .try_acquire_all(&names, &long)
        .await?
        .ok_or_else(|| Failure("a free set was not granted".into()))?;
    ensure!(set.is_held(), "a set just taken is not held");
    let first = set.fencing_token(&names[0]);
    ensure!(
        first.is_some_and(|token| token > earlier),
        "the set's token for {} is {first:?}, not above the single lock's {earlier}",
        names[0]
    );
    let waiter = {
        let name = names[1].clone();
        let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound);
        tokio::spawn(async move { c.acquire(&name, &opts).await })
    };
    for name in &names {
        let other = a.try_acquire(name, &LockOptions::new()).await?;
        ensure!(other.is_none(), "{name} was granted while its set held it");
    }
    let tokens = set.fencing_tokens();
    set.release().await?;
    let next = ctx
        .within("the waiter on a member after the set's release", waiter)
        .await?
        .map_err(|e| Failure(format!("the waiter's task panicked: {e}")))??;
    let released = tokens.iter().find(|(name, _)| *name == names[1]);
    ensure!(
        released.is_some_and(|(_, token)| next.fencing_token() > *token),
        "the waiter's token {} is not above the set's {released:?}",
        next.fencing_token()
    );
    next.release().await?;
    for name in [&names[0], &names[2]] {
        let again = a
            .try_acquire(name, &LockOptions::new())
            .await?
            .ok_or_else(|| Failure(format!("{name} stayed held after its set's release")))?;
        again.release().await?;
    }
    Ok(())
}

/// A member whose hold ends does not keep the others held (Curator's `testSomeReleasesFail`,
/// ported): the server ends the hold of one member of a held set (killed as
/// `killed_session_client_acquires_again` kills it). The set reads lost, its release reports the
/// failure, and every member is free at once for another client: those the release freed, and
/// the killed one (and any member that shared its session).
pub async fn failed_member_release_frees_the_rest(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let names = [ctx.name("a"), ctx.name("b"), ctx.name("c")];
    // A TTL lease short enough that the killed member's loss is seen within the bound.
    let hold = super::lost::killable_hold(&ctx, &*a).with_wait_timeout(ctx.timing().bound);
    let set = a.acquire_all(&names, &hold).await?;
    ctx.require_faults()?
        .kill_holder(&names[1])
        .await
        .map_err(Failure)?;
    ctx.within("the set's loss after a member was killed", set.lost())
        .await?;
    let released = set.release().await;
    ensure!(
        released.is_err(),
        "the release of a set with a killed member succeeded"
    );
    for name in &names {
        let free = b.try_acquire(name, &LockOptions::new()).await?;
        let free =
            free.ok_or_else(|| Failure(format!("{name} stayed held after its set's release")))?;
        free.release().await?;
    }
    Ok(())
}

/// A member that fails to lock gives back the members taken before it (Curator's
/// `testSomeLocksFailToLock`, ported): the set's last name is in use as a semaphore of two
/// permits, which a lock's acquire refuses with an error rather than a wait. The set answers that
/// error at once, and the names before it are free for another client.
pub async fn refused_member_frees_the_taken_ones(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let names = [ctx.name("a"), ctx.name("b"), ctx.name("z")];
    let permit = b
        .try_acquire_permit(&names[2], 2, &LockOptions::new())
        .await?
        .ok_or_else(|| Failure("a free semaphore refused its first permit".into()))?;
    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let refused = ctx
        .within(
            "a set with a semaphore's name",
            a.acquire_all(&names, &wait),
        )
        .await?;
    ensure!(
        matches!(refused, Err(LockError::InvalidArgument { .. })),
        "a set whose member is a semaphore's name returned {refused:?}"
    );
    for name in &names[..2] {
        let free = b.try_acquire(name, &LockOptions::new()).await?;
        let free =
            free.ok_or_else(|| Failure(format!("{name} stayed held after its set was refused")))?;
        free.release().await?;
    }
    permit.release().await?;
    Ok(())
}
