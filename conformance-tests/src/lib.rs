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
//! `cargo test -p dlock-foo -- fencing::` runs one area (several filters run what matches any,
//! and `--exact`, `--skip` and `--list` work as with libtest). Cases that need what the backend lacks
//! (see [`Needs`]) show as *ignored* with the reason in their name, never as passed.
//!
//! The same table drives `dlock conformance --backend URL` through [`run_all`]; cases that need
//! server-side fault hooks do not run there, and with `--faults` the worker-process and
//! fault-proxy cases do.
//!
//! ## What a harness can offer beyond clients
//! - [`Harness::residue`]: what is left on the server of a case's names (locks held, waiters
//!   queued). The runner reads it after every passing case and fails the case if anything stays
//!   past the bound. The default asks a fresh client to take each name; a harness that can read
//!   the server (keys, `pg_locks`, `IS_USED_LOCK`) sees waiters too.
//! - [`Faults`]: server-side faults, each declared with [`Faults::supports`]: kill a holder, kill
//!   the connections of waiters, or hand out a client whose session a case can suspend, resume
//!   and expire ([`SessionControl`]). A case needing a fault the harness lacks shows as ignored.
//! - [`Harness::child_env`]: lets a case re-run the test binary as a holder process and SIGKILL it.
//! - [`Deployment`]: the servers behind a harness, named by a `DLOCK_TEST_<BACKEND>_URL`
//!   variable (which also carries them to child processes) or started for the tests.
//!
//! [`inputs`] holds property-test strategies over every option and name, shared by the
//! `input::any_*` cases and by property tests with shrinking.
//!
//! ## The fault suite
//! The `faults::` cases check the lock the way Jepsen checks a database: separate **worker
//! processes** (the test binary re-executed, see [`nemesis`]) take locks and update a **fenced
//! register** and its unfenced shadow, while the harness pauses (`SIGSTOP`) and kills them; every
//! operation is recorded on the host's monotonic clock, and afterwards the **history checker**
//! ([`history`]) decides from the records alone: overlapping holds, stale writes refused and
//! accepted, lost updates, token order, what is left on the server. Each case asserts an
//! expectation profile ([`history::Expect`]); negative controls (the same history judged as if
//! the lock had never told a paused holder its lease ended, or as if the resource were
//! unfenced) prove the checker sees a violation. A failing case dumps the run (histories,
//! register logs, nemesis log, seed) to a directory and names it. A backend joins by offering
//! [`Harness::child_env`] and fencing tokens; the link-fault cases (a partitioned holder, lost
//! and late replies, a slow link) need [`Faults::proxy_target`] (any harness with an own server
//! has it; the CLI offers it for a deployed server), the server-fault cases need
//! [`Faults::own_server`] (a server the case may crash, restart and pause), and the negative control `faults::server_that_forgets_a_lock_is_caught` needs
//! [`Faults::amnesia`], offered only by backends whose servers can forget a granted lock (and
//! its counterpart `faults::mitigated_server_keeps_the_lock`, [`Faults::amnesia_mitigated`]: the
//! same act on the configuration the docs advise must leave a clean history).
//! `clock::client_wall_clock_steps_change_nothing` preloads libfaketime into the workers
//! ([`nemesis::clock::SteppedClock`]) and steps their wall clock an hour each way mid-hold;
//! it needs only what `exclusion_is_history_checked` needs, plus the `faketime` package.
//!
//! **Semaphores** go through the same suite where a backend keeps at least three permits
//! ([`Capabilities::max_permits`](dlock_api::Capabilities::max_permits)): the
//! `faults::semaphore_*` cases give their workers a number of permits
//! ([`nemesis::worker::WorkerSpec::permits`]), so each round takes one of three permits instead
//! of the lock, under no fault, a paused and a killed holder, and a partitioned one. The checker
//! counts each name's holds against its limit instead of any two, and judges of the register
//! only what still holds with several token holders at once ([`history::checker`],
//! "Semaphores"); "nothing lost" is checked on the permits themselves: all of them can be held
//! at once after the faults.
//!
//! **The long run** ([`cases::faults::long_run_under_every_nemesis`], [`run_long`]) is the
//! fault suite's soak: six or more workers (half behind a fault proxy where the harness can put
//! one in front of the deployment) take locks of a few names at random, holding each for a
//! random time, while every client-side fault above is done in turn (a paused worker, a killed
//! one replaced, a partition, a slow link, lost and late replies), for as long as asked; the
//! checker judges the whole history. It is not in the case table: `dlock conformance --faults
//! --long [30s]` runs it against a deployment, and a [`main`] suite adds it as a trial when
//! [`LONG_RUN_VAR`] (`DLOCK_CONFORMANCE_LONG=30s`) says how long.
//!
//! A deployment that lives in the test's own process (the memory backend: no child process can
//! reach it) runs the worker cases with worker **tasks** instead ([`Faults::task_client`]): a
//! paused worker is not polled and its client is cut off from the store (its renewals fail, as
//! a stopped process's do), a killed one is aborted with its client cut off for good (its
//! dropped guards cannot release). The histories are the same, so is the checker; run it on
//! real time ([`main`], with [`MemoryHarness::with_task_workers`]), since every record is stamped
//! with the host's clock. The link and server cases need a server, and do not apply.
//!
//! ## Writing cases
//! - Names come from [`Ctx::name`] (`dlock-test/<run>/<case>/…`): isolation by name, never by
//!   flushing a server.
//! - Wait on events with a generous bound ([`Ctx::within`]), never a fixed sleep standing in
//!   for an event. Sleeping *is* right where the time itself is under test (a lease renewed past
//!   several TTLs).
//! - Assert the exact error variant (`matches!(e, Err(LockError::NotHeld { .. }))`).
//! - Safety assertions (two holders, a stale write accepted) never depend on timing.
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`), so a failing backend shows as a
// failed case, not as an overflow in the suite.
#![warn(clippy::arithmetic_side_effects)]

mod args;
mod case;
pub mod cases;
mod deployment;
pub mod errors;
mod harness;
pub mod history;
pub mod inputs;
mod memory;
pub mod nemesis;
mod runner;
pub mod wait_for;

pub use case::{Case, CaseResult, Ctx, Failure, Needs};
pub use cases::cases;
pub use cases::runtime::on_a_runtime_of_its_own;
pub use deployment::Deployment;
/// The server processes an [`OwnServer`] and a [`Deployment`] are built from, re-exported so that
/// a harness for a backend of one's own needs no dependency of its own on them.
pub use dlock_test_servers;
pub use harness::{
    Amnesia, ClientLink, Fault, Faults, Harness, OwnServer, ProxyTarget, ReachThrough,
    SessionControl, TaskClient, Timing,
};
pub use memory::MemoryHarness;
pub use runner::{
    CaseReport, LONG_RUN_ID, LONG_RUN_VAR, Outcome, Report, main, main_per_case, run_all, run_long,
};
