//! The conformance suite over TLS (`ssl-mode=VERIFY_IDENTITY`), against a private MariaDB that
//! refuses plain connections and whose certificate comes from a private CA (or
//! `DLOCK_TEST_MYSQL_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::MySqlHarness::tls() })
}
