//! `dlock conformance --faults` against deployed Redlock nodes: one fault proxy per node, so a
//! partition or lost replies cut the client off from every node at once.

use crate::common;

use dlock_test_servers::RedisNodes;

#[test]
fn conformance_with_faults_puts_a_proxy_in_front_of_every_node() {
    let nodes = RedisNodes::start(3).unwrap_or_else(|e| panic!("{e}"));
    let hosts: Vec<String> = nodes.nodes().iter().map(|n| n.addr().to_string()).collect();
    let url = format!("redlock://{}", hosts.join(","));
    let stdout = common::succeeds([
        "conformance",
        "--backend",
        &url,
        "--faults",
        "--filter",
        "faults::partitioned_holder_is_fenced_off",
    ]);
    assert!(
        stdout.contains("ok       faults::partitioned_holder_is_fenced_off ("),
        "the partition case did not run through the proxies:\n{stdout}"
    );
}
