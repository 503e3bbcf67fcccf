//! Self-tests: Redis single node, independent nodes, Sentinel and Cluster.

use std::time::Duration;

use dlock_test_servers::{
    RedisCluster, RedisNodes, RedisSentinel, RedisServer, Resp, redis_command,
};

fn pong(server: &RedisServer) -> bool {
    matches!(server.command(&["PING"]), Ok(Resp::Simple(s)) if s == "PONG")
}

#[test]
fn single_node_starts_answers_is_killed_and_restarts() {
    let redis = RedisServer::start().unwrap();
    assert!(redis.url().starts_with("redis://127.0.0.1:"));
    assert!(pong(&redis));
    assert_eq!(
        redis.command(&["SET", "k", "v"]).unwrap(),
        Resp::Simple("OK".into())
    );

    let pid = redis.pid().unwrap();
    redis.kill();
    assert!(!redis.is_running());
    assert_eq!(redis.pid(), None);
    assert!(redis.command(&["PING"]).is_err());

    redis.restart().unwrap();
    assert!(pong(&redis));
    assert_ne!(redis.pid(), Some(pid));
    // No persistence: a restarted node is empty.
    assert_eq!(redis.command(&["GET", "k"]).unwrap(), Resp::Bulk(None));

    redis.stop();
    assert!(!redis.is_running());
    redis.restart().unwrap();
    assert!(pong(&redis));
}

#[test]
fn pause_freezes_and_resume_thaws() {
    let redis = RedisServer::start().unwrap();
    redis.pause();
    assert!(redis.is_paused() && redis.is_running());
    assert!(
        redis.command(&["PING"]).is_err(),
        "a paused server must not answer"
    );
    redis.resume();
    assert!(pong(&redis));
}

#[test]
fn dropping_the_handle_kills_the_process_and_removes_its_dir() {
    let redis = RedisServer::start().unwrap();
    let pid = redis.pid().unwrap();
    let dir = redis.dir().to_owned();
    drop(redis);
    assert!(!dir.exists());
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn independent_nodes() {
    let nodes = RedisNodes::start(5).unwrap();
    assert_eq!(nodes.urls().len(), 5);
    nodes.node(0).command(&["SET", "only-here", "1"]).unwrap();
    assert_eq!(
        nodes.node(1).command(&["GET", "only-here"]).unwrap(),
        Resp::Bulk(None)
    );
    nodes.node(2).kill();
    assert!(nodes.nodes().iter().filter(|n| pong(n)).count() == 4);
    nodes.node(2).restart().unwrap();
    assert!(nodes.nodes().iter().all(pong));
}

#[test]
fn sentinel_failover_promotes_the_replica() {
    let setup = RedisSentinel::start().unwrap();
    let old = setup.primary_addr().unwrap();
    assert_eq!(old, setup.primary().addr());
    assert_eq!(setup.master_name(), "mymaster");

    let new = setup.failover().unwrap();
    assert_eq!(new, setup.replica().addr());
    assert_eq!(
        setup.current_primary().unwrap().addr(),
        setup.replica().addr()
    );
}

#[test]
fn sentinels_promote_the_replica_when_the_primary_dies() {
    let setup = RedisSentinel::start().unwrap();
    setup.primary().command(&["SET", "k", "v"]).unwrap();
    wait_until(|| {
        setup
            .replica()
            .command(&["GET", "k"])
            .is_ok_and(|r| r == Resp::Bulk(Some(b"v".to_vec())))
    });

    let new = setup.kill_primary().unwrap();
    assert_eq!(new, setup.replica().addr());
    assert!(!setup.primary().is_running());
    assert_eq!(
        setup.replica().command(&["GET", "k"]).unwrap(),
        Resp::Bulk(Some(b"v".to_vec()))
    );
}

#[test]
fn cluster_with_replicas_serves_all_slots() {
    let cluster = RedisCluster::start_with_replicas(1).unwrap();
    assert_eq!(cluster.nodes().len(), 6);
    for node in cluster.nodes() {
        let info = node
            .command(&["CLUSTER", "INFO"])
            .unwrap()
            .as_text()
            .unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
    // A key lands on exactly one primary; the others redirect with MOVED.
    let replies: Vec<Resp> = (0..3)
        .map(|i| redis_command(cluster.node(i).addr(), &["SET", "k", "v"]).unwrap())
        .collect();
    assert_eq!(
        replies.iter().filter(|r| !r.is_error()).count(),
        1,
        "{replies:?}"
    );

    cluster.node(1).kill();
    cluster.node(1).restart().unwrap();
    cluster.wait_ok().unwrap();
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "condition not met in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tls_node_answers_on_its_tls_port_with_its_ca() {
    let redis = dlock_test_servers::RedisServer::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let url = redis.tls_url().expect("a TLS url");
    let port = url.rsplit(':').next().unwrap().to_owned();
    let ca = redis.ca_cert().expect("a CA");
    let out = std::process::Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(&ca)
        .args(["-h", "127.0.0.1", "-p", &port, "ping"])
        .output()
        .expect("redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The plain port still serves the test's own commands.
    assert_eq!(
        redis.command(&["PING"]).unwrap().as_text().as_deref(),
        Some("PONG")
    );
}
