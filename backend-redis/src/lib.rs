//! # dlock-redis: distributed locks on Redis
//!
//! The Redis backend for [dlock](https://docs.rs/dlock): a [`RedisLock`] implements
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
//! - **Acquire** is one Lua script: `SET PREFIX:{NAME} OWNER NX PX TTL`, and on success it raises
//!   the name's fence key and returns the new fencing token; on failure it returns the holder's
//!   remaining TTL. Scripts go by SHA (`EVALSHA`) and fall back to `EVAL` when the server forgot
//!   them (restart, `SCRIPT FLUSH`).
//! - **Waiting**: a busy acquire joins the name's FIFO queue (`PREFIX:{NAME}:queue`) and subscribes
//!   to `PREFIX:{NAME}:released` (once per name per client; all of a client's subscriptions ride its
//!   one RESP3 connection).
//! - **Release** compares the owner, deletes the lock and, in the same script, **grants** it to the
//!   first live waiter: sets the lock to that waiter's owner token, raises the fence, and publishes
//!   `granted OWNER TOKEN`. The waiter holds the lock the moment the message arrives, so a hand-off
//!   costs about one round trip instead of a poll interval, and waiters are served in order.
//!   With nobody waiting it publishes `free`. **Extend** is a compare-and-`PEXPIRE`.
//! - **Renewal**: the shared dlock watchdog extends the lease every TTL/3; when the key is gone or
//!   someone else's, or the server stays unreachable until the lease ends, the guard's `lost`
//!   fires.
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
//! `PREFIX:{NAME}` (the lock; value = owner, TTL = lease), `PREFIX:{NAME}:fence` (last token; kept
//! without TTL so tokens never repeat: one small key per name ever locked), `PREFIX:{NAME}:queue`
//! and `PREFIX:{NAME}:waiters` (the waiters, expiring with them), channel `PREFIX:{NAME}:released`. Braces in names are escaped so the hash tag is always the whole name.
//!
//! ## When a Redis deployment forgets a lock
//! A Redis server can lose a held lock without anyone releasing it, and no client is told:
//! - **Eviction.** Lock keys carry a TTL, so a server with `maxmemory` and any policy but
//!   `noeviction` may delete one to make room. At connect the client reads `maxmemory*` and, if
//!   eviction is possible, logs a warning (`eviction_check=warn`, the default), refuses with
//!   [`LockError::Config`](dlock_api::LockError::Config) (`eviction_check=refuse`), or does not ask
//!   (`off`). Run lock servers with `maxmemory-policy noeviction`.
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
//! ## Performance
//! Measured with `dlock bench --backend redis://… --rounds 3 --duration 2s` (release build)
//! against a local redis-server on a 2-core VM. The bench measures dlock and the raw floor in
//! alternating slices of the same run; figures are medians with [min–max] over the rounds.
//! Absolute latencies on such a VM drift with the host's load (and with how slowly its idle
//! vCPUs wake); the ratios are what carries over.
//!
//! | measurement | dlock | raw floor, same run | ratio |
//! |---|---|---|---|
//! | uncontended acquire + release, 1 client | 4,520 pairs/s, p50 212 µs, p99 362 µs | `SET NX PX` + `EVALSHA` compare-and-delete: 5,664 pairs/s, p50 169 µs | 0.80× [0.79–0.82] (0.83× in another run) |
//! | hand-off, 4 clients on one name, 2 ms hold | p50 435 µs, p99 673 µs | 4 raw connections contending through the same loop (`DEL`+`PUBLISH`, the woken waiters racing `SET NX`): p50 460 µs | 0.92× [0.89–1.13] |
//! | many names, one client, 1 task | 5,589 pairs/s | 8,906 pairs/s | 0.64× [0.63–0.67] |
//! | many names, one client, 16 tasks | 21,384 pairs/s | 42,873 pairs/s | 0.58× [0.45–0.68] |
//!
//! The polling peers hand a lock off in 27–99 ms; dlock's grant hand-off is about 100× faster:
//! the grant reaches the waiter in the release's own round trip, and it beats the raw notified
//! hand-off, whose woken waiters still have to send their `SET NX`.
//!
//! On a second VM of the same size the uncontended ratio was 0.84–0.90×, the hand-off
//! 0.89–0.98×, and many names on one client 1.09× / 0.91× / 0.68× / 0.51× of the raw floor
//! with 1 / 4 / 16 / 64 tasks (53.5k pairs/s against 86.7k at 64).
//!
//! On a fifth: uncontended 0.87× [0.83–0.88], hand-off 0.90×, many names 1.00× / 0.86× / 0.54×
//! with 1 / 4 / 16 tasks. With 64 tasks, 66k pairs/s against 142k; per pair, the server's CPU
//! time was 10.5 µs against 5.1 µs and the client's 11.3 µs against 6.4 µs (process CPU
//! times over the run), so both sides spend about twice the raw pair's. Counted with
//! callgrind there, the client adds 11k instructions per pair to the same two scripts sent from
//! a bare connection (47k against 36k), none of it in one place: moving futures into boxes,
//! allocation, the span, key and owner strings, timeouts.
//!
//! An uncontended pair makes the same system calls as the raw pair (two writes, two reads, the
//! same wake-ups); what it pays more is **server time**. The raw pair is one plain command and one
//! two-call script; dlock's is two scripts: the first attempt of an acquire (`EXISTS` on the
//! queue, `SET NX PX`, `TIME`, one `GETSET` that stores the clock and returns the last token) and
//! the release (`GET`, `DEL`, `LPOP`). Redis's own `INFO commandstats` puts them at about 21 µs
//! of server time per dlock pair against 9 µs per raw pair (a plain `SET` takes 1.9 µs; an
//! `EVALSHA` at least 7, whatever it calls). Counted with callgrind on redis-server 7.0, that is
//! 93.6k instructions per dlock pair (110.7k before the first-attempt script) against 34k: each
//! script costs about 11.5k to set up and each call from Lua about 5k (Redis 7 turns every reply
//! into RESP and parses it back into Lua). It is also what bounds throughput with many tasks on
//! one connection, where the server is the busy side.
//!
//! On a sixth VM, with each variant's commands piped 200,000 times into one server (command
//! time from `INFO commandstats`, the least of 8 rounds): the raw pair 2.7 µs; dlock's first
//! attempt with a compare-and-delete release 9.0 µs; the same with its token from a plain `INCR`
//! 6.2 µs, so the clock floor (`TIME`, the `GETSET`, the formatting) costs about 3 µs; without
//! the queue check 9.1 µs; an empty script 2.1 µs per call. Passing the clock to `GETSET` as a
//! Lua number (exact under `%.17g`) instead of a built string measured no cheaper.
//!
//! What else was measured, with the same two scripts sent from a bare `redis` connection (no
//! dlock around them), in alternating slices against the raw pair:
//! - the scripts alone reach 0.91–0.96× of the raw pair: the client library (keys, owner token,
//!   guard, renewal timer, cleanup on cancel) adds the rest, about 7.7k client instructions per
//!   pair, 2–3 µs;
//! - dropping the queue check and the `LPOP` (two calls fewer) moved nothing outside the noise;
//! - an acquire as `MULTI`/`SET NX PX`/`EXISTS`/`INCR`/`TIME`/`EXEC` (4 µs of server time)
//!   measured 0.90–0.94× uncontended and about 20% more pairs/s with 64 tasks, but a transaction
//!   cannot take the maximum of the last token and the clock, so it would lose the fence's
//!   clock floor.
//!
//! - a stream's auto-generated ID is the one plain command that keeps such a floor (`XADD fence
//!   MAXLEN 1 *` returns an ID above the last one and at least the server clock in ms); sent with
//!   `EXISTS` and `SET NX PX` as one pipeline it measured 0.87× (and 0.89× in `MULTI`), below the
//!   scripts' 0.92–0.94× in the same run: `XADD` alone costs the server more than the script.
//!
//! - a transaction for *hot* names (`MULTI`, `EXISTS`, `SET NX PX`, `INCR`, `TIME`, `EXEC`,
//!   used for a name this client locked within the last millisecond, the token kept only if
//!   it lies at most 2 ms below the server clock, else floored by a script: the clock floor
//!   within 2 ms) measured the same as the scripts on a fourth VM, 0.79–0.81× of the raw pair
//!   either way in alternating slices, and no better with 16 tasks on one connection: there each
//!   of the transaction's six commands pays the server's per-command cost, which ate what
//!   skipping the script's Lua set-up saved. Not kept.
//!
//! On a seventh VM, with each process's CPU time read from `/proc/<pid>/task/*/schedstat` over
//! thousands of back-to-back pairs: a pair costs the client 65–135 µs and the server 60–100 µs
//! of CPU there, not the few µs of a pipelined run, because each of its round trips wakes an
//! idle vCPU. dlock's pair cost the server about 15 µs more than the raw pair's, its two scripts
//! run cold; the client's extra cost depends on where the pair runs: about 15 µs more on the
//! `block_on` thread, where every reply crosses threads, and none that the noise shows in a
//! spawned task. `dlock bench` measures the uncontended pair on the `block_on` thread (0.81–0.92×,
//! median 0.89× over seven runs); its "many names, 1 task" row is the same pair in a spawned task
//! (0.82–1.17×, median 0.98×). Counted with callgrind, the client's instructions per pair went from
//! 52.3k to 49.1k (raw pair: 36.2k) once the acquire path's metric keys were built once per
//! backend rather than per call, and span fields were no longer recorded on a span no
//! subscriber wants.
//!
//! On an eighth VM, whose round trips are about twice as fast (a raw pair takes 55–60 µs in a
//! spawned task), the server's share shows most. Sent from a bare connection in alternating
//! slices against the raw pair: a script doing nothing but `SET NX PX` (with the raw pair's
//! compare-and-delete) measured 0.90–0.94×, the same with an `INCR` token 0.89–0.93×, dlock's
//! first attempt without the queue check 0.83–0.88×, with it 0.83–0.86×, and with dlock's release
//! 0.83–0.86×; the whole dlock pair 0.78–0.83× (`dlock bench`: 0.80–0.81×). So on Redis 7.0 any
//! acquire that runs a script stays below 0.95× there, and the clock floor's `TIME` and `GETSET`
//! cost about as much again as the script's set-up. Plain commands in one pipeline measured:
//! `EXISTS`, `SET NX PX` and `INCR` 0.94–1.01× (no clock floor); `SET NX PX` and `XADD … MAXLEN ~
//! 100 *` (whose ID is floored by the server clock in ms) 0.89–0.96×; `EXISTS`, `SET NX PX` and
//! `XADD … MAXLEN 1 *` 0.84–0.85×, and 0.79–0.85× in `MULTI`. None of them gets past 0.95× once
//! the client's own work is added, which costs about 5% more there.
//!
//! On a ninth VM, with round trips as slow as the seventh's (a raw pair in 190–210 µs), the
//! uncontended pair measured 0.85–0.90× over four runs and 0.90× with 1 task, and the bench's
//! own CPU columns split the gap: dlock's pair cost the bench process 138 µs of CPU against the
//! floor's 122 µs, with the same context switches per pair (8.9 against 8.7), and the server
//! 7.8–10.1 µs for the first-attempt script and 3.7 µs for the release, against 1.3 µs for the
//! floor's `SET` and 2.5 µs for its compare-and-delete (`INFO commandstats`, each piped 20,000
//! times). With 64 tasks on one connection the server's CPU per pair (from `/proc`, I/O
//! included) was 13–15 µs against 6.8 µs, which is why dlock reaches half the floor's pairs/s
//! there.
//!
//! What each part of the acquire script costs the server (`INFO commandstats`, a third VM,
//! `EVALSHA` µs per call): an empty script 3.1; `SET NX PX` alone 7.2; with the queue check
//! 6.9; with `TIME` 8.3; the whole first attempt, with the token's `GETSET` and arithmetic,
//! 10.7; a compare-and-delete 5.6 and dlock's release 5.2. On that VM the whole dlock pair
//! measured 0.84–0.87× of the raw pair, and the two scripts alone from a bare connection
//! 0.90–0.94×.
//!
//! That floor (tokens at least the server clock in µs, so they keep rising after a restart or a
//! failover that lost the counter) needs a script, `TIME` and a read-modify-write of the last
//! token; the queue check keeps FIFO when a holder expired with waiters queued. They are why the
//! ≥ 0.95× goal is not met: both stay. (Redlock, whose per-node counters have no clock floor,
//! takes its first attempt with plain pipelined commands instead:
//! [`node::Counting::EveryAttempt`].)
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod config;
mod conn;
mod error;
mod eviction;
mod keys;
mod lease;
mod lock;
pub mod node;
mod scripts;
mod wake;

pub use config::{RedisConfig, Topology};
pub use eviction::EvictionCheck;
pub use keys::LockKeys;
pub use lock::RedisLock;

/// The URL schemes this backend serves.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

pub(crate) const BACKEND: &str = "redis";
