//! How a released lock reaches its waiters, on five real nodes: the first waiter in the waiting
//! line on the agreed node (a lone waiter is first) sends its round to every node at once, one
//! round trip after the announcements, while the waiters behind it give it a head start and take
//! the agreed node first; the line moves on as waiters are served, and a waiter that gives up
//! leaves it. The line orders rounds and grants nothing, so under load another waiter can be
//! served before the first in line: the tests check who is in line, not who wins.

use crate::common;

use std::time::Duration;

use common::{node_conns, redlock_url, start_nodes};
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

/// Five nodes of the test's own, their URL, and a client to hold `tag`'s lock.
async fn deployment(tag: &str) -> (RedisNodes, String, LockName, Redlock) {
    let nodes = start_nodes(5);
    let url = redlock_url(&nodes, "");
    let holder = Redlock::connect_url(&url).await.unwrap();
    (nodes, url, name(tag), holder)
}

/// How many waiters stand in `lock`'s waiting line on the agreed node (node 0).
async fn in_line(url: &str, lock: &LockName) -> usize {
    let queue = common::keys(url, lock).queue;
    let mut conn = node_conns(url).await.unwrap().swap_remove(0);
    redis::cmd("LLEN")
        .arg(&queue)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Each waiter in `lock`'s line on the agreed node, first in line first, with its place's
/// presence deadline (which changes each time the waiter checks its place).
async fn line_places(url: &str, lock: &LockName) -> Vec<(String, String)> {
    let keys = common::keys(url, lock);
    let mut conn = node_conns(url).await.unwrap().swap_remove(0);
    let order: Vec<String> = redis::cmd("LRANGE")
        .arg(&keys.queue)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut places = Vec::new();
    for waiter in order {
        let deadline: Option<String> = redis::cmd("HGET")
            .arg(&keys.waiters)
            .arg(&waiter)
            .query_async(&mut conn)
            .await
            .unwrap();
        places.push((waiter, deadline.unwrap_or_default()));
    }
    places
}

/// Waits (within the bound) until `lock`'s waiting line holds `count` waiters.
async fn line_holds(url: &str, lock: &LockName, count: usize) {
    let give_up = Instant::now() + BOUND;
    while in_line(url, lock).await != count {
        assert!(Instant::now() < give_up, "the line never held {count}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A task of a client of its own waiting for `lock`, once it stands in the line behind
/// `ahead` others.
async fn waiter(url: &str, lock: &LockName, ahead: usize) -> (Redlock, JoinHandle<LockGuard>) {
    let locks = Redlock::connect_url(url).await.unwrap();
    let task = {
        let (locks, lock) = (locks.clone(), lock.clone());
        tokio::spawn(async move { locks.acquire(&lock, &opts()).await.unwrap() })
    };
    line_holds(url, lock, ahead + 1).await;
    (locks, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_alone_is_first_in_line_and_skips_the_agreed_node() {
    let (_nodes, url, lock, holder) = deployment("alone").await;
    let held = holder.acquire(&lock, &opts()).await.unwrap();

    let (locks, task) = waiter(&url, &lock, 0).await;
    assert_eq!(locks.stats().first_in_line_rounds, 0, "not woken yet");
    held.release().await.unwrap();
    let guard = timeout(BOUND, task).await.expect("handed off").unwrap();

    let stats = locks.stats();
    assert_eq!(stats.first_in_line_rounds, 1, "{stats:?}");
    assert_eq!(stats.split_votes, 0, "{stats:?}");
    guard.release().await.unwrap();
    line_holds(&url, &lock, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_moves_on_as_its_waiters_are_served() {
    let (_nodes, url, lock, holder) = deployment("three").await;
    let mut held = holder.acquire(&lock, &opts()).await.unwrap();
    let mut waiting = Vec::new();
    for ahead in 0..3 {
        waiting.push(waiter(&url, &lock, ahead).await);
    }
    let mut first_in_line_grants = 0;
    for turn in 0..3 {
        let places = line_places(&url, &lock).await;
        held.release().await.unwrap();
        // Normally the first in line; under a heavy load another waiter can win a turn (the
        // line only orders the waiters' rounds, it grants nothing), so whoever is served.
        let (locks, guard) = served(&mut waiting).await;
        if locks.stats().first_in_line_rounds > 0 {
            first_in_line_grants += 1;
        }
        // The waiters still waiting check their place again after the round they lost to this
        // turn's holder: the same waiters, one fewer, each with a new deadline.
        let give_up = Instant::now() + BOUND;
        loop {
            let now = line_places(&url, &lock).await;
            let rechecked = now.len() == places.len() - 1
                && now.iter().all(|(waiter, place)| {
                    places
                        .iter()
                        .any(|(w, before)| w == waiter && before != place)
                });
            if rechecked {
                break;
            }
            assert!(Instant::now() < give_up, "turn {turn}: the line is {now:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        held = guard;
    }
    assert!(
        first_in_line_grants > 0,
        "no grant came from the line's first"
    );
    held.release().await.unwrap();
    line_holds(&url, &lock, 0).await;
}

/// Waits (within the bound) until one of the `waiting` tasks holds the lock; removes it.
async fn served(waiting: &mut Vec<(Redlock, JoinHandle<LockGuard>)>) -> (Redlock, LockGuard) {
    let give_up = Instant::now() + BOUND;
    loop {
        if let Some(i) = waiting.iter().position(|(_, task)| task.is_finished()) {
            let (locks, task) = waiting.swap_remove(i);
            return (locks, task.await.expect("the waiter's task"));
        }
        assert!(Instant::now() < give_up, "nobody was handed the lock");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let (_nodes, url, lock, holder) = deployment("gives-up").await;
    let held = holder.acquire(&lock, &opts()).await.unwrap();
    let (_first, first_task) = waiter(&url, &lock, 0).await;
    let (second, second_task) = waiter(&url, &lock, 1).await;

    // The first gives up (its task is dropped mid-wait): it leaves, and the second is first.
    first_task.abort();
    line_holds(&url, &lock, 1).await;
    held.release().await.unwrap();
    let guard = timeout(BOUND, second_task)
        .await
        .expect("handed off")
        .unwrap();
    assert_eq!(second.stats().split_votes, 0);
    guard.release().await.unwrap();
    line_holds(&url, &lock, 0).await;
}
