//! The memory backend under the faults it simulates: a waiter whose task stops being polled
//! (a stalled task holding a pending acquire) and a client cut off from its store.

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockOptions, MemoryLock, Renewal};
use futures::FutureExt;

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .with_ttl(ttl)
        .with_wait_timeout(Duration::from_secs(60))
}

/// A waiter first in line whose future is never polled again holds up the queue for at most
/// the lease it asked for: the lock is offered to it when freed, the offer runs out, and the
/// waiter behind it gets the lock. Polled again later, the stalled waiter queues anew and gets
/// the lock after the others, never a grant that ran out while it slept.
#[tokio::test(start_paused = true)]
async fn a_stalled_waiter_does_not_strand_the_queue() {
    let store = MemoryLock::new();
    let (holder, stalled, behind) = (store.client(), store.client(), store.client());
    let ttl = Duration::from_secs(2);
    let first = holder.acquire_str("queue", &opts(ttl)).await.unwrap();
    let stalled_opts = opts(ttl);
    let mut stalled_acquire = Box::pin(stalled.acquire_str("queue", &stalled_opts));
    // Polled once: it is queued, first in line.
    assert!((&mut stalled_acquire).now_or_never().is_none());
    let behind_acquire = tokio::spawn(async move {
        let guard = behind.acquire_str("queue", &opts(ttl)).await.unwrap();
        (tokio::time::Instant::now(), guard)
    });
    tokio::task::yield_now().await;
    let released_at = tokio::time::Instant::now();
    first.release().await.unwrap();
    let (granted_at, guard) = behind_acquire.await.unwrap();
    assert!(
        granted_at - released_at <= ttl + Duration::from_millis(10),
        "the waiter behind a stalled one waited {:?}",
        granted_at - released_at
    );
    let behind_token = guard.fencing_token();
    guard.release().await.unwrap();
    let late = stalled_acquire.await.unwrap();
    assert!(late.fencing_token() > behind_token);
    assert!(late.is_held());
    late.release().await.unwrap();
    assert_eq!(store.active_names(), 0);
}

/// A cancelled wait that had been offered the lock hands it straight on.
#[tokio::test(start_paused = true)]
async fn a_dropped_offered_wait_hands_the_lock_on() {
    let store = MemoryLock::new();
    let (holder, dropped, behind) = (store.client(), store.client(), store.client());
    let ttl = Duration::from_secs(30);
    let first = holder.acquire_str("offer", &opts(ttl)).await.unwrap();
    let dropped_opts = opts(ttl);
    let mut dropped_acquire = Box::pin(dropped.acquire_str("offer", &dropped_opts));
    assert!((&mut dropped_acquire).now_or_never().is_none());
    let behind_acquire = tokio::spawn(async move { behind.acquire_str("offer", &opts(ttl)).await });
    tokio::task::yield_now().await;
    first.release().await.unwrap();
    // The offer is made in the stalled waiter's name; dropping its wait hands it on at once.
    drop(dropped_acquire);
    let guard = tokio::time::timeout(Duration::from_secs(1), behind_acquire)
        .await
        .expect("handed on without waiting out the offer")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(store.active_names(), 0);
}

/// A client cut off from the store cannot renew: its guard is lost when the lease runs out,
/// another client takes the lock with a higher token, and the cut-off client's release fails
/// without touching the new holder. Reconnected, it acquires again.
#[tokio::test(start_paused = true)]
async fn a_cut_off_client_loses_its_lease_and_cannot_release_the_next() {
    let store = MemoryLock::new();
    let (cut, other) = (store.client(), store.client());
    let ttl = Duration::from_secs(2);
    let guard = cut.acquire_str("cut", &opts(ttl)).await.unwrap();
    cut.cut_off();
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the lease ran out while cut off");
    let next = other.acquire_str("cut", &opts(ttl)).await.unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(matches!(
        cut.try_acquire_str("cut", &opts(ttl).with_renewal(Renewal::Off))
            .await,
        Err(LockError::Unavailable { .. })
    ));
    assert!(guard.release().await.is_err());
    assert!(next.is_held());
    next.release().await.unwrap();
    cut.reconnect();
    cut.acquire_str("cut", &opts(ttl))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(store.active_names(), 0);
}

/// A named store is dropped with its last client, and made anew by the next `shared`: its
/// locks go, but a name's fencing tokens keep rising, as a test that connects again expects.
#[tokio::test]
async fn tokens_keep_rising_across_a_dropped_and_remade_store() {
    let store = format!("tokens-across-stores-{}", std::process::id());
    let mut last = 0;
    for _ in 0..3 {
        let locks = MemoryLock::shared(&store);
        let guard = locks
            .acquire_str("rising", &LockOptions::new())
            .await
            .unwrap();
        let token = guard.fencing_token().get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
        drop(locks);
    }
}
