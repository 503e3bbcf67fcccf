//! # The fault suite's history checker and its instruments
//!
//! The conformance cases check a lock from inside one process. Under faults that is not
//! enough: a lock's promise is about *separate* processes, and the interesting failures (a
//! holder frozen past its lease, a reply held in a kernel buffer, a server whose clock jumped)
//! are the ones where a process believes something that is no longer true. So the fault suite
//! runs workers as separate OS processes the harness can pause and kill, has every worker write
//! down what it did and when, and decides afterwards, from the records alone, whether the lock
//! and the resource it protects stayed safe. This module holds the pieces for that, each usable
//! on its own:
//!
//! - [`clock`]: one clock for every process on the host (`CLOCK_MONOTONIC`, in nanoseconds), so
//!   times in different workers' records compare exactly; and the conversion of a guard's
//!   deadline to it.
//! - [`event`]: the records. A worker appends an [`Event`] before and after each call
//!   (`acquire`, `release`, `extend`, the lost signal, register reads and writes) to its own
//!   JSON-lines file, flushed per line, so a killed worker loses at most a torn last line, which
//!   the reader skips. The harness logs injected faults as [`NemesisRecord`]s.
//! - [`register`]: the protected resource, a set per lock name. The **fenced** register refuses
//!   writes whose fencing token is older than one it already took; the **shadow** register
//!   takes everything and shows what fencing saved. [`register_service`] serves one over TCP
//!   (so a fault proxy can sit in front of it); workers update it read–think–write
//!   ([`RegisterClient::rmw`]).
//! - [`holds`]: the intervals in which a worker believed it held a lock, counted
//!   conservatively (from the grant's return to the first of release, loss, deadline, death),
//!   and the overlaps between them; for a semaphore of N permits, the moments more than N were
//!   valid at once.
//! - [`fence`]: the register logs replayed: stale writes refused and accepted, lost updates,
//!   interleaved writers, tokens shared between holds.
//! - [`checker`]: all of it from an [`Input`] to a typed [`Report`], plus token order and
//!   liveness measurements; [`verdict`]: how the report reads.
//! - [`expect`]: the [`Expect`] profile a test asserts; when it fails, [`dump`](mod@dump)
//!   writes the whole run to a directory for reading afterwards.
//!
//! ## Why the verdicts are sound
//! Every process reads the same monotonic clock, so "guard A was still valid when guard B was
//! granted" is a comparison of two numbers, not an estimate. A hold starts only once the grant
//! *returned* and ends as soon as its holder had any reason to stop believing, so an overlap the
//! checker reports really happened; none depends on a timing tolerance. The register's refusals
//! are facts of its log, replayed by the checker rather than trusted.
//!
//! ## A run, end to end
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use dlock_conformance::history::*;
//! # let dir = std::path::Path::new("/tmp/run");
//! let fenced = RegisterServer::start(RegisterKind::Fenced).await?;
//! let shadow = RegisterServer::start(RegisterKind::Shadow).await?;
//! // … workers log to `worker_file(dir, id)` and rmw both registers; the nemesis acts …
//! let loaded = read_history_dir(dir)?;
//! let input = Input {
//!     events: loaded.records,
//!     torn: loaded.torn,
//!     register: fenced.snapshot(),
//!     shadow: Some(shadow.snapshot()),
//!     residue: Some(vec![]),
//!     ..Input::default()
//! };
//! let report = Expect::CLEAN.verify(&input, dir).map_err(std::io::Error::other)?;
//! println!("{report}");
//! # Ok(()) }
//! ```

pub mod checker;
pub mod clock;
pub mod dump;
pub mod event;
pub mod expect;
pub mod fence;
pub mod holds;
pub mod register;
pub mod register_service;
pub mod verdict;

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // Tests may panic.
mod checker_tests;
#[cfg(test)]
mod testutil;

pub use checker::{Input, Liveness, LostSignal, Recovery, Report, TokenIssue, check};
pub use clock::{deadline_ns, now_ns, tokio_deadline_ns};
pub use dump::dump;
pub use event::{
    Edge, Event, HistoryWriter, HoldId, Loaded, NEMESIS_FILE, NemesisRecord, Op, Phase,
    read_history_dir, read_jsonl, worker_file,
};
pub use expect::{Count, Expect};
pub use fence::{Interleaving, LostAdd, RegisterFindings, StaleWrite, TokenConflict};
pub use holds::{End, Hold, OverLimit, Overlap};
pub use register::{Register, RegisterKind, RegisterSnapshot, RegisterValue, WriteRecord};
pub use register_service::{RegisterClient, RegisterServer, Rmw};
pub use verdict::fmt_ns;
