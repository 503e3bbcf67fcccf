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
    assert!(
        result.is_err(),
        "connected without trusting the server's CA"
    );
}
