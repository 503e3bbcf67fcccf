//! `dlock bench`'s raw floors against a real ZooKeeper: ephemeral sequential create + delete
//! pairs, the hand-off through the predecessor's exists-watch, and many tasks on one session.

use crate::common;

use dlock_test_servers::ZooKeeper;

#[test]
fn bench_measures_every_raw_floor_of_zookeeper() {
    let zookeeper = ZooKeeper::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&zookeeper.url());
    common::assert_every_floor_measured(
        &report,
        "delete, then the waiter's exists-watch fires and its listing answers",
    );
}

/// `dlock bench --permits 1,3`: each number of permits measured against the raw floor of
/// the same queue with N places at its head, woken by the exists-watches on the N nodes just
/// before a waiter's own.
#[test]
fn bench_measures_semaphores_against_their_raw_floor() {
    let zookeeper = ZooKeeper::start().unwrap_or_else(|e| panic!("{e}"));
    common::assert_permits_measured_against_their_floor(&zookeeper.url(), "300ms");
}
