//! # dlock-postgres: distributed locks on Postgres
//!
//! The Postgres backend for [dlock](https://docs.rs/dlock-rs): a [`PostgresLock`] implements
//! [`dlock_api::DistributedLock`] with **session advisory locks**, and the crate adds helpers
//! for locks that live inside *your* transaction: [`xact_lock`] (transaction-scoped advisory
//! locks) and [`RowLock`] (`SELECT … FOR UPDATE` with `NOWAIT`, `SKIP LOCKED` or a bounded wait).
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use dlock_api::{DistributedLockExt, LockOptions};
//! use dlock_postgres::PostgresLock;
//! use std::time::Duration;
//!
//! let locks = PostgresLock::connect_url("postgres://app:secret@127.0.0.1:5432/shop").await?;
//! let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(5));
//! let guard = locks.acquire_str("coupon:42", &opts).await?;
//! // … read, change and COMMIT, passing guard.fencing_token() to the storage …
//! guard.release().await?; // after the commit, never before
//! # Ok(()) }
//! ```
//!
//! ## Which of the three to use
//! | you want | use | released by | fencing |
//! |---|---|---|---|
//! | a lock around work that is not one transaction (calls to other services, several transactions) | [`PostgresLock`] (`DistributedLock`) | `release()` / drop / the connection closing | token from a sequence |
//! | a lock around one transaction on this database | [`xact_lock`] / [`try_xact_lock`] | the transaction's commit or rollback | not needed: the writes and the lock end together |
//! | to lock the rows you are about to change | [`RowLock`] | the transaction's end | not needed |
//!
//! The transaction-scoped forms are the strongest version of the *commit before unlock*
//! rule: the commit itself releases the lock, so no one can see the lock free before your writes
//! are committed.
//!
//! ## How the session locks work
//! - **Keys**: a name maps to the 64-bit advisory key space with
//!   [`KeyMapper::hash_i64`](dlock_api::KeyMapper::hash_i64) (first 8 bytes of SHA-256). A
//!   collision (odds n²/2^65 for n names in use) only makes two names wait for each other; the
//!   server's exclusion is on the key, so it never lets two holders in. Callers with integer
//!   keys pass an [`AdvisoryKey`] to [`PostgresLock::acquire_key`].
//! - **try_acquire** is one statement on a shared session:
//!   `SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('dlock_fence_seq_fast') END`, the
//!   lock and its fencing token in one round trip (see *Fencing* for the token).
//! - **acquire** tries that first; when the lock is busy it borrows a connection that holds
//!   nothing and waits **on the server** with `pg_advisory_lock` under `lock_timeout` (the
//!   remaining wait, at most `wait_slice`), token in the same statement. The server's lock queue
//!   wakes it the moment the holder unlocks: hand-off is one round trip, no polling. Only a
//!   client's first waiter for a key waits at the server; its other tasks waiting for the same
//!   key queue in the client (FIFO) and step up in turn, so a flood of waiters does not take a
//!   connection each (the server still decides every grant and token). After the
//!   grant, that connection is a session like the others.
//! - **Sessions**: one client keeps a few connections (at most `max_connections`), each
//!   holding many locks, so a client can hold thousands of locks on a handful of connections. A
//!   key is never locked twice on one session (advisory locks *stack* per session: a second lock
//!   would let a second guard in and leave a stacked lock behind), and a lock is always released
//!   on the session that took it.
//! - **Fencing**: tokens are taken while the lock is held, from sequences with `CACHE 1` (a
//!   cached sequence hands each session its own block of values, out of order across clients),
//!   so they rise strictly across clients, and they keep rising across a crash:
//!   - the token is drawn from an **unlogged** sequence (`dlock_fence_seq_fast`), which writes
//!     no WAL, and is good only above 0 and below a limit that the durable sequence
//!     (`dlock_fence_seq`) has reserved in a committed, flushed transaction (recorded in the
//!     one-row table `dlock_fence_seq_window`, cached by each client);
//!   - a crash resets the unlogged sequence to the least `bigint`, so the next token drawn is
//!     negative; that token, and one past the limit, is exchanged in one more round trip by
//!     `dlock_fence_seq_renew(size)`, which reserves the next `fence_window` values (one WAL
//!     flush) and moves the unlogged sequence above every reservation;
//!   - so the WAL is flushed once per `fence_window` (a million) tokens and after a crash,
//!     instead of once per 32 acquires as a `nextval` on a durable sequence needs. With
//!     `fence_window=0`, and before PostgreSQL 15 (no unlogged sequences), every acquire takes
//!     `nextval('dlock_fence_seq')` instead. dlock's connections run with
//!     `synchronous_commit=on`, so neither way goes back after a crash.
//!
//!   The durable sequence is dlock's alone: clients taking `nextval` from it directly (an older
//!   dlock, or `fence_window=0`) while window-mode clients run would hand out tokens out of
//!   order with theirs; a deployment switches all its clients at once.
//! - **Lost detection**: a connection holding locks is pinged every `keepalive` (1 s); a failed
//!   ping, a failed statement, or the server ending the session (`pg_terminate_backend`, a
//!   restart) closes the session and fires `lost(SessionClosed)` on **every** guard it held.
//! - **Crash liveness**: if the client process dies, its connections close and the server frees
//!   the locks at once; if the client's host vanishes without closing them, the server's TCP
//!   keepalive (set per connection: 10 s idle, 5 s × 3 probes, about 25 s) ends the session.
//! - **Cancel safety**: a dropped `acquire` sends `pg_cancel_backend` for its server-side wait.
//!   A cancel (or `lock_timeout`) can land after the server granted the lock inside the
//!   statement, and a session lock outlives the failed statement: so every wait that ends
//!   without a guard is undone with an owner-checked `pg_advisory_unlock` before its
//!   connection is used again (or the connection is closed). A dropped non-blocking attempt
//!   queues the same unlock on its session. A waiter whose connection is killed opens a new
//!   one and keeps waiting within its wait timeout.
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`;
//!   [`PostgresLock::inspect_key`] for integer keys) reads the key's rows in `pg_locks` for this
//!   database: the holder's backend pid and how many wait at the server (waiting *clients*,
//!   since a client's other waiters for a key queue in the client). The holder's fencing token
//!   is not known (the fence sequence is shared by every name, so the server keeps no token per
//!   key), and there is no remaining lease (the connection is the lease). One connection is kept
//!   for it, opened on first use.
//!
//! ## Semaphores
//! [`acquire_permit`](dlock_api::DistributedLock::acquire_permit) of a name with `N` permits
//! (2 ≤ `N` ≤ 64; one permit is a lock) holds, on one pooled session, three advisory locks of
//! keys derived from the name's key `K` (each the 64-bit hash of a name made from
//! `pg-advisory:K`, so as unlikely to meet another name's key as two names are):
//! - **a slot**, `K#i` for one `i < N`, exclusively: the permit itself. An attempt tries every
//!   slot in one statement, from a random one on, and takes the first free one; at most `N`
//!   hold at once because there are `N` slots.
//! - **the name's key `K`, shared**: a lock's `pg_try_advisory_lock(K)` is busy while any permit
//!   is held, and a permit's shared attempt is busy while a lock holds the name (or waits for
//!   it), so a lock and permits never hold a name together. When a lock attempt finds the key
//!   held in share mode only (a shared attempt in the same statement, made only when the lock
//!   is refused and given back at once; `pg_locks` then gives the limit), it is refused with
//!   [`permits_mismatch`](dlock_api::raw::permits_mismatch) rather than called busy.
//! - **the limit key `K#permits=N`, shared**: the name's limit, kept on the server by the holders
//!   themselves.
//!
//! A reader of a reader-writer lock holds `K` shared too, with the limit key of one beside it
//! (see [`PostgresLock`], *Reader-writer locks*): to a permit's checks, readers are a lock, and
//! a name is used by readers and a writer or by permits, never both.
//!
//! **One limit per name.** Every permit attempt first takes the name's gate key (`K#gate`) for
//! its own statement only (a transaction-scoped lock, released when the statement ends,
//! whatever happens to it), so the checks of two attempts on a name never interleave; holders
//! only ever leave meanwhile, which cannot make a check wrong in the unsafe direction. Under the
//! gate, the attempt takes `K` exclusively for the statement: if it can, nobody holds the name,
//! and this attempt sets its limit. If it cannot, it takes the limit key exclusively for the
//! statement: if it can, nobody holds this limit, so the name is held by a lock or by permits of
//! another limit, and the attempt is refused, nothing taken (`pg_locks` then says which
//! number, for the error). If it cannot, permits of this same limit are held, and the attempt
//! joins them. So every session holding `K` shared holds the same limit key, and two limits
//! (or a lock and permits) never hold a name at once; two attempts racing for a free name with
//! different limits both see the other at worst, and both are refused.
//!
//! **What ends a permit**: its release (an owner-checked `pg_advisory_unlock` of the slot, with
//! the shared keys, on its own session), or its session ending, exactly as a lock (keepalive,
//! `lost(SessionClosed)` on every guard of a dead session). The client puts at most one permit
//! of a name on each of its sessions (advisory locks stack per session), so one client holds at
//! most as many permits of a name as it has connections.
//!
//! **Waiting, in line**: advisory locks cannot wait for *any* of several keys, so waiters line
//! up for the name's waiting room `K#room` instead: a waiter (one per client and name, the
//! others queue in the client as for locks) waits for it in the server's lock queue (roughly
//! FIFO across clients, and a cancel reaches it there), and the one holding it is first in
//! line. That one listens on the channel `dlock_permit_K` (the client's one `LISTEN`
//! connection, shared with leader observers), then tries every slot, and tries again when
//! notified or every 500 ms. A release, after freeing its slot in the same statement, looks at
//! the room: taken, it `pg_notify`s the channel; free (nobody waiting), it notifies nobody. So
//! one release wakes one waiter, not every client's, and costs nothing when nobody waits. A
//! holder whose session ends notifies nobody: its permit is found at the next 500 ms try. The
//! first waiter leaves the room when granted, when its wait runs out (`wait_slice` at most, then
//! it lines up again at the back), or when its acquire is dropped (the client's interrupt
//! reaches it between statements, where `pg_cancel_backend` would find nothing to cancel); a
//! connection that cannot give the room back is closed, which gives it back.
//!
//! **Fencing**: each permit's token is drawn in the statement that took its slot, from the
//! same sequences as a lock's, so it is above every earlier grant's of the name.
//! [`count_permits`](dlock_api::DistributedLock::count_permits) counts the name's slot keys
//! granted in `pg_locks` (a lock held counts as one). A lock that began waiting at the server
//! before the name was taken as a semaphore keeps waiting (never holding with the permits), and
//! holds off new permits until the held ones are gone.
//!
//! ## URL
//! `postgres://[user[:password]@][host][:port][/database][?option=value…]` (or `postgresql://`);
//! options are listed on [`PostgresConfig`]. As with libpq, a host that is a path is the
//! directory of the server's Unix socket: `postgres://app@%2Fvar%2Frun%2Fpostgresql/shop`
//! (percent-encoded) and `postgres:///shop?host=/var/run/postgresql&user=app` both connect
//! through `/var/run/postgresql/.s.PGSQL.5432`; a URL with no host at all uses that socket (or
//! `/tmp`'s) if it exists, and `localhost` if not.
//!
//! ### TLS
//! With the `tls-rustls` feature, libpq's options ask for TLS:
//! `?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem` checks the server's certificate against
//! your CA and its name against the host (without `sslrootcert`, against the webpki roots);
//! `sslmode=require` encrypts without checking; `sslcert` and `sslkey` present a client
//! certificate. The default is `disable`. A certificate the client does not trust, or a server
//! that will not speak TLS, is a [`LockError::Config`](dlock_api::LockError::Config) at
//! connect, as is a certificate file that cannot be read (before any network call). Without the
//! feature, a URL that needs TLS is refused when parsed, never sent in the clear.
//!
//! ### Through PgBouncer: session mode only
//! Session advisory locks belong to the server session that took them. PgBouncer in
//! *transaction* (or statement) pooling mode hands a different server session to each
//! transaction, so a lock stays with a server connection that other clients then use: their
//! `pg_try_advisory_lock` of the same key *stacks* on it and succeeds, and two clients hold the
//! lock. [`PostgresLock::connect`] looks for this (two connections read `pg_backend_pid()`, one
//! of them inside a transaction; the pooler shows up as a shared or changing backend) and refuses
//! with a [`Config`](dlock_api::LockError::Config) error. The check cannot see every pooler (a
//! busy one may happen to hand out stable backends), so do not rely on it: point dlock at
//! Postgres directly, or at a PgBouncer pool in *session* mode, where dlock passes its whole
//! conformance suite (dlock sends no start-up parameters PgBouncer refuses; its session
//! settings are set per connection). [`xact_lock`] and [`RowLock`] work in any mode: they live
//! inside one transaction.

