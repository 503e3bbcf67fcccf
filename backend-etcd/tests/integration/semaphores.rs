//! Semaphores on etcd: each permit is a key on its client's session lease, holding while fewer
//! keys of the name than the limit were created before it; the limit is the key's value. A
//! revoked lease gives its permits back and wakes a waiter on another client; a waiter counts
//! the deletions of the keys it saw ahead, also out of order; a waiter whose own key went with
//! its lease is never told it holds (etcd's own recipes could: etcd-io/etcd #19597, #16221); a
//! mismatched limit leaves no key. Tests wait on events with generous bounds and never assert
//! speed.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use dlock_conformance::wait_for;
use dlock_etcd::EtcdLock;
use etcd_client::{Client, KeyValue};
use tokio::task::JoinHandle;

const BOUND: Duration = Duration::from_secs(30);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-semaphores/{}/{test}", std::process::id())).unwrap()
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    wait_for::within(BOUND, what, future).await
}

/// Two clients of the shared server, its URL and a raw client.
async fn setup() -> (EtcdLock, EtcdLock, String, Client) {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let a = EtcdLock::connect_url(&url).await.unwrap();
    let b = EtcdLock::connect_url(&url).await.unwrap();
    let raw = common::raw_client(&url).await.unwrap();
    (a, b, url, raw)
}

/// `permits` permits of `name` taken now by `client`.
async fn take(client: &EtcdLock, name: &LockName, permits: u32, count: usize) -> Vec<LockGuard> {
    let mut held = Vec::new();
    for _ in 0..count {
        let permit = client
            .try_acquire_permit(name, permits, &LockOptions::new())
            .await
            .unwrap()
            .expect("a free permit");
        held.push(permit);
    }
    held
}

/// `client` waiting for one of `permits` permits of `name` on a task of its own.
fn spawned_waiter(
    client: &EtcdLock,
    name: &LockName,
    permits: u32,
) -> JoinHandle<dlock_api::Result<LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    let options = LockOptions::new().with_wait_timeout(BOUND);
    tokio::spawn(async move { client.acquire_permit(&name, permits, &options).await })
}

