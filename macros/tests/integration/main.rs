//! dlock-macros's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-macros --test integration
//! -- shapes::` runs one of them.

mod shapes;
mod ui;
