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
//!
//! The checker that judges a run from these records comes with the next pieces.

pub mod clock;
pub mod event;
pub mod register;
pub mod register_service;

#[cfg(test)]
mod testutil;

pub use clock::{deadline_ns, now_ns, tokio_deadline_ns};
pub use event::{
    Edge, Event, HistoryWriter, HoldId, Loaded, NEMESIS_FILE, NemesisRecord, Op, Phase,
    read_history_dir, read_jsonl, worker_file,
};
pub use register::{Register, RegisterKind, RegisterSnapshot, RegisterValue, WriteRecord};
pub use register_service::{RegisterClient, RegisterServer, Rmw};
