//! How a released lock reaches its waiters, on five real nodes: a waiter alone sends its round to
//! every node at once (one round trip after the announcements), and waiters that came after it
//! take the agreed node first, so that they and the lone one never split the nodes.

mod common;

use std::time::Duration;

use common::{redlock_url, start_nodes};
use dlock_api::{DistributedLock, LockGuard, LockName, LockOptions};
use dlock_redlock::Redlock;
use dlock_test_servers::RedisNodes;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(format!("redlock-handoff/{s}")).unwrap()
}

fn opts() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(20))
        .with_wait_timeout(BOUND)
}

/// A task of a client of its own waiting for `lock`, once it has sent its first round and
/// one more after subscribing (so it has learned whether it waits alone).
async fn waiter(url: &str, lock: &LockName) -> (Redlock, JoinHandle<LockGuard>) {
    let locks = Redlock::connect_url(url).await.unwrap();
    let task = {
        let (locks, lock) = (locks.clone(), lock.clone());
        tokio::spawn(async move { locks.acquire(&lock, &opts()).await.unwrap() })
    };
    let give_up = Instant::now() + BOUND;
    while locks.stats().rounds < 2 {
        assert!(Instant::now() < give_up, "the waiter never sent its rounds");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (locks, task)
}

/// Five nodes of the test's own, their URL, and a client to hold `tag`'s lock.
async fn deployment(tag: &str) -> (RedisNodes, String, LockName, Redlock) {
    let nodes = start_nodes(5);
    let url = redlock_url(&nodes, "");
    let holder = Redlock::connect_url(&url).await.unwrap();
    (nodes, url, name(tag), holder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_alone_skips_the_agreed_node() {
    let (_nodes, url, lock, holder) = deployment("alone").await;
    let held = holder.acquire(&lock, &opts()).await.unwrap();

    let (locks, task) = waiter(&url, &lock).await;
    assert_eq!(locks.stats().lone_rounds, 0, "it has not been woken yet");
    held.release().await.unwrap();
    let guard = timeout(BOUND, task).await.expect("handed off").unwrap();

    let stats = locks.stats();
    assert!(stats.lone_rounds >= 1, "{stats:?}");
    assert_eq!(stats.split_votes, 0, "{stats:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_alone_and_two_newcomers_never_split_the_nodes() {
    let (_nodes, url, lock, holder) = deployment("three").await;
    for round in 0..20 {
        let held = holder.acquire(&lock, &opts()).await.unwrap();
        // The first waiter learns it is alone before the others subscribe; they see it and
        // take the agreed node first, so only one of them meets the first on the other nodes.
        let mut clients = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (locks, task) = waiter(&url, &lock).await;
            clients.push(locks);
            tasks.push(task);
        }
        held.release().await.unwrap();
        while !tasks.is_empty() {
            let (guard, _, rest) = timeout(BOUND, futures::future::select_all(tasks))
                .await
                .expect("the next waiter gets it");
            guard.unwrap().release().await.unwrap();
            tasks = rest;
        }
        for locks in &clients {
            let stats = locks.stats();
            assert_eq!(stats.split_votes, 0, "round {round}: {stats:?}");
        }
        assert!(clients[0].stats().lone_rounds >= 1, "round {round}");
    }
}
