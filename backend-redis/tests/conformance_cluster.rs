//! The conformance suite against a three-shard Redis Cluster.

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::RedisHarness::cluster() })
}
