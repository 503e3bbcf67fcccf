//! `rediss://`: locks over TLS to a server whose certificate comes from a private CA.
#![cfg(feature = "tls-rustls")]

use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_redis::RedisLock;
use dlock_test_servers::RedisServer;
use tokio::time::timeout;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_trusting_a_private_ca() {
    let redis = RedisServer::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "{}?ca_cert={}",
        redis.tls_url().unwrap(),
        redis.ca_cert().unwrap().display()
    );
    let (a, b) = (
        RedisLock::connect_url(&url).await.unwrap(),
        RedisLock::connect_url(&url).await.unwrap(),
    );
    let name = LockName::new("tls/lock").unwrap();
    let long = LockOptions::new()
        .with_ttl(Duration::from_secs(60))
        .with_wait_timeout(Duration::from_secs(30));
    let held = a.acquire(&name, &long).await.unwrap();
    assert!(
        b.try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    // A waiter is handed the lock over its TLS connection (the 60 s lease rules out expiry).
    let waiter = tokio::spawn(async move { b.acquire(&name, &long).await });
    tokio::task::yield_now().await;
    held.release().await.unwrap();
    let next = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("hand-off over TLS")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused() {
    let redis = RedisServer::start_tls().unwrap_or_else(|e| panic!("{e}"));
    // Without the private CA, the server's certificate is not trusted: no connection, no lock.
    let result =
        RedisLock::connect_url(&format!("{}?connect_timeout=1s", redis.tls_url().unwrap())).await;
    // A configuration to fix (exit 64 in the CLI), not an outage to wait out (69).
    match result {
        Err(error @ dlock_api::LockError::Config { .. }) => {
            let said = dlock_conformance::errors::one_sentence("untrusted certificate", &error);
            assert!(said.contains("certificate"), "{said}");
            println!("untrusted certificate: {said}");
        }
        other => panic!("expected a config error for an untrusted certificate, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_cert_that_cannot_serve_is_refused_at_connect() {
    let redis = RedisServer::start_tls().unwrap_or_else(|e| panic!("{e}"));
    let ca = redis.ca_cert().unwrap();
    // On plain TCP the option would be ignored: refused, before any network call.
    let plain = RedisLock::connect_url(&format!("redis://127.0.0.1:1?ca_cert={}", ca.display()))
        .await
        .unwrap_err();
    assert!(
        matches!(&plain, dlock_api::LockError::Config { reason, .. } if reason.contains("rediss://")),
        "{plain:?}"
    );
    // A file with no certificate in it (a key, say) would trust nothing.
    let not_a_cert =
        std::env::temp_dir().join(format!("dlock-not-a-cert-{}.pem", std::process::id()));
    std::fs::write(
        &not_a_cert,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let url = redis.tls_url().unwrap();
    let keyed = RedisLock::connect_url(&format!("{url}?ca_cert={}", not_a_cert.display()))
        .await
        .unwrap_err();
    let _ = std::fs::remove_file(&not_a_cert);
    assert!(
        matches!(&keyed, dlock_api::LockError::Config { reason, .. } if reason.contains("no PEM certificate")),
        "{keyed:?}"
    );
}
