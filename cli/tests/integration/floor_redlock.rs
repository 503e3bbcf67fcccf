//! `dlock bench`'s raw floors against three independent Redis nodes: parallel pairs on every
//! node, the multi-node notified hand-off (the waiter takes a quorum on the first
//! announcement) and many tasks on one connection per node, each plain and taking
//! fencing tokens.

use crate::common;

use dlock_test_servers::RedisNodes;

#[test]
fn bench_measures_every_raw_floor_of_redlock() {
    let nodes = RedisNodes::start(3).unwrap_or_else(|e| panic!("{e}"));
    let hosts: Vec<String> = nodes.nodes().iter().map(|n| n.addr().to_string()).collect();
    let report = common::bench(&format!("redlock://{}", hosts.join(",")));
    common::assert_every_floor_measured(
        &report,
        "parallel DEL+PUBLISH x N, subscriber's parallel SET NX x N to a quorum",
    );
    common::assert_fenced_floor_measured(&report);
    // Nothing of the floors is left on any node, not even a fence key.
    for node in nodes.nodes() {
        let keys = node.command(&["KEYS", "*dlock-bench-*"]).unwrap();
        assert!(keys.items().is_empty(), "{keys:?} left on {}", node.addr());
    }
}
