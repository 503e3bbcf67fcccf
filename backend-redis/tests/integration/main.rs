//! dlock-redis's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-redis --test integration
//! -- faults::` runs one of them.

#[path = "../common/mod.rs"]
mod common;

mod election;
mod errors;
mod faults;
mod fence;
mod node;
mod permits;
mod queue;
mod readers;
mod runtime;
mod sets;
mod tls;
