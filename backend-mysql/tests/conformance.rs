//! The conformance suite against a private MariaDB (or `DLOCK_TEST_MYSQL_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::MySqlHarness::shared() })
}
