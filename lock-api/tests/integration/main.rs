//! dlock-api's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-api --test integration
//! -- inspect::` runs one of them.

mod inspect;
mod memory_faults;
