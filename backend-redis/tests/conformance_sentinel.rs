//! The conformance suite against a Sentinel-managed primary with a replica.

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::RedisHarness::sentinel() })
}
