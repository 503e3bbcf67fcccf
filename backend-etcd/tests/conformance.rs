//! The conformance suite against one etcd member (or `DLOCK_TEST_ETCD_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::EtcdHarness::single() })
}
