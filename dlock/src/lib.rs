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
//! ## Backends
//! Each backend is a cargo feature of this crate and its own crate (`dlock-redis`, …); the memory
//! backend is always compiled in. See [`connect`] for the URL forms and [`dlock_api`]'s guide,
//! re-exported here, for "which backend should you use?" and the contract in brief.
//!
//! ## The `dlock` command
//! The `dlock-cli` crate (`cargo install dlock-cli --features full`): `dlock demo` (the coupon
//! scenario with and without a lock), `dlock run NAME -- CMD` (like `flock(1)`, across
//! machines), `dlock conformance` (the suite against a deployed backend) and `dlock bench`
//! (latency and hand-off figures against the raw protocol floors).
//!
//! ## Package name
//! This crate is published as `dlock-rs` (the name `dlock` belongs to another crate on
//! crates.io); its library is `dlock`: `dlock = { package = "dlock-rs", version = "0.1" }`.
#![cfg_attr(docsrs, feature(doc_cfg))]

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
#[doc(hidden)]
pub use scheme::redact;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use dlock_redis::{RedisConfig, RedisLock};

#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
#[doc(inline)]
pub use dlock_redlock::{Redlock, RedlockConfig};

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[doc(inline)]
pub use dlock_mysql::{MySqlConfig, MySqlLock};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use dlock_postgres::{AdvisoryKey, PostgresConfig, PostgresLock, RowLock};

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
#[doc(inline)]
pub use dlock_etcd::{EtcdConfig, EtcdLock};

#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
#[doc(inline)]
pub use dlock_zookeeper::{NodeAcl, ZkConfig, ZkLock};

#[doc(inline)]
pub use dlock_api::{
    BoxError, Capabilities, DistributedLock, DistributedLockExt, DynDistributedLock, Fencing,
    FencingGate, FencingToken, KeyMapper, LeaseKind, LockContext, LockError, LockGuard, LockName,
    LockOptions, Lost, LostReason, MemoryLock, Renewal, Result, RetryPolicy, error_chain, raw,
};