/// Waits until `name` has exactly `count` keys, and returns them oldest first.
async fn until_keys(raw: &mut Client, url: &str, name: &LockName, count: usize) -> Vec<KeyValue> {
    within(&format!("{count} keys under the name"), async {
        loop {
            let keys = common::queue_keys(raw, url, name).await.unwrap();
            if keys.len() == count {
                break keys;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The key a permit stands on: one that exists, created at its token's revision, on a lease
/// other than `revoked`.
fn stands_on_a_live_key(keys: &[KeyValue], permit: &LockGuard, revoked: i64) {
    let token = i64::try_from(permit.fencing_token().get()).unwrap();
    let key = keys
        .iter()
        .find(|kv| kv.create_revision() == token)
        .unwrap_or_else(|| panic!("no key of the name was created at the permit's token {token}"));
    assert_ne!(
        key.lease(),
        revoked,
        "the permit stands on the revoked lease"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_key_carries_its_limit_and_its_token_is_the_create_revision() {
    let (a, _b, url, mut raw) = setup().await;
    let (sem, lock) = (name("layout-sem"), name("layout-lock"));
    let permits = take(&a, &sem, 3, 2).await;
    let keys = common::queue_keys(&mut raw, &url, &sem).await.unwrap();
    assert_eq!(keys.len(), 2);
    for (key, permit) in keys.iter().zip(&permits) {
        assert_eq!(key.value(), b"3", "a permit's key carries its limit");
        assert_eq!(
            u64::try_from(key.create_revision()).unwrap(),
            permit.fencing_token().get()
        );
    }
    assert_eq!(keys[0].lease(), keys[1].lease(), "one session lease");
    // Extended to another TTL class, the key moves to that class's lease and keeps its value.
    permits[0].extend(Duration::from_secs(61)).await.unwrap();
    let moved = common::queue_keys(&mut raw, &url, &sem).await.unwrap();
    assert_eq!(moved[0].key(), keys[0].key());
    assert_eq!(moved[0].create_revision(), keys[0].create_revision());
    assert_ne!(moved[0].lease(), keys[0].lease());
    assert_eq!(moved[0].value(), b"3");
    let guard = a.acquire(&lock, &LockOptions::new()).await.unwrap();
    let keys = common::queue_keys(&mut raw, &url, &lock).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].value(), b"", "a lock's key is as it always was");
    guard.release().await.unwrap();

    // A waiter beyond the limit has a key too; the count is of holders only.
    let more = take(&a, &sem, 3, 1).await;
    let waiter = spawned_waiter(&a, &sem, 3);
    until_keys(&mut raw, &url, &sem, 4).await;
    assert_eq!(a.count_permits(&sem).await.unwrap(), 3);
    more.into_iter().next().unwrap().release().await.unwrap();
    let fourth = within("the waiter", waiter).await.unwrap().unwrap();
    assert_eq!(a.count_permits(&sem).await.unwrap(), 3);
    fourth.release().await.unwrap();
    for permit in permits {
        permit.release().await.unwrap();
    }
    assert_eq!(a.count_permits(&sem).await.unwrap(), 0);
    assert!(
        common::queue_keys(&mut raw, &url, &sem)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The lease of a client holding every permit is revoked, as the server does when its
/// keep-alives stop: all its keys go in one revision, its guards are told lost, and a waiter on
/// another client takes a permit at once, on a key of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_gives_its_permits_back_and_wakes_a_waiter_on_another_client() {
    let (a, b, url, mut raw) = setup().await;
    let name = name("revoked");
    let held = take(&a, &name, 3, 3).await;
    let waiter = spawned_waiter(&b, &name, 3);
    let keys = until_keys(&mut raw, &url, &name, 4).await;
    let revoked = keys[0].lease();
    assert!(keys[..3].iter().all(|kv| kv.lease() == revoked));
    assert_ne!(
        keys[3].lease(),
        revoked,
        "the waiter is on its own client's lease"
    );
    raw.lease_revoke(revoked).await.unwrap();
    let permit = within("the waiter on the other client", waiter)
        .await
        .unwrap()
        .unwrap();
    for guard in &held {
        within("the holder's loss", guard.lost()).await;
    }
    let keys = common::queue_keys(&mut raw, &url, &name).await.unwrap();
    assert_eq!(keys.len(), 1, "only the waiter's key is left");
    stands_on_a_live_key(&keys, &permit, revoked);
    assert_eq!(b.count_permits(&name).await.unwrap(), 1);
    for guard in held {
        assert!(matches!(
            guard.release().await,
            Err(LockError::Lost { .. } | LockError::NotHeld { .. })
        ));
    }
    assert_eq!(
        b.count_permits(&name).await.unwrap(),
        1,
        "stale releases add nothing"
    );
    permit.release().await.unwrap();
    assert_eq!(b.count_permits(&name).await.unwrap(), 0);
}

/// A permit released from the middle of the holders wakes the first waiter only: each waiter
/// counts the deletions of the keys it saw ahead, wherever they stand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_count_the_deletions_ahead_in_any_order() {
    let (a, b, url, mut raw) = setup().await;
    let name = name("count-deletions");
    let mut held = take(&a, &name, 3, 3).await;
    let first = spawned_waiter(&b, &name, 3);
    until_keys(&mut raw, &url, &name, 4).await;
    let second = spawned_waiter(&b, &name, 3);
    until_keys(&mut raw, &url, &name, 5).await;
    held.remove(1).release().await.unwrap();
    let first = within("the first waiter", first).await.unwrap().unwrap();
    assert_eq!(a.count_permits(&name).await.unwrap(), 3);
    assert!(
        a.try_acquire_permit(&name, 3, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "a fourth permit was free"
    );
    assert!(
        !second.is_finished(),
        "the second waiter held a fourth permit"
    );
    held.remove(0).release().await.unwrap();
    let second = within("the second waiter", second).await.unwrap().unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    for permit in held.into_iter().chain([first, second]) {
        permit.release().await.unwrap();
    }
}

/// The lease of a client holding both permits and waiting for a third is revoked: etcd deletes
/// all three keys in one revision. Its waiter must not take the holders' deletions for its turn
/// (its own key went with them); it queues again on a new lease. The other client's waiter
/// takes a permit at once. Every permit granted stands on a key that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_with_holders_and_a_waiter_grants_only_on_live_keys() {
    let (a, b, url, mut raw) = setup().await;
    let name = name("revoked-with-waiter");
    let held = take(&a, &name, 2, 2).await;
    let own_waiter = spawned_waiter(&a, &name, 2);
    until_keys(&mut raw, &url, &name, 3).await;
    let other_waiter = spawned_waiter(&b, &name, 2);
    let keys = until_keys(&mut raw, &url, &name, 4).await;
    let revoked = keys[0].lease();
    assert!(keys[..3].iter().all(|kv| kv.lease() == revoked));
    raw.lease_revoke(revoked).await.unwrap();
    let other = within("the other client's waiter", other_waiter)
        .await
        .unwrap()
        .unwrap();
    let own = within("the revoked client's waiter", own_waiter)
        .await
        .unwrap()
        .unwrap();
    let keys = common::queue_keys(&mut raw, &url, &name).await.unwrap();
    assert_eq!(keys.len(), 2);
    stands_on_a_live_key(&keys, &other, revoked);
    stands_on_a_live_key(&keys, &own, revoked);
    for guard in &held {
        within("the holder's loss", guard.lost()).await;
    }
    own.release().await.unwrap();
    other.release().await.unwrap();
}

/// Asking a name in use with another limit is refused naming both numbers, and the refused
/// acquire's key is gone before the answer: the one in use stays the only key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_leaves_no_key() {
    let (a, b, url, mut raw) = setup().await;
    let name = name("mismatch");
    let wait = LockOptions::new().with_wait_timeout(BOUND);
    let own_lease = wait.clone().with_renewal(dlock_api::Renewal::Off);
    let refused = |result: dlock_api::Result<Option<LockGuard>>, asked: u32, in_use: u32| {
        let expected = dlock_api::raw::permits_mismatch(&name, asked, in_use).to_string();
        match result {
            Err(error @ LockError::InvalidArgument { .. }) => {
                assert_eq!(error.to_string(), expected);
            }
            other => panic!("{asked} permits on a name in use with {in_use}: {other:?}"),
        }
    };
    let permit = take(&a, &name, 3, 1).await.remove(0);
    let only = common::queue_keys(&mut raw, &url, &name).await.unwrap();
    let check_alone = |keys: Vec<KeyValue>| {
        assert_eq!(
            keys.iter().map(KeyValue::key).collect::<Vec<_>>(),
            only.iter().map(KeyValue::key).collect::<Vec<_>>(),
            "a refused acquire left a key"
        );
    };
    refused(b.acquire(&name, &wait).await.map(Some), 1, 3);
    check_alone(common::queue_keys(&mut raw, &url, &name).await.unwrap());
    refused(b.try_acquire(&name, &LockOptions::new()).await, 1, 3);
    check_alone(common::queue_keys(&mut raw, &url, &name).await.unwrap());
    refused(b.acquire_permit(&name, 4, &wait).await.map(Some), 4, 3);
    check_alone(common::queue_keys(&mut raw, &url, &name).await.unwrap());
    refused(b.acquire_permit(&name, 2, &own_lease).await.map(Some), 2, 3);
    check_alone(common::queue_keys(&mut raw, &url, &name).await.unwrap());
    refused(
        b.try_acquire_permit(&name, 2, &LockOptions::new()).await,
        2,
        3,
    );
    check_alone(common::queue_keys(&mut raw, &url, &name).await.unwrap());
    permit.release().await.unwrap();

    // The other way round: a name held as a lock refuses a semaphore.
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let only = common::queue_keys(&mut raw, &url, &name).await.unwrap();
    assert_eq!(only.len(), 1);
    refused(b.acquire_permit(&name, 3, &wait).await.map(Some), 3, 1);
    refused(
        b.try_acquire_permit(&name, 3, &LockOptions::new()).await,
        3,
        1,
    );
    let keys = common::queue_keys(&mut raw, &url, &name).await.unwrap();
    assert_eq!(keys.len(), 1, "a refused acquire left a key");
    assert_eq!(keys[0].key(), only[0].key());
    guard.release().await.unwrap();
    assert!(
        common::queue_keys(&mut raw, &url, &name)
            .await
            .unwrap()
            .is_empty()
    );
}
