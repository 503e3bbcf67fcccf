//! # dlock-mysql: distributed locks on MySQL and MariaDB named locks
//!
//! The MySQL / MariaDB backend for [dlock](https://docs.rs/dlock-rs): a [`MySqlLock`] implements
//! [`dlock_api::DistributedLock`] with the server's named locks (`GET_LOCK` / `RELEASE_LOCK`), so
//! a service that already has a MySQL or MariaDB database needs no other lock server.
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use std::time::Duration;
//! use dlock_api::{DistributedLock, DistributedLockExt, LockOptions};
//! use dlock_mysql::MySqlLock;
//!
//! let locks = MySqlLock::connect_url("mysql://app:secret@127.0.0.1:3306/shop").await?;
//! let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
//! let guard = locks.acquire_str("coupon:42", &opts).await?;
//! // … open a transaction, change rows (passing guard.fencing_token()), COMMIT …
//! guard.release().await?; // after the commit, never before
//! # Ok(()) }
//! ```
//!
//! ## How it works
//! - **A named lock belongs to a connection.** The server frees it when that connection calls
//!   `RELEASE_LOCK` or closes. So a client keeps its own small set of connections (never a
//!   general-purpose pool that could hand a lock-holding connection to someone else or reset it):
//!   each lock is taken and released on the same connection, and a connection returns to the idle
//!   set only when it holds no lock. One connection can hold many locks (1,000 names at once take
//!   one connection, not 1,000).
//! - **Acquire** is one statement that takes the lock and its fencing token together. On
//!   MariaDB 10.3+: `SELECT IF(GET_LOCK(key, wait) = 1, NEXTVAL(dlock_fence_seq), NULL)`, a token
//!   from a sequence's in-memory cache, no row written. On MySQL: `INSERT INTO dlock_fence …
//!   SELECT … FROM DUAL WHERE GET_LOCK(key, wait) = 1 ON DUPLICATE KEY UPDATE token =
//!   LAST_INSERT_ID(…)`, a counter row written only when the lock was granted. Either way the
//!   token comes back in the reply, so an uncontended acquire is one round trip. `try_acquire`
//!   waits 0 s.
//! - **Waiting** is the server's: a contended `acquire` sends `GET_LOCK(key, wait)` on a
//!   connection that holds nothing and the server wakes it on release (no polling). Waits longer
//!   than 30 s are issued again in 30 s pieces, so a dead connection is noticed. Only a client's
//!   first waiter for a name waits at the server; its other tasks waiting for the same name
//!   queue in the client (FIFO) and step up in turn, so a flood of waiters does not take a
//!   connection each (`dlock bench --flood`). A waiter whose
//!   connection is killed opens another and keeps waiting within its wait timeout; a dropped
//!   wait is interrupted with `KILL QUERY`, and a grant that raced the cancel is released.
//! - **Cancel safety**: every statement runs to completion even if its caller is dropped, and a
//!   release runs together with the client's record of it, so a task aborted anywhere (inside
//!   `acquire` or inside `release`) leaves neither a lock on the server nor a client that
//!   refuses a free name.
//! - **Release** is `RELEASE_LOCK(key)` on the lock's own connection: 1 is success, 0 (another
//!   connection holds it) and NULL (nobody does) are [`NotHeld`](dlock_api::LockError::NotHeld).
//! - **Lost**: every connection is pinged each `keepalive` (1 s); a connection that broke, was
//!   killed or whose server restarted fires [`lost`](dlock_api::LockGuard::lost) on every guard it
//!   held, and their `release` returns [`Lost`](dlock_api::LockError::Lost).
//! - **No TTL**: the lease is the connection ([`LeaseKind::Session`](dlock_api::LeaseKind)).
//!   A maximum hold time ([`LockOptions::with_max_hold`](dlock_api::LockOptions::with_max_hold))
//!   is enforced by the client; `extend` is unsupported.
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`) reads
//!   `IS_USED_LOCK(key)` (the holder's connection id), on MySQL the fence row (the holder's token:
//!   it is written in the statement that granted the lock; MariaDB's sequence keeps no token per
//!   key, and there is none with `fencing=false`) and, where
//!   `performance_schema` instruments metadata locks (`wait/lock/metadata/sql/mdl`, on by default
//!   in MySQL 8, off in MariaDB), the connections waiting in `GET_LOCK` for the key: waiting
//!   *clients*, since a client's other waiters for a name queue in the client. Without that
//!   instrument the waiters are unknown. There is no remaining lease: the connection is the
//!   lease. One connection is kept for it, opened on first use.
//!
//! ## Semaphores
//! [`acquire_permit`](dlock_api::DistributedLock::acquire_permit) of a name with `N` permits
//! (2 ≤ `N` ≤ 64; one permit is the name's lock) takes one of `N` **slot locks**, `GET_LOCK`s
//! named `KEY N/0` to `KEY N/(N-1)`, where `KEY` is the name's key (mapped to 58 characters
//! rather than 64, so that every slot's name fits the server's limit). At most `N` hold at
//! once because there are `N` slots; a permit is held by its connection exactly as a lock is,
//! so what ends it is its release (`RELEASE_LOCK` of its slot, on its own connection: a second
//! release finds nothing and adds nothing) or the connection's end, which fires
//! `lost(SessionClosed)` as for a lock. The client puts at most one permit of a semaphore on
//! each of its connections, so one client holds at most `max_connections` permits of it.
//! - **An attempt is one statement**: a `CASE` whose branches try each slot's
//!   `GET_LOCK(slot, 0)` from a random slot round and stop at the first granted, so one slot at
//!   most is taken; on MariaDB's fencing sequence the same branch draws the token after the
//!   grant. On the counter table (MySQL, `fencing=table`) the semaphore's row `KEY N` gives the
//!   token, in a second statement after the grant.
//! - **Waiting, in line**: `GET_LOCK` cannot wait for *any* of several slots, so waiters line
//!   up for the semaphore's room, the lock `KEY N/w`, in the server's queue (they send nothing
//!   while they wait, and a `KILL QUERY` reaches them there), and only the one holding it, the
//!   first in line, looks at the slots: that statement with one more branch, which blocks on its
//!   first slot (a random one) for 5 ms. The server grants it that slot the moment it is
//!   released, and a release of another slot reaches it at its next attempt, within 5 ms. Once
//!   granted it lets the room go, and the next in line steps up. As for locks, a client sends
//!   one waiter per semaphore to the server and queues the others. MySQL's `GET_LOCK` waits
//!   whole seconds only (MariaDB's fractions, since 10.1.2), so there the first in line tries
//!   every slot each 5 ms without a wait at the server, for a second at most before it lines
//!   up again.
//! - **The number is part of the semaphore.** `GET_LOCK` has no shared mode, so nothing that
//!   every holder of a semaphore holds can stand for the name, keep its limit, or keep its
//!   lock out (Postgres' shared advisory locks do): that would take a check of every slot in
//!   every lock's statement, a cost every lock would pay. So here `("backups", 3)`,
//!   `("backups", 4)` and the lock `"backups"` are three semaphores that do not see each other,
//!   each keeping its own limit ([`Capabilities::one_limit_per_name`] is false). Give a name one
//!   number everywhere; `dlock run --permits N` takes it from its command line.
//! - [`count_permits`](dlock_api::DistributedLock::count_permits) counts the used slots of every
//!   number of the name (`IS_USED_LOCK` of each, in one statement on the inspection's
//!   connection).
//!
//! [`Capabilities::one_limit_per_name`]: dlock_api::Capabilities::one_limit_per_name
//!
//! ## URLs
//! `mysql://[user[:password]@]host[:port]/database[?option=value…]`; `mariadb://` is the same.
//! The database holds the fencing sequence or table. Options (see [`MySqlConfig`]): `connect_timeout`,
//! `command_timeout`, `max_connections`, `keepalive`, `session_timeout`, `table`, `fencing`,
//! `create_table`, `prefix`, `socket`, `ssl_mode`, `ssl_ca`, `ssl_cert`, `ssl_key`. On the
//! server's machine, `?socket=/run/mysqld/mysqld.sock` connects through its Unix socket, and the
//! host may then be left out (`mysql://app@/shop?socket=…`).
//!
//! ### TLS
//! With the `tls-rustls` feature, MySQL's options ask for TLS (in MySQL's spelling too:
//! `ssl-mode`, `ssl-ca`, …): `?ssl_mode=VERIFY_IDENTITY&ssl_ca=/etc/ssl/db-ca.pem` checks the
//! server's certificate against your CA and its name against the host (without `ssl_ca`, against
//! the webpki roots); `ssl_mode=REQUIRED` encrypts without checking; `ssl_cert` and `ssl_key`
//! present a client certificate. The default is `DISABLED`. A certificate the client does not
//! trust is a [`LockError::Config`](dlock_api::LockError::Config) at connect, as is a certificate
//! file that cannot be read (before any network call). Without the feature, a URL that needs TLS
//! is refused when parsed, never sent in the clear.
//!
//! ## Names
//! The server limits lock names to 64 characters (and documents them as case-insensitive), so
//! a name is used as the key only if it is at most 64 characters of printable ASCII with no
//! upper-case letter and no `~`; any other name becomes `<readable prefix>~<digest>`, the digest
//! being 160 bits of its SHA-256 in base32 (see [`dlock_api::KeyMapper`]). Different names never
//! share a key. [`MySqlLock::key`] shows the key of a name. A short lower-case name is the same
//! lock as `GET_LOCK('that-name', …)` in other code on the same server.
//!
//! ## Fencing
//! On MariaDB 10.3+, one sequence, `dlock_fence_seq` (`<table>_seq`), created on first use (or by
//! [`MySqlLock::migrate`]) with `CACHE 1000`: it writes its table once per 1000 tokens. Every
//! connection raises it to the server's clock in µs when it opens (`SETVAL` never lowers it), so
//! tokens rise across clients, restarts and crashes that lost its last reservation, as long as
//! the server's clock does not go back. On MySQL (and with `fencing=table`, on MariaDB too), the
//! table `dlock_fence (name VARBINARY(255) PRIMARY KEY, token BIGINT UNSIGNED)`: a row per key
//! locked; a token is `max(previous + 1, server clock in µs)`. A row whose token the server's
//! clock passed ten minutes ago is deleted by a client's release (its first, then one sweep of at
//! most 1000 rows per ten minutes): the name's next token, the clock again, is still above it, so
//! a lock per order id does not grow the table for ever.
//!
//! ## Cargo features
//! - `tls-rustls`: TLS to the server (`ssl_mode=…`) with rustls.
//! - `driver`: `MySqlConfig::connect_options`, the sqlx options of every connection dlock opens,
//!   for tools that talk to the same server with the driver directly, as `dlock bench`'s raw
//!   floors do. These types follow the driver's versions, so they are opt-in and outside this
//!   crate's stable surface.
//! - `testing`: hooks dlock's own fault suites use; not for applications, not covered by semver.
//!
//! ## Performance
//! `dlock bench --backend mysql://… --rounds 3 --duration 2s` measures this backend against its
//! raw protocol floor (the driver alone doing the same server work) in the same run, and prints
//! the ratio. What those runs measured, VM by VM, and what was tried to close the gap, is in the
//! repository's `BENCHMARKS.md`: numbers of one machine age with it, so they are not kept here.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod config;
mod driver;
mod election;
mod error;
mod inspect;
mod lock;
mod sql;
mod tls;

pub use config::MySqlConfig;
pub use lock::MySqlLock;
pub use tls::SslMode;

/// The URL schemes this backend serves (`mariadb://` is a `mysql://` URL).
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`MySqlConfig::from_url`], then [`MySqlConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, MySqlConfig, MySqlLock);

pub(crate) const BACKEND: &str = "mysql";
