//! # dlock-api: one lock trait, many backends
//!
//! This crate defines what a dlock lock *is*; the backends (`dlock-redis`, `dlock-postgres`, …)
//! implement it and the `dlock` facade picks one from a URL. Code that needs a lock takes an
//! `Arc<dyn DistributedLock>`; tests hand it a [`MemoryLock`].
//!
//! ```
//! # async fn demo() -> dlock_api::Result<()> {
//! use std::time::Duration;
//! use dlock_api::{DistributedLock, DistributedLockExt, LockOptions, MemoryLock};
//!
//! let locks: std::sync::Arc<dyn DistributedLock> = std::sync::Arc::new(MemoryLock::new());
//! let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
//! let guard = locks.acquire_str("coupon:42", &opts).await?;
//! // … read, change and commit, passing guard.fencing_token() to the storage …
//! guard.release().await?; // after the commit, never before
//! # Ok(()) }
//! ```
//!
//! ## Which backend should you use?
//!
//! | you have | use | lease | fencing | notes |
//! |---|---|---|---|---|
//! | nothing shared (tests, one process) | [`MemoryLock`] | TTL | strict | the whole contract, in-process |
//! | Redis | `dlock-redis` | TTL + watchdog | best effort (failover can lose a lock) | FIFO hand-off by grant, about one round trip |
//! | several independent Redis nodes | `dlock-redlock` | TTL | best effort | survives a minority of nodes down; assumes bounded clock drift |
//! | MySQL / MariaDB | `dlock-mysql` | the connection | strict (sequence on MariaDB, counter row on MySQL) | no extra infrastructure |
//! | Postgres | `dlock-postgres` | the connection | strict (`CACHE 1` sequence) | advisory, transaction and row locks |
//! | etcd | `dlock-etcd` | lease + keep-alive | strict (revision) | consensus: survives failover |
//! | ZooKeeper | `dlock-zookeeper` | the session | strict (czxid) | consensus: survives failover |
//!
//! ## The contract in brief
//! 1. **Mutual exclusion**: while a guard is valid, no other guard for its name exists.
//! 2. **Ownership**: only the holder releases or extends; a stale guard gets
//!    [`LockError::NotHeld`] / [`LockError::Lost`] and never touches the new holder's lock.
//! 3. **Crash liveness**: a vanished holder's lock frees after its TTL or when its session ends.
//! 4. **Fencing**: every acquire returns a [`FencingToken`] above all earlier ones for the name;
//!    a resource that remembers the highest (see [`FencingGate`]) refuses stale holders.
//! 5. **Bounded waiting**: [`try_acquire`](DistributedLock::try_acquire) returns at once;
//!    [`acquire`](DistributedLock::acquire) returns within its wait timeout plus one round trip
//!    (against a server that does not answer, that round trip is the command timeout).
//! 6. **Notification, not polling**: waiters are woken by the backend on release.
//! 7. **Lost signal**: [`LockGuard::lost`] fires when the lock is lost, with a [`LostReason`].
//! 8. **Renewal**: with [`Renewal::auto`] (the default) a watchdog keeps the lease while held.
//! 9. **Cancel safety**: dropping an acquire future leaves nothing held; dropping a guard
//!    releases in the background, and [`settle`] waits for those releases before the program
//!    exits.
//! 10. **Clear errors**: bad input fails before any network call with
//!     [`LockError::InvalidArgument`]; nothing fails as a silent `false`.
//! 11. **Monotonic time**: a step of the client's wall clock changes nothing.
//! 12. **Any runtime**: a client kept longer than the tokio runtime it was made on (a `static`
//!     shared by `#[tokio::test]`s) connects again on the next runtime at its first call there;
//!     a guard held across that end still holds, or is told lost at once where its lock lived on
//!     a connection that died with the runtime (MySQL, Postgres). Runtimes that run at once
//!     (parallel `#[tokio::test]`s) each get connections of their own, so one that ends fails
//!     nothing on the others. Implementors: see [`raw::RuntimeLife`] and [`raw::PerRuntime`].
//!
//! ## Pieces
//! - [`DistributedLock`]: the trait; [`DistributedLockExt`]: `acquire_str`, `with_lock`.
//! - [`LockGuard`]: a held lock; [`LockOptions`]: TTL, wait, renewal, max hold, retry.
//! - [`LockName`]: validated names; [`KeyMapper`]: names into narrower key spaces.
//! - Semaphores: [`DistributedLock::acquire_permit`] and [`Permit`]; leader election:
//!   [`DistributedLock::campaign`], [`Leadership`] (its term is a fencing token),
//!   [`DistributedLock::leader`] and [`DistributedLock::observe`] ([`LeaderEvent`]s);
//!   reader-writer locks: [`DistributedLock::read`] beside the name's lock as its writer.
//! - [`Capabilities`]: what a backend promises beyond the contract.
//! - [`Inspection`]: who holds a name, with what token and lease left, and how many wait
//!   ([`DistributedLock::inspect`], on backends with [`Capabilities::inspect`]).
//! - [`observability`]: the spans, events and metrics (feature `metrics`) every backend reports,
//!   with their fields and labels.
//! - [`raw`]: the implementor API (leases, the shared watchdog, cancel-safety guards).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating here (deadlines from options go through `raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod capabilities;
mod close;
mod election;
mod error;
mod fencing;
mod guard;
mod inspect;
mod lock;
mod memory;
mod multi;
mod name;
pub mod observability;
mod options;
pub mod raw;
mod reader_writer;
mod semaphore;
mod status;
mod token;

pub use capabilities::{Capabilities, Fencing, LeaseKind};
pub use close::CloseReport;
pub use election::{Leader, LeaderEvent, LeaderStream, Leadership, MAX_LEADER_VALUE};
pub use error::{BoxError, CommandTimeout, Connecting, LockError, Result, error_chain};
pub use fencing::FencingGate;
pub use guard::{LockGuard, Lost};
pub use inspect::Inspection;
pub use lock::{DistributedLock, DistributedLockExt, DynDistributedLock, LockContext, Permit};
pub use memory::MemoryLock;
pub use multi::{AtOnce, LockSet};
pub use name::{KeyMapper, LockName};
pub use options::{LockOptions, Renewal, RetryPolicy};
pub use raw::background::settle;
pub use status::{LockStatus, LostReason};
pub use token::FencingToken;

/// Compile-time proof that the public types and futures can cross threads.
#[allow(dead_code)]
fn assert_send_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<LockGuard>();
    send_sync::<LockError>();
    send_sync::<MemoryLock>();
    send_sync::<std::sync::Arc<DynDistributedLock>>();
    let locks = MemoryLock::new();
    let name = LockName::new("x").expect("valid");
    let opts = LockOptions::new();
    send(&locks.acquire(&name, &opts));
    send(&locks.with_lock("x", &opts, |_| async {}));
}
