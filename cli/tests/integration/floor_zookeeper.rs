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
