//! Bounded waits for a backend's own tests: wait on an event, fail loudly at a generous bound,
//! never sleep in its place.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! let answer = dlock_conformance::wait_for::within(Duration::from_secs(5), "the answer", async { 42 }).await;
//! assert_eq!(answer, 42);
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

/// Awaits `future`, panicking with `what` if it takes longer than `bound`.
///
/// # Panics
/// When `bound` passes first: the event the test waits for did not happen.
pub async fn within<T>(bound: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after {bound:?}"))
}

/// The next event of an observer's `stream`
/// ([`DistributedLock::observe`](dlock_api::DistributedLock::observe)) that `wanted` accepts,
/// within `bound`, with every item that came before it (an error as its text).
///
/// # Panics
/// When `bound` passes first, or the stream ends.
pub async fn next_leader_event(
    bound: Duration,
    what: &str,
    stream: &mut dlock_api::LeaderStream,
    mut wanted: impl FnMut(&dlock_api::LeaderEvent) -> bool,
) -> (
    dlock_api::LeaderEvent,
    Vec<Result<dlock_api::LeaderEvent, String>>,
) {
    use futures::StreamExt;
    within(bound, what, async {
        let mut seen = Vec::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) if wanted(&event) => return (event, seen),
                Ok(event) => seen.push(Ok(event)),
                Err(error) => seen.push(Err(error.to_string())),
            }
        }
        panic!("{what}: the observer's stream ended after {seen:?}");
    })
    .await
}

/// Waits until `check` holds, looking every 20 ms, panicking with `what` after `bound`.
///
/// # Panics
/// When `bound` passes first.
pub async fn until(bound: Duration, what: &str, mut check: impl FnMut() -> bool) {
    within(bound, what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Releases `held` and waits (up to `bound`) for `waiter`, a spawned acquire of the same name
/// queued behind it, to be handed the lock; checks that the new guard's fencing token is higher,
/// and releases it too.
///
/// # Panics
/// When the release fails, the waiter does not get the lock within `bound`, or its token is not
/// higher.
pub async fn hands_over(
    bound: Duration,
    held: dlock_api::LockGuard,
    waiter: tokio::task::JoinHandle<dlock_api::Result<dlock_api::LockGuard>>,
) {
    let token = held.fencing_token();
    held.release().await.expect("the holder's release");
    let next = within(bound, "the waiter to be handed the lock", waiter)
        .await
        .expect("the waiter's task")
        .expect("the waiter's acquire");
    assert!(
        next.fencing_token() > token,
        "the next holder's token {:?} is not above {token:?}",
        next.fencing_token()
    );
    next.release().await.expect("the next holder's release");
}

/// Checks that `client` finds `name` busy now, then spawns its blocking acquire of `name`
/// (waiting up to `bound`), to queue behind the holder; pass the handle to [`hands_over`].
///
/// # Panics
/// When `name` is free or the check fails.
pub async fn queued_waiter<L>(
    bound: Duration,
    client: &L,
    name: &dlock_api::LockName,
) -> tokio::task::JoinHandle<dlock_api::Result<dlock_api::LockGuard>>
where
    L: dlock_api::DistributedLock + Clone + 'static,
{
    let refused = client
        .try_acquire(name, &dlock_api::LockOptions::new())
        .await;
    assert!(
        matches!(refused, Ok(None)),
        "`{name}` should be busy: {refused:?}"
    );
    spawned_acquire(bound, client, name)
}

/// `client`'s blocking acquire of `name` (waiting up to `bound`) on a task of its own, without
/// looking first (a client whose link is being cut cannot): [`queued_waiter`] checks the name
/// is busy, then calls this.
pub fn spawned_acquire<L>(
    bound: Duration,
    client: &L,
    name: &dlock_api::LockName,
) -> tokio::task::JoinHandle<dlock_api::Result<dlock_api::LockGuard>>
where
    L: dlock_api::DistributedLock + Clone + 'static,
{
    let (client, name) = (client.clone(), name.clone());
    let options = dlock_api::LockOptions::new().with_wait_timeout(bound);
    tokio::spawn(async move { client.acquire(&name, &options).await })
}

/// What follows when `stale`'s client is cut off (a blackholed link, say) past its lease or
/// session: the guard reports suspension, then its loss (`SessionExpired`); `direct` takes
/// `name` with a higher token; once `heal` restores the link, the stale release fails (`Lost`
/// or `NotHeld`) and leaves the new holder's lock alone. Releases the new holder's lock.
///
/// # Panics
/// When any step does not happen within `bound`, or happens otherwise.
pub async fn partitioned_holder_spares_the_next<L>(
    bound: Duration,
    stale: dlock_api::LockGuard,
    heal: impl FnOnce(),
    direct: &L,
    name: &dlock_api::LockName,
) where
    L: dlock_api::DistributedLock,
{
    use dlock_api::{LockError, LockOptions, LockStatus, LostReason};
    until(bound, "the cut-off guard to report suspension", || {
        matches!(stale.status(), LockStatus::Suspended { .. })
    })
    .await;
    let reason = within(bound, "the suspended guard to be lost", stale.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    let wait = LockOptions::new().with_wait_timeout(bound);
    let new = within(
        bound,
        "another client's acquire",
        direct.acquire(name, &wait),
    )
    .await
    .expect("another client's acquire");
    assert!(new.fencing_token() > stale.fencing_token());
    heal();
    let released = stale.release().await;
    assert!(
        matches!(
            released,
            Err(LockError::Lost { .. } | LockError::NotHeld { .. })
        ),
        "the stale release answered {released:?}"
    );
    let busy = direct.try_acquire(name, &LockOptions::new()).await;
    assert!(
        matches!(busy, Ok(None)),
        "the stale release freed the new holder's lock: {busy:?}"
    );
    new.release().await.expect("the new holder's release");
}
