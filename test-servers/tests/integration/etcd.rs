//! Self-tests: etcd single member and three-member cluster.

use dlock_test_servers::{Etcd, EtcdCluster};

#[test]
fn single_member_starts_answers_is_killed_and_restarts() {
    let etcd = Etcd::start().unwrap();
    assert!(etcd.url().starts_with("http://127.0.0.1:"));
    etcd.etcdctl(&["put", "k", "v"]).unwrap();
    assert_eq!(
        etcd.etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim(),
        "v"
    );

    etcd.kill();
    assert!(!etcd.is_healthy());
    etcd.restart().unwrap();
    assert_eq!(
        etcd.etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim(),
        "v",
        "data is on disk"
    );

    etcd.pause();
    assert!(!etcd.is_healthy());
    etcd.resume();
    assert!(etcd.is_healthy());
}

#[test]
fn three_member_cluster_survives_one_member_down() {
    let cluster = EtcdCluster::start().unwrap();
    assert_eq!(cluster.endpoints().len(), 3);
    cluster.member(0).etcdctl(&["put", "k", "v"]).unwrap();
    cluster.member(0).kill();
    assert_eq!(
        cluster
            .member(1)
            .etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim(),
        "v"
    );
    cluster.member(0).restart().unwrap();
    assert_eq!(
        cluster
            .member(0)
            .etcdctl(&["get", "--print-value-only", "k"])
            .unwrap()
            .trim(),
        "v"
    );
}
