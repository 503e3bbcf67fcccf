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
//! - **Renewal**: the shared dlock watchdog extends the lease every TTL/3; when the key is gone or
//!   someone else's, or the server stays unreachable until the lease ends, the guard's `lost`
//!   fires.
//! - **Takeover signal**: a lock held for 250 ms marks the name's fence with its client's id, on
//!   a subscription to the client's own channel (`PREFIX:held-by:CLIENT`, one for all its held
//!   locks, on a connection of its own); whoever takes the lock over a key that went without a
//!   release publishes `taken` there, and the old holder's `lost` fires as it arrives rather than
//!   at its next renewal.
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
//! ## Performance
//! Measured with `dlock bench --backend redis://… --rounds 3 --duration 2s` (release build)
//! against a local redis-server 7.0 on 2-core VMs; the bench measures dlock and the raw floor in
//! alternating slices of the same run, and ratios are medians over the rounds. Absolute
//! latencies on such VMs drift with the host's load and with how slowly idle vCPUs wake (a raw
//! pair took 55–60 µs on one, 190–220 µs on others); the ratios are what carries over.
//!
//! | VM | uncontended pair (goal ≥ 0.95×) | hand-off p50, 4 clients, 2 ms hold (goal ≤ 1.2×) | many names, 1 / 4 / 16 / 64 tasks |
//! |---|---|---|---|
//! | A | 0.80–0.83× (4,520 pairs/s against 5,664, p50 212 µs against 169 µs) | 0.92× (p50 435 µs against 460 µs) | 0.64× / – / 0.58× / – |
//! | B | 0.84–0.90× | 0.89–0.98× | 1.09× / 0.91× / 0.68× / 0.51× (53.5k pairs/s against 86.7k) |
//! | C, D | 0.84–0.87×, 0.83× | 0.82–0.98×, 0.89× | |
//! | E | 0.86–0.87× | 0.90× | 1.00× / 0.86× / 0.54× / 0.46× (66k pairs/s against 142k) |
//! | F | 0.88× | 0.91× | |
//! | G | 0.81–0.92× (median 0.89× over seven runs) | 0.82–0.99× | 1 task: median 0.98× |
//! | H | 0.80–0.81× | 0.92× | |
//! | I | 0.85–0.90× (four runs) | 0.78–0.85× | 0.90× / 0.83× / 0.51× / 0.51× |
//! | J | 0.83×, 0.83×, 0.84×; in a spawned task 0.87× (below) | 0.80×, 0.82×, 0.97× | 0.88× / 0.73× / 0.59× / –, 0.82× / 0.89× / 0.54× / – |
//! | K | 0.94× [0.93–0.94], 0.93× [0.90–0.95] | 0.74×, 0.76× | 1.05× / 0.97× / 0.56× / –, 1.01× / 0.93× / 0.51× / – (52k pairs/s against 102k) |
//! | L | 0.91–0.94× (seven runs) | 0.77–0.87× | 1.04× / 0.95× / 0.51× / – (54k pairs/s against 104k) |
//! | M | 0.85–0.94× (twelve runs); 0.93–0.98× of the fenced floor | 0.87–0.93× | 1.14× / 0.92× / 0.67× / – (46k pairs/s against 72k); of the fenced floor 1.18× / 1.00× / 0.94× / – |
//! | N | 0.84–0.91× (four runs); 0.92–0.96× of the fenced floor | 0.79–0.92× | 0.96–1.00× / 0.81–0.87× / 0.50–0.58× / – (27–31k pairs/s against 53–58k); of the fenced floor 0.92–1.02× / 0.88–1.01× / 0.87–0.95× / – |
//! | X | 0.89–0.94× (three runs); 0.93–0.99× of the fenced floor (0.96× over seven rounds), after the queue marks | 0.81–0.92× | 0.96–0.99× / 0.85–0.91× / 0.63–0.65× / –; of the fenced floor 0.99–1.02× / 0.96–1.01× / 1.18–1.20× / – |
//!
//! The hand-off is faster than the raw notified hand-off because the grant reaches the waiter
//! in the release's own round trip, where the raw waiters, once woken, still send their
//! `SET NX`; the polling peers hand a lock off in 27–99 ms, about 100× slower. Against the
//! plain floor the uncontended goal is met on none of them, for the reasons below (VM K came
//! within 0.01–0.02 of it): no scripted lock with a clock-floored token can meet it. From VM X
//! on the goal is read against the fenced floor, which hands out the token dlock does.
//! `dlock bench` measures the uncontended pair on the thread that called `block_on`, where every
//! reply crosses threads and finds the client's code cold; its "many names, 1 task" row is the
//! same pair in a spawned task, as a service's handlers run, and reads higher on VMs whose idle
//! vCPUs wake slowly.
//!
//! Since VM M the bench also measures a **fenced floor** in the same slices: the raw pair with
//! its `SET NX PX` in a script that takes a token as dlock's does (`TIME`, `GETSET`), released by
//! the same compare-and-delete. dlock measured 0.93–0.98× of it uncontended (median 0.96× over ten
//! runs) and 0.91–0.96× with 16 tasks, against 0.85–0.94× and 0.66–0.71× of the plain floor: most
//! of what dlock loses to the plain pair is what the clock-floored token costs the server, the
//! cost of the first section below, and dlock's own code is the smaller part.
//!
//! ### Where the uncontended pair's time goes
//! It makes the same round trips, system calls and context switches as the raw pair (on VM I,
//! 8.9 switches per pair against 8.7). What it pays more:
//! - **Server time.** The raw pair is a plain `SET NX PX` and a two-call compare-and-delete
//!   script; dlock's is two scripts: the first attempt (`SET NX PX`, `TIME`, one `GETSET` that
//!   stores the clock and returns the last token) and the release (`GET`, `DEL`). Before the
//!   queue marks (VM X) the first attempt also ran `EXISTS` on the queue and the release `EXISTS`
//!   on it too, with one key more each; before VM Q the release was the full one, with
//!   `LPOP`. What follows was measured with the `EXISTS` calls in place (VM I, four
//!   keys). Piped 20,000 times into one server (`INFO commandstats`, VM I): the first attempt
//!   7.8–10.1 µs and the release 3.7 µs, against 1.3 µs for the `SET` and 2.5 µs for the
//!   compare-and-delete. Built up call by call: an empty script 1.5 µs, `SET NX PX` alone
//!   3.9, with the queue check 5.5, with `TIME` 5.9, the whole first attempt 7.8: each call from
//!   Lua costs about 1.5 µs, because Redis 7 turns every reply into RESP and parses it back into
//!   Lua (callgrind on redis-server: about 11.5k instructions to set a script up, 5k per call;
//!   93.6k per dlock pair against 34k per raw pair). On a 200 µs pair that is 4%, on a 100 µs
//!   pair 8%: even a client that cost nothing would stay at about 0.96× and 0.92×. With many
//!   tasks on one connection the server is the busy side (VM I, 64 tasks: 13–15 µs of server CPU
//!   per pair, I/O included, against 6.8 µs; VM E: 10.5 against 5.1), which is why dlock reaches
//!   about half the floor's pairs per second there.
//! - **Client work.** About 10–13k instructions per pair more than the raw pair (callgrind;
//!   49.1k against 36.2k on VM G), none of it in one place: futures boxed and moved, about 14
//!   allocations, the key and owner strings, timeouts, the renewal timer entry, the guard. Since
//!   the rare paths (Sentinel refresh, script reload, the queued wait) are boxed apart from the
//!   fast path, a pair allocates 7.1 KB instead of 12.5 KB, and on VM L it ran 43.1k
//!   instructions against the raw pair's 38.9k (4.2k more: 1.3k in allocations, 1.3k in the
//!   scripts' longer argument lists, the rest in the engine and the guard). On
//!   VMs whose idle vCPUs wake slowly every reply finds that code cold, and it costs 13–16 µs of
//!   process CPU per pair (VM I: 138 µs against 122 µs, `dlock bench`'s CPU column). Sent from a
//!   bare connection with no dlock code around them, the two scripts alone measured 0.90–0.96×
//!   of the raw pair on three VMs and 0.83–0.86× on VM H.
//! - **Any scripted lock, against the plain pair (VM J).** One program ran, in alternating
//!   slices in one spawned task, the raw pair, scripted locks sent from a bare connection, and
//!   dlock, ten times (medians, each spread over about ±5%):
//!
//!   | pair | vs the raw pair | client / server CPU per pair (µs, server from `/proc`, I/O included) |
//!   |---|---|---|
//!   | raw: `SET NX PX`, compare-and-delete script | 1.00× | 57–66 / 56–65 |
//!   | a script doing only `SET NX PX`, compare-and-delete | 0.96× | 58–72 / 59–71 |
//!   | the same with the clock-floored token (`TIME`, `GETSET`) | 0.93× | 56–72 / 59–76 |
//!   | dlock's first attempt and release, from a bare connection | 0.95× | 59–63 / 68–75 |
//!   | dlock (`acquire`, `release`) | 0.87× (0.83–0.91×) | 65–79 / 64–80 |
//!
//!   A lock written as a Redis script sits at or just under 0.95× before a client adds anything;
//!   against its own scripts in the same slices dlock measured 0.93× (median of seven), its
//!   client's 7k more instructions per pair (callgrind: 40.5k against 33.4k for the bare
//!   scripts; futures moved into boxes 1.2k, allocations 0.9k, clock reads 0.4k, the owner token
//!   0.4k, the rest below 0.4k each).
//!
//! ### What the scripts keep, and what was tried instead
//! The fence's clock floor (tokens at least the server clock in µs, so they keep rising after a
//! restart or a failover that lost the counter) needs `TIME` and a read-modify-write of the last
//! token, so a script. FIFO when a holder expired with waiters queued is kept by the queue marks,
//! which the first attempt and its release find in the values they read anyway. Measured against
//! the raw pair in alternating slices and not kept:
//! - plain pipelined `EXISTS`, `SET NX PX`, `INCR`: 0.94–1.01×, but no clock floor;
//! - `MULTI`/`SET NX PX`/`EXISTS`/`INCR`/`TIME`/`EXEC` (4 µs of server time): 0.90–0.94×, and
//!   about 20% more pairs/s with 64 tasks, but a transaction cannot take the maximum of the last
//!   token and the clock;
//! - a stream's auto-generated ID as the token (`XADD fence MAXLEN 1 *`, floored by the server
//!   clock in ms) with `EXISTS` and `SET NX PX`: 0.84–0.87× piped, 0.79–0.89× in `MULTI`;
//!   `XADD … MAXLEN ~ 100 *` with `SET NX PX` 0.89–0.96×, still without the queue check;
//! - a transaction for names this client locked within the last millisecond (the clock floor
//!   within 2 ms): the same as the scripts, 0.79–0.81×, and no better with 16 tasks, where each
//!   of its six commands pays the server's per-command cost;
//! - the first attempt without the queue check, or the release without its `LPOP`: within the
//!   noise (9.1 µs against 9.0 µs of server time on VM F; the queue marks later did it without
//!   giving up FIFO, and counted by instructions it was not noise, below);
//! - the clock passed to `GETSET` as a Lua number instead of a built string: no cheaper (VM M,
//!   warm server: 4.86 against 4.84 µs per first attempt; there a script with its three keys and
//!   two arguments that returns at once costs 1.27 µs, and `EXISTS` 0.30, `SET NX PX` 1.15, `TIME`
//!   0.63, building the clock string 0.46 and `GETSET` 0.50 more, 4.96 µs in all against 0.62 µs
//!   for the plain `SET`);
//!   `FCALL` of a Redis function instead of `EVALSHA`: 0.25 µs less per call;
//! - a whole-program build (fat LTO, one codegen unit): no change.
//!
//! What did help, kept: the first attempt as its own, smallest script (110.7k → 93.6k server
//! instructions per pair); the release of a lock taken with nobody queued as its own script with
//! two keys and one argument instead of four and two, falling back to the full release only if
//! waiters queued while it was held (VM Q: 90.7k → 86.1k server instructions per pair, counted by
//! callgrind on a private redis-server over about 6,000 pairs each; with 16 tasks on one
//! connection 14.7–16.8 µs of server CPU per pair against 17.1–20.3 µs, in alternating runs);
//! the acquire path's metric keys built once per backend rather than per call, and no span fields
//! recorded on a span no subscriber wants (client instructions per pair 52.3k → 49.1k); guards
//! renewed from one timer per client instead of a task per guard; the queue marks (VM X), with
//! which the first attempt and its release are the fenced floor's own script and the plain
//! compare-and-delete (87.4k → 77.5k server instructions per pair, against 76.8k for the fenced
//! floor's pair and 34.2k for the plain one; callgrind on a private redis-server, 3,000 pairs
//! each, after 200 to warm up).
//! Redlock, whose per-node counters have no clock floor, takes its first attempt with plain
//! pipelined commands ([`node::Counting::EveryAttempt`]).
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod config;
mod conn;
mod connect;
mod driven;
pub mod driver;
mod error;
mod eviction;
mod held;
mod keys;
mod lease;
mod lock;
pub mod node;
mod scripts;
mod wake;

pub use config::{EvictionCheck, RedisConfig, Topology};
pub use keys::LockKeys;
pub use lock::RedisLock;
/// The `redis` crate this backend is built with, whose clients [`driver`] hands out.
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

pub(crate) const BACKEND: &str = "redis";
