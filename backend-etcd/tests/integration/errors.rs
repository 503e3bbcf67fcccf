//! What a user reads when a connect fails for its credentials: a wrong password, and none where
//! the cluster requires one, each read as one sentence that names the cause (printed, so
//! `--nocapture` shows them; an unreachable server is checked for every backend by the facade's
//! tests, an untrusted certificate in `tls.rs`).

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockOptions};
use dlock_conformance::errors::one_sentence;
use dlock_etcd::EtcdLock;
use dlock_test_servers::Etcd;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_read_as_one_sentence() {
    let etcd = Etcd::start_with_auth("secret", Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("cannot start etcd for the tests: {e}"));
    let wrong = EtcdLock::connect_url(&format!("etcd://root:wrong@{}", etcd.addr()))
        .await
        .expect_err("a wrong password");
    assert!(matches!(wrong, LockError::Config { .. }), "{wrong:?}");
    let said = one_sentence("wrong password", &wrong);
    assert!(said.contains("authentication failed"), "{said}");
    println!("wrong password: {said}");
    // Without credentials the connect may succeed (etcd checks them per request): the first
    // lock request then says why it is refused.
    let error = match EtcdLock::connect_url(&format!("etcd://{}", etcd.addr())).await {
        Err(error) => error,
        Ok(locks) => locks
            .acquire_str("errors/no-password", &LockOptions::new())
            .await
            .expect_err("a request without credentials"),
    };
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    println!("no password: {}", one_sentence("no password", &error));
}
