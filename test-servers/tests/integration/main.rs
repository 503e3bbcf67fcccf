//! dlock-test-servers's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-test-servers --test integration
//! -- etcd::` runs one of them.

mod etcd;
mod lifecycle;
mod proxy;
mod redis;
mod sql;
mod zookeeper;
