//! # dlock: distributed locks with pluggable backends
//!
//! One [`DistributedLock`] trait, one implementation per backend, one conformance suite every
//! backend passes. Pick a backend with a URL (or a [`Config`] file), hold the result as
//! `Arc<dyn DistributedLock>`, and swap in `memory://` in your tests.
//!
//! ```
//! # async fn demo() -> dlock::Result<()> {
//! use std::time::Duration;
//! use dlock::{DistributedLockExt, LockOptions};
//!
//! let locks = dlock::connect("memory://").await?; // "redis://127.0.0.1:6379", "postgres://…", …
//! let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
//!
//! // Take one coupon: read, decrement, write (and commit) under the lock; release after the commit.
//! let token = locks
//!     .with_lock("coupon:42", &opts, |lock| async move {
//!         // pass lock.fencing_token() to the storage so a stale holder's write is refused
//!         lock.fencing_token()
//!     })
//!     .await?;
//! # let _ = token;
//! # Ok(()) }
//! ```
//!
//! ## Before the program exits
//! A guard dropped without [`release`](LockGuard::release), and an acquire cut short, are
//! cleaned up by a background task, which a runtime drops unfinished when it shuts down. Await
//! [`settle`] before `main` returns (as `Pool::close` in sqlx) so that those locks are freed at
//! once rather than when their leases end.
//!
//! A client itself may outlive its runtime: one kept in a `static` and shared by
//! `#[tokio::test]`s (each on a runtime of its own) connects again on the runtime of its next
//! call, with no failed call. Tests that run in parallel share it too: each runtime gets
//! connections of its own, so one test's end fails nothing in the others.
//!
//! ## `#[locked]`: a lock around an async fn
//! [`locked`] is `@DistributedLock(key, waitTime, leaseTime)` for Rust: the body of an `async fn`
//! runs under [`with_lock`](DistributedLockExt::with_lock) (stopped if the lock is lost, released
//! only after the body, commit included, returns), with the lock name formatted from the
//! function's arguments and the durations checked at compile time. The function returns
//! `Result<T, E>` with `E: From<LockError>`, so a timeout or a lost lock reaches the caller.
//!
//! ```
//! use std::sync::Arc;
//! use dlock::DistributedLock;
//!
//! struct Coupons {
//!     locks: Arc<dyn DistributedLock>,
//! }
//!
//! impl Coupons {
//!     #[dlock::locked(locks = self.locks, name = "coupon:{coupon_id}", wait = "5s", ttl = "30s")]
//!     async fn take(&self, coupon_id: u64) -> dlock::Result<u32> {
//!         // read the stock, write stock - 1, commit
//!         Ok(99)
//!     }
//! }
//! ```
//!
//! ## Backends
//! Each backend is a cargo feature of this crate and its own crate (`dlock-redis`, …); the memory
//! backend is always compiled in. See [`connect`] for the URL forms and [`dlock_api`]'s guide,
//! re-exported here, for "which backend should you use?" and the contract in brief.
//!
//! ## The `dlock` command
//! The `dlock-cli` crate (`cargo install dlock-cli --features full`): `dlock demo` (the coupon
//! scenario with and without a lock), `dlock run NAME -- CMD` (like `flock(1)`, across
//! machines), `dlock conformance` (the suite against a deployed backend), `dlock bench`
//! (latency and hand-off figures against the raw protocol floors) and `dlock status` (who holds
//! a lock, with its token, the lease it has left and how many wait).
//!
//! ## Package name
//! This crate is published as `dlock-rs` (the name `dlock` belongs to another crate on
//! crates.io); its library is `dlock`: `dlock = { package = "dlock-rs", version = "0.1" }`.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod backends;
mod config;
mod connect;
mod scheme;

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

pub use config::{Config, LockDefaults};
pub use connect::{connect, connect_with};
pub use scheme::BackendScheme;

pub use dlock_macros::locked;
#[doc(hidden)]
pub use scheme::redact;

// The types of each compiled-in backend (none in a build without backend features).
#[allow(unused_imports, unreachable_pub)]
pub use backends::*;

#[doc(inline)]
// Every public item of dlock-api's root, so that no user needs to depend on it as well.
pub use dlock_api::{
    BoxError, Capabilities, CloseReport, CommandTimeout, Connecting, DistributedLock,
    DistributedLockExt, DynDistributedLock, Fencing, FencingGate, FencingToken, Inspection,
    KeyMapper, Leader, LeaderEvent, LeaderStream, Leadership, LeaseKind, LockContext, LockError,
    LockGuard, LockName, LockOptions, LockSet, LockStatus, Lost, LostReason, MAX_LEADER_VALUE,
    MemoryLock, Permit, Renewal, Result, RetryPolicy, error_chain, observability, settle,
};
// Not `raw`: the implementor API moves with the backends (see its stability note); a backend
// author depends on `dlock-api` for it, and an application never needs it.

/// What `#[locked]`'s expansion calls; not an API. The traits exist for their compile errors:
/// rustc shows their `on_unimplemented` text, which says the fix, where a bare
/// `From<LockError>` bound would only say what is missing.
#[doc(hidden)]
pub mod __private {
    use dlock_api::LockError;

    /// A return type that has room for an error: `Result<T, E>`.
    #[diagnostic::on_unimplemented(
        message = "a `#[locked]` fn must return `Result<T, E>`, not `{Self}`, so a lock error (timeout, lost lock, backend down) can reach the caller",
        label = "`{Self}` cannot carry a `dlock::LockError`",
        note = "return `Result<{Self}, E>` where `E: From<dlock::LockError>`, such as `dlock::Result<{Self}>` or `anyhow::Result<{Self}>`"
    )]
    pub trait LockedReturn {
        /// The error half.
        type Error;
        /// `Err(error)`.
        fn from_error(error: Self::Error) -> Self;
    }

    impl<T, E> LockedReturn for Result<T, E> {
        type Error = E;
        fn from_error(error: E) -> Self {
            Err(error)
        }
    }

    /// An error type a [`LockError`] converts into.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot carry a `dlock::LockError`: a `#[locked]` fn's error type must implement `From<dlock::LockError>`",
        label = "a lock error (timeout, lost lock, backend down) has no way into `{Self}`",
        note = "add `impl From<dlock::LockError> for {Self}` (with thiserror, a `#[from] dlock::LockError` variant), or return `dlock::Result<T>` or `anyhow::Result<T>`"
    )]
    pub trait CarriesLockError: Sized {
        /// `E::from(error)`.
        fn from_lock_error(error: LockError) -> Self;
    }

    impl<E: From<LockError>> CarriesLockError for E {
        fn from_lock_error(error: LockError) -> Self {
            E::from(error)
        }
    }
}