//! ## Cargo features
//! - `tls-rustls`: TLS to the server (`sslmode=…`) with rustls.
//! - `driver`: `PostgresConfig::connect_options`, the sqlx options of every connection dlock
//!   opens (this crate's transaction-scoped locks take your sqlx transaction, so `sqlx` is
//!   re-exported either way), for tools that talk to the same server with the driver directly, as
//!   `dlock bench`'s raw floors do. These types follow the driver's versions, so they are opt-in
//!   and outside this crate's stable surface.
//! - `testing`: hooks dlock's own fault suites use; not for applications, not covered by semver.
//!
//! ## Performance
//! `dlock bench --backend postgres://… --rounds 3 --duration 2s` measures this backend against its
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
mod fence;
mod inspect;
mod key;
mod listen;
mod lock;
mod pooler;
mod sql;
mod tls;
mod xact;

pub use config::PostgresConfig;
pub use key::AdvisoryKey;
pub use lock::PostgresLock;
pub use tls::SslMode;
pub use xact::{RowKey, RowLock, RowLockOutcome, RowWait, try_xact_lock, xact_lock};

/// The sqlx version these helpers take transactions of ([`xact_lock`], [`RowLock`]).
pub use sqlx;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`PostgresConfig::from_url`], then [`PostgresConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, PostgresConfig, PostgresLock);

pub(crate) const BACKEND: &str = "postgres";
