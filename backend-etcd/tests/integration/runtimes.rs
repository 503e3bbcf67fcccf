//! A client outlives the tokio runtime it was made on, and the runtimes its guards were taken on:
//! a guard held across a runtime's end is kept alive, and watched, from the next one; a guard
//! whose lease ended meanwhile is told lost. (The conformance suite's runtime case checks what
//! every backend must do: a free lock, a waiter, a guard released or lost.)

use crate::common;

use std::future::Future;
use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions, LostReason};
use dlock_conformance::wait_for;
use dlock_etcd::EtcdLock;
use etcd_client::Client;

const BOUND: Duration = Duration::from_secs(30);

/// Shorter than the waits below, so a lease nobody kept alive would have ended.
const TTL: Duration = Duration::from_secs(2);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-runtimes/{}/{test}", std::process::id())).unwrap()
}

fn url() -> String {
    common::etcd_url(&dlock_test_servers::shared_etcd().endpoints())
}

/// Runs `work` on a current-thread runtime of its own, which shuts down when it returns.
fn on_a_runtime_of_its_own<T>(work: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work)
}

/// `name`'s holder's key and lease.
async fn holder(raw: &mut Client, url: &str, name: &LockName) -> Option<(Vec<u8>, i64)> {
    let keys = common::queue_keys(raw, url, name).await.unwrap();
    keys.first().map(|kv| (kv.key().to_vec(), kv.lease()))
}

/// Guards taken on a runtime that then shut down: the next runtime's first request connects
/// again and keeps their lease alive past its TTL (they still hold, and one's release frees the
/// lock), and watches their keys (the other's key deleted by an operator makes it lost).
#[test]
fn guards_held_across_their_runtimes_end_are_kept_alive_and_watched_from_the_next() {
    let url = url();
    let (kept, released, deleted) = (name("kept"), name("kept-deleted"), name("probe"));
    let options = LockOptions::new().with_ttl(TTL);
    let (client, first, second) = on_a_runtime_of_its_own(async {
        let client = EtcdLock::connect_url(&url).await.unwrap();
        let first = client.acquire(&kept, &options).await.unwrap();
        let second = client.acquire(&released, &options).await.unwrap();
        // Past the moment the held keys' watches start.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (client, first, second)
    });
    on_a_runtime_of_its_own(async {
        // Any request connects again.
        client.inspect(&deleted).await.unwrap();
        tokio::time::sleep(TTL * 2).await;
        assert!(first.is_held(), "{:?}", first.status());
        assert!(second.is_held(), "{:?}", second.status());
        let mut raw = common::raw_client(&url).await.unwrap();
        let (key, lease) = holder(&mut raw, &url, &released).await.expect("a holder");
        assert!(raw.lease_time_to_live(lease, None).await.unwrap().ttl() > 0);
        raw.delete(key, None).await.unwrap();
        let reason = wait_for::within(BOUND, "the guard whose key went", second.lost()).await;
        assert_eq!(reason, LostReason::TakenOver);
        assert!(first.is_held(), "{:?}", first.status());
        first.release().await.unwrap();
        assert_eq!(holder(&mut raw, &url, &kept).await, None);
    });
}

/// A guard whose lease the server no longer has when the next runtime connects again is told
/// lost, and the lock is free.
#[test]
fn a_guard_whose_lease_ended_before_the_next_runtime_is_lost() {
    let url = url();
    let name = name("ended");
    let (client, guard) = on_a_runtime_of_its_own(async {
        let client = EtcdLock::connect_url(&url).await.unwrap();
        let guard = client.acquire(&name, &LockOptions::new()).await.unwrap();
        (client, guard)
    });
    on_a_runtime_of_its_own(async {
        common::revoke_holder(&url, &name).await.unwrap();
        let next = wait_for::within(BOUND, "the lock, on the kept client", async {
            client.acquire(&name, &LockOptions::new()).await
        })
        .await
        .unwrap();
        let reason = wait_for::within(BOUND, "the guard on the revoked lease", guard.lost()).await;
        assert_eq!(reason, LostReason::SessionExpired);
        assert!(guard.release().await.is_err());
        next.release().await.unwrap();
    });
}

/// A guard taken from another runtime, which then shuts down, on a client whose own runtime
/// runs on: its lease is kept alive by the client's runtime, not the one that took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granted_from_a_runtime_that_ended_is_kept_alive_on_the_clients() {
    let url = url();
    let name = name("granted-elsewhere");
    let client = EtcdLock::connect_url(&url).await.unwrap();
    let guard = {
        let (client, name) = (client.clone(), name.clone());
        tokio::task::spawn_blocking(move || {
            on_a_runtime_of_its_own(async {
                client
                    .acquire(&name, &LockOptions::new().with_ttl(TTL))
                    .await
            })
        })
        .await
        .unwrap()
        .unwrap()
    };
    tokio::time::sleep(TTL * 2).await;
    assert!(guard.is_held(), "{:?}", guard.status());
    guard.release().await.unwrap();
}
