//! dlock-etcd's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-etcd --test integration
//! -- faults::` runs one of them.

#[path = "../common/mod.rs"]
mod common;

mod close;
mod election;
mod errors;
mod faults;
mod keys;
mod runtimes;
mod semaphores;
mod sets;
mod tls;
