//! # dlock-conformance: the suite every dlock backend passes
//!
//! One table of cases ([`cases()`]), each a plain `pub async fn` in the [`cases`](mod@cases) modules, checks
//! the lock contract (`CONTRACT.md` at the repository root): mutual exclusion under real concurrency (the
//! coupon and purchase scenarios), ownership, expiry, fencing, renewal, the lost signal,
//! cancel safety, names and input validation. A backend supplies a [`Harness`], a way to make
//! fresh independent clients of one deployment, and gets the whole suite in a few lines:
//!
//! ```toml
//! # backend-foo/Cargo.toml
//! [[test]]
//! name = "conformance"
//! harness = false
//! ```
//! ```no_run
//! // backend-foo/tests/conformance.rs; the memory harness stands in for yours here
//! # use dlock_conformance::MemoryHarness as FooHarness;
//! fn main() -> std::process::ExitCode {
//!     dlock_conformance::main(|| async { FooHarness::new() })
//! }
//! ```
//!
//! Each case becomes a libtest trial named `conformance::<area>::<property>`, so
//! `cargo test -p dlock-foo -- fencing::` runs one area. Cases that need what the backend lacks
//! (see [`Needs`]) show as *ignored* with the reason in their name, never as passed.
//!
//! The same table drives `dlock conformance --backend URL` through [`run_all`]; cases that need
//! fault hooks do not run there.
//!
//! ## Writing cases
//! - Names come from [`Ctx::name`] (`dlock-test/<run>/<case>/…`): isolation by name, never by
//!   flushing a server.
//! - Wait on events with a generous bound ([`Ctx::within`]), never a fixed sleep standing in
//!   for an event. Sleeping *is* right where the time itself is under test (a lease renewed past
//!   several TTLs).
//! - Assert the exact error variant (`matches!(e, Err(LockError::NotHeld { .. }))`).
//! - Safety assertions (two holders, a stale write accepted) never depend on timing.

mod case;
pub mod cases;
mod harness;
pub mod inputs;
mod memory;
mod runner;

pub use case::{Case, CaseResult, Ctx, Failure, Needs};
pub use cases::cases;
pub use harness::{Fault, Faults, Harness, SessionControl, Timing};
pub use memory::MemoryHarness;
pub use runner::{CaseReport, Outcome, Report, main, main_paused, run_all};
