//! A client used after the tokio runtime it was made on shut down: it attaches to the same
//! session from the runtime that calls, so guards held across that end still hold (and their
//! release works), while nodes nobody holds any more (a release or an acquire's cleanup that
//! died with the runtime) go at once rather than living on with the session; a session past
//! its validity is given up, and closed, instead.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LockStatus, LostReason};
use dlock_conformance::{on_a_runtime_of_its_own, wait_for};
use dlock_zookeeper::{ZkConfig, ZkLock};

const BOUND: Duration = Duration::from_secs(45);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-runtime/{}/{test}", std::process::id())).unwrap()
}

/// The queue under `name`: `(child, ephemeral owner)`.
async fn queue(hosts: &str, name: &LockName) -> Vec<(String, i64)> {
    let client = common::raw_client(hosts).await.unwrap();
    let config = ZkConfig::from_url(&format!("zk://{hosts}")).unwrap();
    common::queue_of(&client, &config, name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_held_across_their_runtime_end_still_hold_release_and_are_watched() {
    let zk = dlock_test_servers::shared_zookeeper();
    let hosts = zk.connect_string();
    let url = format!("{}?session_timeout=30s", zk.url());
    let (name, watched) = (name("held"), name("watched"));
    let (client, guard, touched, session) = on_a_runtime_of_its_own({
        let (name, watched) = (name.clone(), watched.clone());
        move || async move {
            let client = ZkLock::connect_url(&url).await.unwrap();
            let guard = client.acquire(&name, &LockOptions::new()).await.unwrap();
            let touched = client.acquire(&watched, &LockOptions::new()).await.unwrap();
            // Past the moment the watch on each held node starts, on this runtime.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let session = client.session_id().unwrap();
            (client, guard, touched, session)
        }
    })
    .await;

    // The next call attaches again; the nodes, the session's, are still there.
    let taken = client
        .acquire(&self::name("other"), &LockOptions::new())
        .await
        .unwrap();
    taken.release().await.unwrap();
    assert_eq!(client.session_id(), Some(session), "the same session");
    assert_eq!(queue(&hosts, &name).await.len(), 1);
    assert!(matches!(guard.status(), LockStatus::Held { .. }));

    // The watch on a held node runs again, on this runtime.
    let config = ZkConfig::from_url(&zk.url()).unwrap();
    let path = format!(
        "{}/{}",
        config.name_path(&watched),
        queue(&hosts, &watched).await[0].0
    );
    let admin = common::raw_client(&hosts).await.unwrap();
    admin.delete(&path, None).await.unwrap();
    let lost = wait_for::within(BOUND, "the deleted node's guard to be lost", touched.lost());
    assert_eq!(lost.await, LostReason::TakenOver);

    guard.release().await.unwrap();
    assert!(queue(&hosts, &name).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_release_or_cleanup_died_with_the_runtime_go_on_the_next_call() {
    let zk = dlock_test_servers::shared_zookeeper();
    let hosts = zk.connect_string();
    let url = format!("{}?session_timeout=30s", zk.url());
    let (dropped, queued) = (name("dropped"), name("queued"));
    let holder = ZkLock::connect_url(&zk.url()).await.unwrap();
    let held = holder.acquire(&queued, &LockOptions::new()).await.unwrap();

    let (client, session) = on_a_runtime_of_its_own({
        let (dropped, queued, hosts) = (dropped.clone(), queued.clone(), hosts.clone());
        move || async move {
            let client = ZkLock::connect_url(&url).await.unwrap();
            let session = client.session_id().unwrap();
            let guard = client.acquire(&dropped, &LockOptions::new()).await.unwrap();
            // A waiter whose runtime ends while it waits, and its cleanup with it.
            let waiter = {
                let (client, queued) = (client.clone(), queued.clone());
                tokio::spawn(async move {
                    let wait = LockOptions::new().with_wait_timeout(BOUND);
                    client.acquire(&queued, &wait).await
                })
            };
            let queued_up = async {
                while queue(&hosts, &queued).await.len() < 2 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            wait_for::within(BOUND, "the waiter to queue", queued_up).await;
            drop(waiter);
            // Its release is a task of this runtime, which ends before it runs.
            drop(guard);
            (client, session)
        }
    })
    .await;
    let behind = |queue: Vec<(String, i64)>| queue.iter().any(|(_, owner)| *owner == session);
    assert!(
        behind(queue(&hosts, &queued).await),
        "the waiter's node outlived its runtime"
    );

    let guard = client
        .acquire(&name("next"), &LockOptions::new())
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(client.session_id(), Some(session), "the same session");
    assert!(queue(&hosts, &dropped).await.is_empty());
    assert!(!behind(queue(&hosts, &queued).await));
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_past_its_validity_is_given_up_and_its_lock_freed() {
    let zk = dlock_test_servers::shared_zookeeper();
    let url = format!("{}?session_timeout=2s", zk.url());
    let name = name("expired");
    let (client, guard, session) = on_a_runtime_of_its_own({
        let name = name.clone();
        move || async move {
            let client = ZkLock::connect_url(&url).await.unwrap();
            let guard = client.acquire(&name, &LockOptions::new()).await.unwrap();
            let session = client.session_id().unwrap();
            (client, guard, session)
        }
    })
    .await;
    // Nothing heartbeats now: the guard is told lost once the session's validity passes.
    wait_for::within(
        BOUND,
        "the guard of a session past its validity",
        guard.lost(),
    )
    .await;
    assert!(matches!(guard.status(), LockStatus::Lost(_)));
    let next = client
        .acquire(&name, &LockOptions::new().with_wait_timeout(BOUND))
        .await
        .unwrap();
    assert_ne!(client.session_id(), Some(session), "a new session");
    next.release().await.unwrap();
    assert!(matches!(
        guard.release().await,
        Err(LockError::Lost {
            reason: LostReason::Expired | LostReason::SessionExpired,
            ..
        } | LockError::NotHeld { .. })
    ));
}
