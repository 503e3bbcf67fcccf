//! The conformance suite against a three-node ZooKeeper ensemble (or
//! `DLOCK_TEST_ZOOKEEPER_ENSEMBLE_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::ZkHarness::ensemble() })
}
