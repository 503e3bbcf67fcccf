//! `dlock::connect` reaches each compiled-in backend's real server by URL.

use std::time::Duration;

use dlock::{DistributedLockExt, LockError, LockOptions};

async fn round_trip(url: &str) {
    let locks = dlock::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
    let guard = locks
        .acquire_str("dlock-facade-test/lock", &opts)
        .await
        .unwrap();
    assert!(
        locks
            .try_acquire_str("dlock-facade-test/lock", &opts)
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn memory_by_url() {
    round_trip("memory://facade-test").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_by_url() {
    round_trip(&dlock_test_servers::shared_redis().url()).await;
}

#[cfg(feature = "redlock")]
#[tokio::test]
async fn redlock_by_url() {
    let nodes = dlock_test_servers::RedisNodes::start(3).unwrap();
    let hosts: Vec<String> = nodes.nodes().iter().map(|n| n.addr().to_string()).collect();
    round_trip(&format!("redlock://{}", hosts.join(","))).await;
    round_trip(&format!("redlock://{}?quorum=3&drift=5ms", hosts.join(","))).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_and_mariadb_by_url() {
    let url = dlock_test_servers::shared_mariadb().url();
    round_trip(&url).await;
    round_trip(&url.replacen("mysql://", "mariadb://", 1)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_by_url() {
    let url = dlock_test_servers::shared_postgres().url();
    round_trip(&url).await;
    round_trip(&url.replacen("postgres://", "postgresql://", 1)).await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_by_url() {
    let url = dlock_test_servers::shared_etcd().url();
    round_trip(&url.replacen("http://", "etcd://", 1)).await;
    round_trip(&format!(
        "{}/facade-prefix",
        url.replacen("http://", "etcd://", 1)
    ))
    .await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_with_no_server_is_unavailable_within_the_connect_timeout() {
    let port = dlock_test_servers::free_port().unwrap();
    let started = std::time::Instant::now();
    let result = dlock::connect(&format!("etcd://127.0.0.1:{port}?connect_timeout=500ms")).await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[cfg(feature = "zookeeper")]
#[tokio::test]
async fn zookeeper_by_url() {
    let zk = dlock_test_servers::shared_zookeeper();
    round_trip(&zk.url()).await;
    round_trip(&format!(
        "{}/dlock-facade/nested?session_timeout=4s",
        zk.url()
    ))
    .await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test]
async fn zookeeper_with_no_server_is_unavailable_within_the_connect_timeout() {
    let port = dlock_test_servers::free_port().unwrap();
    let started = std::time::Instant::now();
    let result = dlock::connect(&format!("zk://127.0.0.1:{port}?connect_timeout=500ms")).await;
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn unknown_options_and_bad_urls_are_config_errors() {
    for url in [
        "memory://?x=1",
        "ftp://host",
        "no-scheme",
        "redis://h?nope=1",
        "mysql://h/db?nope=1",
        "postgres://h/db?nope=1",
        "etcd://h?nope=1",
        "redlock://a,b,c?nope=1",
        "redlock://a,b,c,d,e?quorum=2",
        "zk://h?nope=1",
        "zk://h/zookeeper",
    ] {
        let result = dlock::connect(url).await;
        assert!(
            matches!(result, Err(LockError::Config { .. })),
            "{url}: {result:?}"
        );
    }
}

/// A refused connection on every backend is `Unavailable`, and its chain of causes (as
/// anyhow's `{:#}`, tracing and the CLI print it) says each cause once.
#[tokio::test]
async fn a_refused_connection_says_each_cause_once() {
    // Three ports nothing listens on (bound together so they differ, then closed).
    let [closed, b, c] = {
        let listeners: Vec<_> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        [0, 1, 2].map(|i| listeners[i].local_addr().unwrap())
    };
    let urls = [
        format!("redis://{closed}?connect_timeout=2s"),
        format!("redlock://{closed},{b},{c}?connect_timeout=2s"),
        format!("mysql://root@{closed}/test?connect_timeout=2s"),
        format!("postgres://postgres@{closed}/postgres?connect_timeout=2s"),
        format!("etcd://{closed}?connect_timeout=2s"),
        format!("zk://{closed}?connect_timeout=2s"),
    ];
    for url in urls {
        let error = match dlock::connect(&url).await {
            Ok(_) => panic!("{url}: connected to a closed port"),
            Err(error) => error,
        };
        assert!(
            matches!(error, LockError::Unavailable { .. }),
            "{url}: {error:?}"
        );
        let chain = dlock_conformance::errors::one_sentence(&url, &error);
        assert!(
            chain.contains(&format!("unavailable: connecting to {url}: ")),
            "the error does not say where it was connecting to: {chain}"
        );
        println!("{chain}");
    }
}

/// The URL an error names has its passwords hidden, in the user info and in a `password` option.
#[tokio::test]
async fn a_refused_connection_hides_the_password_it_names() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for url in [
        format!("redis://:s3cret@{closed}?connect_timeout=2s"),
        format!("postgres://app:s3cret@{closed}/db?connect_timeout=2s"),
        format!("postgres://{closed}/db?user=app&password=s3cret&connect_timeout=2s"),
    ] {
        let Err(error) = dlock::connect(&url).await else {
            panic!("{url}: connected to a closed port");
        };
        let chain = dlock::error_chain(&error);
        assert!(
            chain.contains("connecting to") && chain.contains("***") && !chain.contains("s3cret"),
            "{chain}"
        );
    }
}
