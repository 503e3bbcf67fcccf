//! The conformance suite against a standalone ZooKeeper (or `DLOCK_TEST_ZOOKEEPER_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::ZkHarness::standalone() })
}
