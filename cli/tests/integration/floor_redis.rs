//! `dlock bench`'s raw floors against a real Redis: pairs, the same pairs taking a fencing
//! token, the notified hand-off (`DEL`+`PUBLISH` to a subscriber's `SET NX`) and many tasks on
//! one connection.

use crate::common;

use dlock_test_servers::RedisServer;

#[test]
fn bench_measures_every_raw_floor_of_redis() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&redis.url());
    common::assert_every_floor_measured(&report, "DEL+PUBLISH, waiters race SET NX");
    assert_eq!(
        report["raw_parallel_floor"]["client"], "one multiplexed connection",
        "{report}"
    );
    common::assert_fenced_floor_measured(&report);
    // Nothing of the floors is left on the server, not even a fence key.
    let keys = redis.command(&["KEYS", "*dlock-bench-*"]).unwrap();
    assert!(keys.items().is_empty(), "{keys:?} left");
}

/// `dlock bench --permits 1,3`: each number of permits measured against the raw floor of the
/// same algorithm (a sorted set scored on the server's clock), pairs and hand-off, and nothing
/// of the floor's left on the server.
#[test]
fn bench_measures_semaphores_against_their_raw_floor() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    common::assert_permits_measured_against_their_floor(&redis.url(), "300ms");
    // The floor's keys are deleted; dlock's own fences expire by themselves.
    let keys = redis.command(&["KEYS", "*dlock-bench-*"]).unwrap();
    assert!(keys.items().is_empty(), "{keys:?} left");
}
