//! The conformance suite, fault suite included, against five independent Redis nodes (or
//! `DLOCK_TEST_REDLOCK_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::RedlockHarness::five() })
}
