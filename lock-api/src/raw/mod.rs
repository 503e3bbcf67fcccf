//! The implementor API: how a backend plugs into dlock. Read `ARCHITECTURE.md` at the repository
//! root for the picture; this is the guide.
//!
//! **Stability**: this module is for backend authors, and moves with the backends of the same
//! release. Until dlock 1.0 it may change in any minor version; an application that only takes
//! locks never needs it (everything it uses is at the crate root and in the facade).
//!
//! ## What a backend supplies
//! - [`RawLock`]: `try_grant` (one attempt that does not wait) and `wait_grant` (wait on the
//!   server until granted or a deadline), plus its [`Capabilities`](crate::Capabilities). Both
//!   answer with a [`Grant`]: the fencing token, a [`RawLease`], the [`LeaseState`] holding the
//!   validity the server gave, and who renews it ([`RenewedBy`]).
//! - [`RawLease`]: release (owner-checked) and extend, which returns the validity it obtained.
//! - `dlock_api::impl_distributed_lock!(MyLock);` then implements
//!   [`DistributedLock`](crate::DistributedLock) through the engine ([`try_acquire`],
//!   [`acquire`]): options are checked against the capabilities once, before any network call;
//!   the one wait deadline comes from [`time::deadline`] (a wait too long to reach has none); a
//!   wait that ends without a grant becomes [`LockError::Timeout`](crate::LockError::Timeout);
//!   the guard is assembled here and the shared watchdog started when the guard renews its own
//!   lease. Backend entry points with their own key types (Postgres integer keys) use
//!   [`try_acquire_by`] and [`acquire_by`].
//! - Optionally [`RawLock::inspect`] (a read-only query of who holds a name), with `inspect: true`
//!   in its capabilities; otherwise [`inspect`] refuses before any network call.
//! - Optionally [`RawLock::try_grant_at_once`]: every name of a set in one step of the server,
//!   or none; [`try_acquire_at_once`] turns its grants into guards as single acquires' are, and
//!   the set's methods take the names one by one where it answers
//!   [`GrantedAtOnce::OneByOne`] (the default).
//! - `Debug` and `Display` for the lock type: `Display` names the client in errors and logs, as
//!   `redis(10.0.0.5:6379)` does, without credentials.
//!
//! Time is the monotonic clock's ([`tokio::time::Instant`], so paused time in tests moves it):
//! validity, deadlines and renewals never read the wall clock, which an NTP correction or a
//! resumed VM steps (the conformance case `clock::client_wall_clock_steps_change_nothing`). A
//! backend that keeps a deadline in shared storage keeps it as a time to live the server counts
//! down, or on a clock every client agrees on.
//!
//! ## The three lease models
//! - **TTL per lock** (Redis, memory): the state carries a deadline measured from before the
//!   request; [`RenewedBy::Guard`] makes the watchdog call [`RawLease::extend`] every renewal
//!   interval and move the deadline to the validity it returns. Such a backend keeps one
//!   [`GuardTimer`] per client (a task per runtime) and returns it from
//!   [`RawLease::guard_timer`]: the timer's one task then renews every guard of the client, the
//!   locks released before their first renewal cost no task at all, and at each tick the
//!   renewals due within a small slack go to the server together, in one exchange where the
//!   lease names a [`RenewBatch`] ([`RawLease::renewal_batch`]).
//! - **Session** (MySQL, Postgres): the state has no deadline; the connection is the lease
//!   ([`RenewedBy::Session`]). Every guard on one connection shares its [`Session`]
//!   ([`LeaseState::on_session`]); the connection's keepalive ends that session when the
//!   connection dies, which marks every guard on it lost at once. A backend whose locks live on
//!   a SQL connection writes none of this: it implements [`SessionDriver`] (open, try-lock,
//!   wait-lock, unlock, ping, interrupt) and hands it to a [`SessionPool`], which owns the
//!   connections, the waits, cancellation, keepalive and the lost fan-out (see [`pool`]).
//! - **Consensus lease** (etcd): one lease for many keys, kept alive by the client's
//!   stream ([`RenewedBy::Session`]), its deadline shared by every guard on it.
//!
//! ## Cancellation, once for every backend
//! - [`PendingAcquire`]: armed before a request that could grant the lock, it undoes the request
//!   if the acquire is dropped before the [`Grant`] exists. A dropped `Grant` releases its lease.
//! - [`Detach`]: runs a step to completion even if its caller is dropped (every release runs in
//!   one, so a task aborted inside `release().await` still releases and still updates the
//!   client's records).
//! - [`spawn_cleanup`]: where that work, and every other undoing of a dropped guard or a
//!   cancelled acquire, runs once its caller is gone, counted so that [`settle`] can wait for it
//!   before the program exits.
//! - [`WaitRecovery`]: lets a blocking wait survive its connection being killed.
//! - [`RuntimeLife`]: tells a connection whose tokio runtime shut down (its tasks gone with it),
//!   so that a client kept longer (in a `static` shared by tests) connects again on the runtime
//!   that uses it next. [`PerRuntime`] keeps one value (a connection, a pool, a timer) per
//!   runtime that uses a client, so that runtimes running at once never lean on each other's
//!   tasks: one that ends takes only its own connections along.
//! - [`LocalQueue`]: a client's own FIFO per name, so only its first waiter holds a server-side
//!   wait (and a connection) at a time; the others step up in turn. Readers next to each other
//!   in the line (`shared_turn`) wait at the server together, and a reader behind its client's
//!   waiting writer waits behind it.
//! - [`Subscriptions`]: a client's pub/sub subscription per channel, shared by its waiters on it;
//!   the last to leave unsubscribes, never undoing a newer subscribe.
//! - [`ChangeBell`]: a server's notification that a watched state may have changed, so a
//!   reader (a leader observer) reads again at once rather than on its timer.
//! - [`config`]: option values and URL parts parsed, and refused, the same way in every backend.
//! - [`watch_held`]: a TTL lock's holder checking its key until the guard ends, so that a key
//!   taken over reaches its holder as the taker announces it, not at the next renewal.
//! - [`random_owner`]: the random value a backend writes to tell its own key from others'.
//! - [`Registration`]: the backend's name, URL schemes and connect-from-URL, which its crate
//!   exports as `REGISTRATION` for the `dlock` facade's list of backends and its CLI.
//!
//! ## A whole backend
//! Locks in a `HashMap` behind a mutex, the "server" every client made from one `MapServer`
//! shares: `try_grant` takes a free (or expired) name in one step, `wait_grant` waits for a
//! release or the holder's TTL, and the lease releases and extends only while the hold is still
//! its own. That is all a backend writes; the engine does the rest (options, deadlines,
//! cancellation, the watchdog, the lost signal). The example then runs the whole conformance
//! suite against it, as a backend's `tests/conformance.rs` does (`dlock-conformance`: a fresh
//! client per call, the cases as libtest trials), under paused time, and passes it.
//!

