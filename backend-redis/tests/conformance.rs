//! The conformance suite against one Redis node (or `DLOCK_TEST_REDIS_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::RedisHarness::single() })
}
