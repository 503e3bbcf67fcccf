//! The conformance suite over TLS (`sslmode=verify-full`), against a private Postgres that
//! refuses plain TCP and whose certificate comes from a private CA (or `DLOCK_TEST_POSTGRES_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::PgHarness::start_tls() })
}
