//! `zks://` against a real TLS server: ZooKeeper's secure client port through Netty, with PEM
//! files from a private CA (dlock-test-servers' `ZooKeeper::start_tls`). The whole conformance
//! suite runs over TLS in `conformance_tls.rs`; this file shows the hand-off, a forced expiry
//! through the TLS port, and that the client checks whom it talks to.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LostReason};
use dlock_conformance::wait_for;
use dlock_test_servers::ZooKeeper;
use dlock_zookeeper::{ZkConfig, ZkLock};

const BOUND: Duration = Duration::from_secs(45);

async fn start_tls() -> ZooKeeper {
    tokio::task::spawn_blocking(ZooKeeper::start_tls)
        .await
        .unwrap()
        .unwrap()
}

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-tls/{}/{test}", std::process::id())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_wait_and_release_over_tls() {
    let zk = start_tls().await;
    let url = zk.tls_url().unwrap();
    let (a, b) = (
        ZkLock::connect_url(&url).await.unwrap(),
        ZkLock::connect_url(&url).await.unwrap(),
    );
    let name = name("handoff");
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let waiter = wait_for::queued_waiter(BOUND, &b, &name).await;
    // Read through the server's plain port, which the test server keeps open.
    let reader = common::raw_client(&zk.connect_string()).await.unwrap();
    let config = ZkConfig::from_url(&url).unwrap();
    wait_for::within(BOUND, "b to queue", async {
        while common::queue_of(&reader, &config, &name)
            .await
            .unwrap()
            .len()
            < 2
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    wait_for::hands_over(BOUND, guard, waiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_expired_through_the_tls_port_loses_the_guard() {
    let zk = start_tls().await;
    let a = ZkLock::connect_url(&zk.tls_url().unwrap()).await.unwrap();
    let name = name("expiry");
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    // Attaches to the session over TLS too: the server has no plain port for it in production.
    a.expire_session(None).await.unwrap();
    let reason = wait_for::within(BOUND, "the lost signal", guard.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    a.acquire(&name, &LockOptions::new().with_wait_timeout(BOUND))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_ca_did_not_sign_or_a_plain_client_is_refused() {
    let zk = start_tls().await;
    let tls = zk.tls_addr().unwrap();
    // The server's own certificate as the only root: not the CA that signed it.
    let wrong_ca = zk.ca_cert().unwrap().with_file_name("server.pem");
    let untrusted = ZkLock::connect_url(&format!(
        "zks://{tls}?ca_cert={}&connect_timeout=3s",
        wrong_ca.display()
    ))
    .await;
    assert!(
        matches!(untrusted, Err(LockError::Unavailable { .. })),
        "{untrusted:?}"
    );
    let plain = ZkLock::connect_url(&format!("zk://{tls}?connect_timeout=3s")).await;
    assert!(
        matches!(plain, Err(LockError::Unavailable { .. })),
        "{plain:?}"
    );
    for (what, result) in [
        ("untrusted certificate", &untrusted),
        ("plain client", &plain),
    ] {
        if let Err(error) = result {
            println!(
                "{what}: {}",
                dlock_conformance::errors::one_sentence(what, error)
            );
        }
    }
    // The trusted CA still gets in: the refusals were about trust, not the server.
    ZkLock::connect_url(&zk.tls_url().unwrap()).await.unwrap();
}
