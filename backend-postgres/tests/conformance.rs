//! The conformance suite against a private Postgres (or `DLOCK_TEST_POSTGRES_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::PgHarness::start() })
}
