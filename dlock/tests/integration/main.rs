//! dlock-rs's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-rs --test integration
//! -- connect::` runs one of them.

mod connect;
mod locked;
mod url_properties;
