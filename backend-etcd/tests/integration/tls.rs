//! `etcds://`: locks over TLS to a member whose certificate comes from a private CA.
#![cfg(feature = "tls")]

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use dlock_conformance::wait_for;
use dlock_etcd::EtcdLock;
use dlock_test_servers::Etcd;

const BOUND: Duration = Duration::from_secs(30);

fn etcds_url(etcd: &Etcd) -> String {
    etcd.tls_url()
        .expect("a TLS member")
        .replacen("https://", "etcds://", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_trusting_a_private_ca() {
    let etcd = Etcd::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "{}?ca_cert={}",
        etcds_url(&etcd),
        etcd.ca_cert().unwrap().display()
    );
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = LockName::new("tls/lock").unwrap();
    let wait = LockOptions::new().with_wait_timeout(BOUND);
    let held = a.acquire(&name, &wait).await.unwrap();
    // A waiter's watch and its session lease's keep-alives run over TLS too: it is handed the
    // lock when the holder releases (its 30 s lease rules out expiry).
    let waiter = wait_for::queued_waiter(BOUND, &b, &name).await;
    let queued = async {
        let mut raw = etcd_client::Client::connect(etcd.endpoints(), None)
            .await
            .unwrap();
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        while raw
            .get("dlock/tls%2Flock/", Some(options.clone()))
            .await
            .unwrap()
            .count()
            < 2
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_for::within(BOUND, "the waiter to queue", queued).await;
    wait_for::hands_over(BOUND, held, waiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused() {
    let etcd = Etcd::start_tls().unwrap_or_else(|e| panic!("{e}"));
    // Without the private CA the member's certificate is not trusted: no connection, no lock.
    let result = EtcdLock::connect_url(&format!("{}?connect_timeout=1s", etcds_url(&etcd))).await;
    // A configuration to fix (exit 64 in the CLI), not an outage to wait out (69).
    let Err(error @ LockError::Config { .. }) = result else {
        panic!("connected without trusting the member's CA: {result:?}");
    };
    let said = dlock_conformance::errors::one_sentence("untrusted certificate", &error);
    println!("untrusted certificate: {said}");
    assert!(
        said.contains("certificate"),
        "not refused for its certificate: {said}"
    );
}
