//! TLS to MySQL/MariaDB, against a server that refuses plain connections and whose certificate
//! comes from a private CA: what is refused, and what is a configuration error before connecting.
#![cfg(feature = "tls-rustls")]

use dlock_conformance::errors::config_reason;
use dlock_mysql::MySqlLock;
use dlock_test_servers::MariaDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_or_plain_tcp_is_refused() {
    let db = MariaDb::start_tls().unwrap_or_else(|e| panic!("{e}"));
    // The private CA is not among the webpki roots: verification fails, no lock.
    let untrusted = MySqlLock::connect_url(&format!(
        "{}?ssl_mode=VERIFY_IDENTITY&connect_timeout=5s",
        db.url()
    ))
    .await;
    let reason = config_reason(untrusted);
    assert!(reason.contains("TLS"), "{reason}");
    // Trusting the CA, the same server takes dlock's connections.
    let trusted = format!(
        "{}?ssl_mode=VERIFY_IDENTITY&ssl_ca={}",
        db.url(),
        db.ca_cert().display()
    );
    MySqlLock::connect_url(&trusted).await.unwrap();
    // This server takes no plain connection: dlock's default (`DISABLED`) is turned away (MariaDB
    // answers it as a refused login).
    assert!(
        MySqlLock::connect_url(&db.url()).await.is_err(),
        "a plain connection to a TLS-only server"
    );
}

#[tokio::test]
async fn an_unreadable_certificate_is_a_config_error_before_connecting() {
    // Port 1: nothing listens, so only a check made before connecting gives a Config error.
    let result = MySqlLock::connect_url(
        "mysql://root@127.0.0.1:1/test?ssl_mode=VERIFY_CA&ssl_ca=/nonexistent/ca.pem",
    )
    .await;
    let reason = config_reason(result);
    assert!(reason.contains("/nonexistent/ca.pem"), "{reason}");
}