#![doc = concat!(
    "```\n",
    include_str!("example_backend.rs"),
    "\n",
    "# use dlock_conformance::Harness;\n",
    "# struct MapHarness(Arc<MapServer>);\n",
    "# #[dlock_api::raw::async_trait]\n",
    "# impl Harness for MapHarness {\n",
    "#     fn label(&self) -> &str { \"hashmap\" }\n",
    "#     async fn client(&self) -> Result<Arc<dyn dlock_api::DistributedLock>> {\n",
    "#         Ok(Arc::new(MapLock { server: self.0.clone(), holdings: Default::default() }))\n",
    "#     }\n",
    "# }\n",
    "// The suite's cases, each against clients of one fresh server.\n",
    "fn main() -> std::process::ExitCode {\n",
    "    dlock_conformance::main_per_case(\n",
    "        || MapHarness(Arc::default()),\n",
    "        || tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap(),\n",
    "    )\n",
    "}\n",
    "```\n",
)]

mod at_once;
pub(crate) mod background;
mod bell;
mod campaign;
mod claim;
pub mod config;
pub(crate) mod detach;
mod engine;
mod held_watch;
pub(crate) mod holdings;
pub(crate) mod lease;
mod local_queue;
mod owner;
mod pending;
pub mod pool;
mod recovery;
mod registration;
mod runtime;
mod session;
pub(crate) mod state;
mod subscriptions;
pub mod time;
pub(crate) mod timer;
pub(crate) mod watchdog;

pub use crate::close::close;
pub use crate::election::OBSERVE_RETRY;
pub use crate::inspect::inspect;
pub use crate::semaphore::permits_mismatch;
pub use at_once::{GrantedAtOnce, try_acquire_at_once};
pub use background::{settle, spawn_cleanup};
pub use bell::ChangeBell;
pub use campaign::{RecordAtGrant, campaign, leader, observe};
pub use claim::Claim;
pub use detach::Detach;
pub use engine::{
    Grant, RawLock, acquire, acquire_by, acquire_permit, count_permits, read, try_acquire,
    try_acquire_by, try_acquire_permit, try_read,
};
pub use held_watch::{HeldCheck, HeldWatchTiming, start_watch_after, watch_held};
pub use holdings::Holdings;
pub use lease::{RawLease, RenewBatch, RenewedBy, batch_answers, batch_groups, spawn_release};
pub use local_queue::{LocalQueue, Turn};
pub use owner::{random_below, random_owner};
pub use pending::PendingAcquire;
pub use pool::{
    DriverError, PoolConfig, SessionDriver, SessionPool, TriedAll, Waited, try_lock_each,
};
pub use recovery::WaitRecovery;
pub use registration::{ConnectFn, Connecting, Registration, with_options};
pub use runtime::{PerRuntime, RuntimeLife};
pub use session::{Session, SessionStatus};
pub use state::LeaseState;
pub use subscriptions::{Subscription, Subscriptions};
pub use timer::{GuardTimer, Scheduled};

/// The attribute [`RawLock`], [`RawLease`] and the other async traits here are written with:
/// put `#[dlock_api::raw::async_trait]` on an `impl` of them, with no `async-trait` dependency
/// of your own.
pub use async_trait::async_trait;
