//! # dlock-redis: distributed locks on Redis
//!
//! The Redis backend for [dlock](https://docs.rs/dlock-rs): a [`RedisLock`] implements
//! [`dlock_api::DistributedLock`] on a single node, a Sentinel-managed primary, or a Cluster.
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use dlock_api::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_redis::RedisLock;
//!
//! let locks = RedisLock::connect_url("redis://127.0.0.1:6379").await?;
//! let guard = locks.acquire_str("coupon:42", &LockOptions::new()).await?;
//! // … work, passing guard.fencing_token() to the storage …
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## How it works
//! - **Acquire**: the first attempt is one small Lua script: `SET PREFIX:{NAME} OWNER NX PX TTL`,
//!   and on success it raises the name's fence key and returns the new fencing token; 0 if the
//!   lock is held. It reads no queue key: a waiter that queues marks the fence ("waiters may be
//!   queued"), and a first attempt that finds the mark undoes its `SET` and leaves the decision
//!   to the full script, so it never jumps a live waiter (a holder whose lease ran out with
//!   waiters queued leaves the lock free with them in line). A waiter's attempts use the full
//!   script, which also queues it (a live waiter goes first) and returns the holder's remaining
//!   TTL. Scripts go by SHA (`EVALSHA`) and fall back to `EVAL` when the server forgot
//!   them (restart, `SCRIPT FLUSH`).
//! - **Waiting**: a busy acquire joins the name's FIFO queue (`PREFIX:{NAME}:queue`) and subscribes
//!   to `PREFIX:{NAME}:released` (once per name per client; all of a client's subscriptions ride its
//!   RESP3 connection, one per tokio runtime that uses the client).
//! - **Release** compares the owner, deletes the lock and, in the same script, **grants** it to the
//!   first live waiter: sets the lock to that waiter's owner token, raises the fence, and publishes
//!   `granted OWNER TOKEN`. The waiter holds the lock the moment the message arrives, so a hand-off
//!   costs about one round trip instead of a poll interval, and waiters are served in order. If
//!   every queued waiter's presence has lapsed, it publishes `free` (one of them may be alive and
//!   queue again); with nobody queued it publishes nothing. A lock taken by the first attempt is
//!   released first by the compare-and-delete of a plain lock (the lock key and the owner): a
//!   waiter that queued while it was held marked the lock's value, and then that script leaves
//!   it held and the full release above hands it over, one round trip later. **Extend** is a
//!   compare-and-`PEXPIRE`.
//! - **A failed or cancelled acquire** is undone by a cancel script in the background: it
//!   releases a lock the acquire took (or a release granted it meanwhile) and leaves the queue.
//!   When the acquire's reply never came (a command timeout, a broken connection), its script may
//!   still run later (a server that stalled runs it when it wakes), so the cancel is retried every
//!   command timeout until the server answers, for up to the TTL, and run once more after that.
//!   A waiter whose re-check loses its reply that way (its connection killed under it) does not
//!   give up: that cleanup owns what the server did for it, so it reconnects and waits on under
//!   a new owner value, at the end of the queue; only a server that stays unreachable ends the
//!   wait early.
//! - **Renewal**: the shared dlock watchdog extends the lease every TTL/3; when the key is gone or
//!   someone else's, or the server stays unreachable until the lease ends, the guard's `lost`
//!   fires.
//! - **Takeover signal**: a lock held for 250 ms marks the name's fence with its client's id, on
//!   a subscription to the client's own channel (`PREFIX:held-by:CLIENT`, one for all its held
//!   locks, on a connection of its own); whoever takes the lock over a key that went without a
//!   release publishes `taken` there, and the old holder's `lost` fires as it arrives rather than
//!   at its next renewal.
//! - **Semaphores** ([`acquire_permit`](dlock_api::DistributedLock::acquire_permit)): a name's
//!   permits are a sorted set, `PREFIX:{NAME}:permits`, one member per permit (its owner value)
//!   scored with the end of its lease **on the server's clock** (`TIME` inside the script, never
//!   the client's). One script removes the members past their score, counts the rest against the
//!   limit, and adds the caller's with a token from the name's fence, as a lock's grant does. So
//!   a holder that crashed gives its permit back when its lease ends, a release (`ZREM` of the
//!   caller's own member) can add only the permit it took, and renewal is `ZADD XX` of a member
//!   whose lease has not ended. The lock key holds `#permits:N` while any permit lives: the limit
//!   stored with the name (another number is refused, naming both), and a lock's `SET NX` finds
//!   the name taken and answers the same refusal. Waiters are **served in order**, in the
//!   lock's queue (`PREFIX:{NAME}:queue` and `:waiters`, each waiter's presence refreshed
//!   while it waits), which the name's mark keeps to the semaphore for as long as anyone is
//!   queued: the script grants a permit only while fewer than N are held counting the live
//!   waiters queued ahead of the caller, so neither a later waiter nor a `try_acquire_permit`
//!   takes a permit an earlier waiter is owed, and a waiter that vanished is skipped once its
//!   presence lapses. A waiter listens on the name's channel, where every release publishes
//!   `free`, and tries again then, when the earliest lease ends, or when it refreshes its
//!   presence; a wait that ends leaves the queue in the same script as it gives back a permit
//!   that raced in. With nobody queued, a permit is still one script. Where a release may reach
//!   the server twice (Sentinel, Cluster), a permit's release leaves a mark of its own owner,
//!   `PREFIX:{NAME}:released-by:OWNER`, for a minute, as a lock's does.
//! - **Elections** ([`campaign`](dlock_api::DistributedLock::campaign),
//!   [`leader`](dlock_api::DistributedLock::leader),
//!   [`observe`](dlock_api::DistributedLock::observe)): a candidate acquires the name as a
//!   lock, and its **term** is the grant's fencing token (from the name's fence, so above every
//!   earlier term and lock of the name). Its value lives in the **leader record**
//!   `PREFIX:{NAME}:leader`, `OWNER TERM VALUE`, written by one script only while the lock key
//!   holds the leader's owner value, and given the lock key's remaining lease plus a second; the
//!   leader's renewals extend both in one script. The grant writes a candidate's first record
//!   itself, so a campaign costs the lock's round trips and no more: a campaign's first attempt
//!   is the full acquire, which writes the record when it takes a free name, and a waiting
//!   candidate's queue entry carries its value (`DEADLINE:TTL=VALUE=`), so the release that
//!   hands it the lock writes its record in the same script. `leader` is one read-only script: the record
//!   counts only if its owner holds the lock key now, so a record an earlier holder left is
//!   never reported. Leadership ends with the lock: a resignation (its release deletes the
//!   record in the same script), a lease that runs out (a crashed leader's key expires), or a
//!   key taken over. Observers subscribe to the name's channel, shared with its waiters, and
//!   read again on every message there: `leader` from a proclaim, a leader's release, or a
//!   leader that finds its key gone (its watch, 250 ms into its hold, or its next renewal),
//!   `granted` and `free` from releases; and, since a leader that vanished
//!   announces nothing, when the lease their last read found ends (the server's PTTL, not a
//!   poll). An observer whose connection is lost subscribes again by itself, reports at most one
//!   error per failure and `Missed` before the state it reads then; dropped, it unsubscribes
//!   (when no waiter of the name on its client still listens). What is left on the server: the
//!   record of a leader that crashed, ignored by every read, until a second after its lease
//!   (a leader whose key went while its process lives deletes it when it finds the key gone,
//!   or at its release). A permit's lease proclaims nothing (`Unsupported`).
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`) is one
//!   read-only script: the holder's owner value and remaining lease (`PTTL`), its fencing token
//!   (the fence counter, raised in the script that granted the lock) and the live waiters in the
//!   queue: everything [`Inspection`](dlock_api::Inspection) asks is known.
//!
//! ## URLs
//! `redis://[user:pass@]host:port[/db]`, `rediss://…` (TLS, feature `tls-rustls`; add
//! `?ca_cert=/path/ca.pem` to trust a private CA instead of the system roots),
//! `redis+sentinel://s1:26379,s2:26379/MASTER[/db]`, `redis+cluster://n1:7000,n2:7001`, each with
//! options as query parameters (see [`RedisConfig`]).
//!
//! ## Keys
//! `PREFIX:{NAME}` (the lock; value = owner, TTL = lease; `#permits:N` while it is a semaphore),
//! `PREFIX:{NAME}:permits` (a semaphore's permits, above), `PREFIX:{NAME}:leader` (an
//! election's leader record, above; it lives a second past its leader's lease), `PREFIX:{NAME}:fence` (last token; kept
//! ten minutes past its last grant, and as long as waiters may be queued), `PREFIX:{NAME}:queue`
//! and `PREFIX:{NAME}:waiters` (the waiters, expiring with them), channel `PREFIX:{NAME}:released`;
//! on a Sentinel or a Cluster also `PREFIX:{NAME}:released-by`, the owner that released the lock
//! last, for a minute. There a release may reach the server twice (the Cluster client sends a
//! command again after a lost reply, a Sentinel connection sends a release again after a
//! failover), and the second arrival, finding the lock gone, answers "released" when the mark is
//! its own, instead of `NotHeld`, which would tell the caller that its critical section went
//! unprotected. A single node sends each command once and leaves no mark. Braces in names are escaped so the hash tag is always the whole name.
//! A trailing `+` on the lock's or the fence's value is a queue mark (above), and `!CLIENT` after
//! the fence's digits a watch mark (its holder listens on channel `PREFIX:held-by:CLIENT`);
//! clients of this layout and of the one before it (which read the queue key instead) must not
//! share a server. A client of the version before the watch mark reads a marked fence as a
//! queue mark: it takes the full acquire, and nobody is told of its takeover.
//!
//! Every key expires: a name used once (a lock per order id) leaves nothing behind once its
//! lease has ended and its fence's ten minutes have passed. A fence can go because it is read
//! only to take the next token, and every token is at least the server's clock in µs: the
//! next token after a lost fence is above every earlier one, so long as the server's clock has
//! not been stepped back by more than the time since the fence's last write (ten minutes, at
//! least). Fences written by versions before this one had no expiry; the next grant of such a
//! name gives its fence one.
//!
//! ## When a Redis deployment forgets a lock
//! A Redis server can lose a held lock without anyone releasing it, and no client is told:
//! - **Eviction.** Lock keys carry a TTL, so a server with `maxmemory` and any policy but
//!   `noeviction` may delete one to make room. At connect the client reads `maxmemory*` and, if
//!   eviction is possible, logs a warning (`eviction_check=warn`, the default), refuses with
//!   [`LockError::Config`](dlock_api::LockError::Config) (`eviction_check=refuse`), or does not ask
//!   (`off`). Behind Sentinels the same check runs on every new primary a failover names: with
//!   `refuse` the client does not switch to a primary that may evict (its commands fail until
//!   the Sentinels name one that cannot, or its policy is fixed: a failing command asks again at
//!   most once a second), with `warn` it switches and logs. Run lock servers,
//!   replicas included, with `maxmemory-policy noeviction`.
//! - **Failover.** Replication is asynchronous: a primary that dies right after a grant may be
//!   replaced by a replica that never saw it. `wait_replicas=N` makes an acquire wait for N replica
//!   acknowledgements and fail (releasing) without them: that narrows the window, it does not
//!   close it (Redis's `WAIT` is not a consensus write).
//! - **Restart without persistence** empties the server. Fencing tokens still rise: each is at
//!   least the server's clock in microseconds, so only a clock stepped backwards repeats one.
//!
//! The fault suite's `faults::server_that_forgets_a_lock_is_caught` reproduces the first two
//! against real servers and checks that the history checker reports the two holders; fencing
//! tokens are what keeps the protected resource safe then.
//!
//! ## Per-node primitives
//! [`node::Node`] exposes one node's lock primitives without the grant queue (`SET NX PX` with
//! a fencing token, owner-checked unlock, announced release and extend, raising the fence
//! counter, with or without an owner check, and the name's channel), each bounded by a timeout of
//! the caller's choosing: the building blocks of Redlock on N independent nodes.
//!
//! ## Cargo features
//! - `tls-rustls`: `rediss://` (TLS) with rustls and the webpki roots.
//! - `driver`: the `driver` module (the `redis` crate's clients made from a [`RedisConfig`]:
//!   single node, the primary the Sentinels name, a Cluster) and a re-export of `redis`, for
//!   tools that talk to the same server with the driver directly, as `dlock bench`'s raw floors
//!   do. These types follow the driver's versions, so they are opt-in and outside this crate's
//!   stable surface.
//!
//! ## Performance
//! `dlock bench --backend redis://… --rounds 3 --duration 2s` measures this backend against its
//! raw protocol floor (the driver alone doing the same server work) in the same run, and prints
//! the ratio. What those runs measured, VM by VM, and what was tried to close the gap, is in the
//! repository's `BENCHMARKS.md`: numbers of one machine age with it, so they are not kept here.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod client;
mod config;
mod conn;
mod connect;
mod driven;
#[cfg(feature = "driver")]
#[cfg_attr(docsrs, doc(cfg(feature = "driver")))]
pub mod driver;
#[cfg(not(feature = "driver"))]
#[allow(unreachable_pub, dead_code)] // public with the `driver` feature
mod driver;
mod error;
mod eviction;
mod held;
mod keys;
mod lease;
mod lock;
pub mod node;
mod renew;
mod scripts;
mod wake;

pub use config::{EvictionCheck, RedisConfig, Topology};
pub use keys::LockKeys;
pub use lock::RedisLock;
/// The `redis` crate this backend is built with, whose clients [`driver`] hands out.
#[cfg(feature = "driver")]
#[cfg_attr(docsrs, doc(cfg(feature = "driver")))]
pub use redis;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`RedisConfig::from_url`], then [`RedisConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, RedisConfig, RedisLock);

pub(crate) const BACKEND: &str = "redis";
