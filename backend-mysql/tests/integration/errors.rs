//! What a user reads when a connect fails for its credentials: a wrong password and an unknown
//! user each read as one sentence that names the cause (printed, so `--nocapture` shows them;
//! an unreachable server is checked for every backend by the facade's tests, an untrusted
//! certificate in `tls.rs`).

use dlock_conformance::errors::one_sentence;
use dlock_mysql::MySqlLock;
use dlock_test_servers::MariaDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_read_as_one_sentence() {
    let db = MariaDb::start().unwrap_or_else(|e| panic!("{e}"));
    for (what, url) in [
        (
            "wrong password",
            format!("mysql://root:wrong@{}/test", db.addr()),
        ),
        ("unknown user", format!("mysql://nobody@{}/test", db.addr())),
    ] {
        let error = MySqlLock::connect_url(&url).await.expect_err(what);
        let said = one_sentence(what, &error);
        assert!(said.contains("Access denied"), "{what}: {said}");
        println!("{what}: {said}");
    }
}
