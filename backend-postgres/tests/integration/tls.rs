//! TLS to Postgres, against a server that refuses plain TCP and whose certificate comes from a
//! private CA: what is refused, and that dlock's connections are encrypted.
#![cfg(feature = "tls-rustls")]

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_conformance::errors::config_reason;
use dlock_postgres::PostgresLock;
use dlock_test_servers::Postgres;

fn server() -> Postgres {
    Postgres::start_tls().unwrap_or_else(|e| panic!("{e}"))
}

/// The shared suite runs over TLS in `conformance_tls`; this checks that the connections it ran
/// on really were encrypted, as the server sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_sees_tls_on_every_dlock_connection() {
    let pg = server();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url(),
        pg.ca_cert().display()
    );
    let locks = PostgresLock::connect_url(&url).await.unwrap();
    let guard = locks
        .acquire(&LockName::new("tls/lock").unwrap(), &LockOptions::new())
        .await
        .unwrap();
    let seen = pg
        .query(
            "SELECT count(*) FILTER (WHERE ssl) > 0 AND count(*) FILTER (WHERE NOT ssl) = 0 \
             FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE application_name = 'dlock'",
        )
        .unwrap();
    assert_eq!(seen.trim(), "t", "dlock's connections are not all over TLS");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_or_plain_tcp_is_refused() {
    let pg = server();
    // The private CA is not among the webpki roots: verification fails, no lock.
    let untrusted = PostgresLock::connect_url(&format!(
        "{}?sslmode=verify-full&connect_timeout=5s",
        pg.url()
    ))
    .await;
    let reason = config_reason(untrusted);
    assert!(reason.contains("TLS"), "{reason}");
    // This server takes no plain TCP: dlock's default (`disable`) is turned away, as a
    // configuration problem rather than an outage.
    config_reason(PostgresLock::connect_url(&pg.url()).await);
}

#[tokio::test]
async fn an_unreadable_certificate_is_a_config_error_before_connecting() {
    // Port 1: nothing listens, so only a check made before connecting gives a Config error.
    let result = PostgresLock::connect_url(
        "postgres://postgres@127.0.0.1:1/postgres?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    )
    .await;
    let reason = config_reason(result);
    assert!(reason.contains("/nonexistent/ca.pem"), "{reason}");
}
