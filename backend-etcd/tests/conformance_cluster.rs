//! The conformance suite against a three-member etcd cluster (or `DLOCK_TEST_ETCD_CLUSTER_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::EtcdHarness::cluster() })
}
