//! A set of locks taken in one script against a real Redis, and on a Cluster only where the
//! members' keys share a slot. One script reads the server's clock once, so fresh names taken
//! together get one token: what tells the one step from members taken one by one.

use dlock_api::{DistributedLockExt, LockName, LockOptions, LockSet};
use dlock_redis::RedisLock;
use dlock_test_servers::{RedisCluster, RedisServer};
use redis::cluster_routing::Slot;

/// Whether every member of `set` carries the same token: one reading of the server's clock.
fn one_clock_reading(set: &LockSet) -> bool {
    let tokens = set.fencing_tokens();
    tokens.windows(2).all(|pair| pair[0].1 == pair[1].1)
}

/// Fresh names of this run, `count` of them.
fn fresh(tag: &str, count: usize) -> Vec<LockName> {
    (0..count)
        .map(|i| LockName::new(format!("sets-{tag}-{}-{i}", std::process::id())).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_set_on_one_node_is_taken_in_one_script() {
    let server = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let locks = RedisLock::connect_url(&server.url()).await.unwrap();
    let names = fresh("single", 4);
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("a free set is granted");
    assert!(
        one_clock_reading(&set),
        "the members were not taken in one script: {set:?}"
    );
    set.release().await.unwrap();
}

/// Names whose tags hash to one slot go in one script; others, one by one (still granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_takes_a_set_in_one_script_only_within_one_slot() {
    let cluster =
        tokio::task::block_in_place(RedisCluster::start).unwrap_or_else(|e| panic!("{e}"));
    let seeds: Vec<String> = cluster.addrs().iter().map(ToString::to_string).collect();
    let locks = RedisLock::connect_url(&format!("redis+cluster://{}", seeds.join(",")))
        .await
        .unwrap();
    // One name more than there are slots: two of them share one, whatever the process id
    // (CRC16 keeps apart many names that differ in a few digits only, so a few thousand need not).
    let candidates = fresh("cluster", 16_385);
    let mut by_slot = std::collections::HashMap::new();
    let (first, second) = candidates
        .iter()
        .find_map(|name| {
            let other = by_slot.insert(Slot::for_key(&locks.keys(name).lock), name.clone())?;
            Some((other, name.clone()))
        })
        .expect("two of 16,385 names share one of 16,384 slots");
    let set = locks
        .try_acquire_all(&[first, second], &LockOptions::new())
        .await
        .unwrap()
        .expect("a free set in one slot is granted");
    assert!(
        one_clock_reading(&set),
        "a set in one slot was not taken in one script: {set:?}"
    );
    set.release().await.unwrap();
    let spread = fresh("spread", 3);
    let set = locks
        .try_acquire_all(&spread, &LockOptions::new())
        .await
        .unwrap()
        .expect("a free set over several slots is granted, one by one");
    set.release().await.unwrap();
}
