//! Self-tests: ZooKeeper standalone and three-node ensemble.

use dlock_test_servers::{ZooKeeper, ZooKeeperEnsemble};

#[test]
fn standalone_starts_answers_is_killed_and_restarts() {
    let zk = ZooKeeper::start().unwrap();
    assert_eq!(zk.four_letter("ruok").unwrap(), "imok");
    assert_eq!(zk.mode().as_deref(), Some("standalone"));

    zk.kill();
    assert!(zk.four_letter("ruok").is_err());
    zk.restart().unwrap();
    assert_eq!(zk.four_letter("ruok").unwrap(), "imok");

    zk.pause();
    assert_eq!(zk.mode(), None);
    zk.resume();
    assert_eq!(zk.mode().as_deref(), Some("standalone"));
}

#[test]
fn ensemble_elects_a_new_leader_when_the_leader_dies() {
    let ensemble = ZooKeeperEnsemble::start().unwrap();
    assert_eq!(ensemble.connect_string().split(',').count(), 3);
    let leader = ensemble.leader().expect("a leader");
    ensemble.node(leader).kill();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(new) = ensemble.leader() {
            assert_ne!(new, leader);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no new leader in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensemble.node(leader).restart().unwrap();
    assert_eq!(ensemble.node(leader).mode().as_deref(), Some("follower"));
}
