//! dlock-zookeeper's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-zookeeper --test integration
//! -- faults::` runs one of them.

#[path = "../common/mod.rs"]
mod common;

mod election;
mod faults;
mod queue;
mod runtime;
mod semaphore;
mod tls;
