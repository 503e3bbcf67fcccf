//! dlock-mysql's tests, other than the conformance suites, in one test binary: one build and one
//! link instead of one per file. Each file is a module; `cargo test -p dlock-mysql --test integration
//! -- coupon::` runs one of them.

#[path = "../common/mod.rs"]
mod common;

mod coupon;
mod election;
mod errors;
mod faults;
mod fencing;
mod inspect;
mod semaphore;
mod server_behaviour;
mod sets;
mod tls;
mod unix_socket;
