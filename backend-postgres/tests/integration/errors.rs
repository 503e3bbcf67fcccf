//! What a user reads when a connect fails for its credentials: an unknown role and a missing
//! database each read as one sentence that names the cause (printed, so `--nocapture` shows
//! them). The test server trusts loopback connections, so no password is ever wrong there; an
//! unreachable server is checked for every backend by the facade's tests, an untrusted
//! certificate in `tls.rs`.

use dlock_conformance::errors::one_sentence;
use dlock_postgres::PostgresLock;
use dlock_test_servers::Postgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_read_as_one_sentence() {
    let pg = Postgres::start().unwrap_or_else(|e| panic!("{e}"));
    for (what, url, cause) in [
        (
            "unknown role",
            format!("postgres://nobody@{}/postgres", pg.addr()),
            "nobody",
        ),
        (
            "missing database",
            format!("postgres://postgres@{}/nowhere", pg.addr()),
            "nowhere",
        ),
    ] {
        let error = PostgresLock::connect_url(&url).await.expect_err(what);
        let said = one_sentence(what, &error);
        assert!(said.contains(cause), "{what}: {said}");
        println!("{what}: {said}");
    }
}
