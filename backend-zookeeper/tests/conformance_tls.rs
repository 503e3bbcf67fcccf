//! The conformance suite over TLS (`zks://`), against a standalone ZooKeeper serving its
//! secure client port with a private CA (or `DLOCK_TEST_ZOOKEEPER_TLS_URL`).

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::ZkHarness::tls() })
}
