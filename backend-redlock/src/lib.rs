//! # dlock-redlock: distributed locks over N independent Redis nodes
//!
//! The Redlock backend for [dlock](https://docs.rs/dlock-rs): a [`Redlock`] implements
//! [`dlock_api::DistributedLock`] on N independent Redis nodes (no replication between them,
//! no Sentinel, no Cluster), and holds a lock while a majority of them agree.
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use dlock_api::{DistributedLockExt, LockOptions};
//! use dlock_redlock::Redlock;
//!
//! let locks = Redlock::connect_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379").await?;
//! let guard = locks.acquire_str("invoice:42", &LockOptions::new()).await?;
//! // … work, passing guard.fencing_token() with every write to the storage …
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## What it promises
//! - [x] **Mutual exclusion while a majority of nodes keeps its keys** and clocks run at about
//!   the same *rate* (the drift allowance covers 1 % plus 2 ms). A minority of nodes may be
//!   down, frozen or partitioned away: acquire, extend and release go on without them.
//! - [x] **Woken on release**: waiters are woken by pub/sub announcements from the nodes, not by
//!   polling.
//! - [x] **Extend** and automatic renewal on a quorum; the guard is *suspended* while renewals
//!   fail and its validity lasts, and lost with [`LostReason::RenewalFailed`] when it runs out.
//! - [x] **Lost signal**: a renewal that finds the key gone from too many nodes loses the guard
//!   at once ([`LostReason::TakenOver`]). No takeover signal: a holder whose keys were deleted
//!   on the nodes learns it at its next renewal (a third of the TTL), not when another client
//!   takes the lock. Waiters look at the nodes every second, so keys that went without an
//!   announcement reach them within about a second, not at the old lease's end.
//! - **Fencing: best effort.** A grant's token is the highest its quorum handed out, written
//!   back to a majority when they disagree, and each node's token is its per-name counter plus
//!   one. A counter a node lost (a restart without persistence, `FLUSHALL`, an eviction, or its own
//!   expiry ten minutes after it started, which keeps a name used once from staying) starts
//!   again from the client's wall clock in microseconds (cut to the millisecond, so one round's
//!   nodes agree), as a single Redis floors its tokens at its own clock: tokens keep rising
//!   through restarts of every node, cleanly or by `SIGKILL`. What is left of "best effort" is
//!   the clocks: a counter started again is above the old one's tokens only if the clocks of
//!   the clients that start counters are less far apart than the time between the old
//!   counter's start and its loss (seconds apart against minutes, in practice), and a node
//!   whose clock jumps expires its keys early. A restart without persistence still lets a
//!   majority grant a lock its holder still holds (this crate's tests show the checker catching
//!   the overlap, and fencing refusing the first holder's late writes): run the nodes with
//!   `appendonly yes` and `appendfsync always`, or restart one only after the longest TTL.
//! - **Independent nodes only**: connect refuses (with [`LockError::Config`](dlock_api::LockError::Config), naming the node) a
//!   node that is a replica or a primary with replicas attached, since a failover could put a
//!   copy that missed a grant in its place; and a Sentinel or Cluster URL is never a node.
//! - Not FIFO: waiters woken together race for the nodes; a split vote (no one wins a quorum)
//!   makes them retry after a random delay.
//!
//! ## How it works
//! - **Acquire** sends `SET PREFIX:{NAME} OWNER NX PX TTL` to every node at once, each bounded by
//!   a per-node timeout of 5 % of the TTL (at least 5 ms, at most the command timeout), so a frozen node
//!   costs at most that. `OWNER` is fresh for every attempt. It succeeds when a quorum (a
//!   majority by default) said yes and the validity left, `TTL − elapsed − drift`, measured on
//!   the monotonic clock from **before the first request**, is above the minimum. It is decided
//!   at the quorum's last yes: the slower nodes are not waited for (a key they set is ours, and
//!   release and extend reach every node), so a frozen minority costs a grant nothing. The guard's
//!   deadline is `start + TTL − drift`. Otherwise the attempt releases its key on **every** node
//!   at once, including the ones that did not answer: each release rides the same multiplexed
//!   connection as that node's `SET`, so a node runs it after a slow `SET`. The first attempt
//!   pipelines plain commands: `SET … NX PX … GET` (which answers the holder when busy), `INCR`
//!   of the name's fence counter, then `PTTL` of the key (how long the holder has left). A waiter's later attempts, which may reach
//!   some nodes only, run one Lua script per node instead, which raises the counter only where
//!   the `SET` took. Plain commands cost a node about 2 µs, the script 7–8 µs.
//! - **Fencing token**: the highest token of the quorum. If fewer than a majority of nodes
//!   returned that highest token, it is written back before the guard is returned, on each
//!   node of the quorum **only while that node still holds our key**, and must land on a
//!   majority. (Without the owner check, a competing acquire on a node outside our quorum could
//!   draw a lower token after ours.) In the steady state every node returns the same token and
//!   no write-back is needed. A first attempt advances the counter of every node it reaches,
//!   whether it takes the lock there or not: tokens skip the values of busy attempts, and the
//!   nodes stay in step as long as every attempt reaches them all.
//! - **Waiting**: a busy acquire subscribes to the name's channel `PREFIX:{NAME}:released` on
//!   every node (once per name per client) and waits until nodes that **announced a release**,
//!   together with the nodes its attempt found free, make a quorum: one announcement lost with a
//!   node does not strand it, and one early message does not send it racing the nodes while the
//!   lock is still held on the others. A fallback timer fires when enough of the holder's keys
//!   will have expired (the (quorum − free)-th smallest remaining TTL). A woken waiter first
//!   takes the **agreed node** alone (the lowest-numbered one it reaches) and goes on to the
//!   others only once it has it, so waiters woken together do not split the nodes among them;
//!   the losers wait for that node's next announcement (a failed attempt announces its
//!   releases too). The **first in line** skips that round trip: waiters keep a waiting line on
//!   the agreed node (checked after each round they lose, one script), and the first one sends
//!   its next round to every node at once, leaving the line as it does; the others give it a
//!   head start of about a round trip before they take the agreed node, and normally find it
//!   taken. A lone waiter is first, so a hand-off to it costs one round trip after the
//!   announcements ([`RedlockStats::first_in_line_rounds`] counts these rounds). The line
//!   grants nothing, and a place not kept lapses: a stale view costs at worst a split vote.
//!   Nor is it a promise of order (the capabilities' `fifo` is false): under load a waiter
//!   behind the first can win the agreed node before the first's round reaches it.
//!   When no client can hold a quorum anyway (a split vote, say between a newcomer and a
//!   woken waiter), it retries after a random delay up to `retry_delay`; [`Redlock::stats`]
//!   counts these split votes (18 tasks on 6 clients, 180 grants: 3–12 split votes in about
//!   2,000 rounds; 0–6 in about 3,600 rounds before the waiting line; 29 % of rounds without
//!   the agreed node).
//! - **Extend** resets the TTL (owner-checked) on every node at once and needs a quorum within
//!   the validity left; it reports the validity it obtained (`start + TTL − drift`). Like a
//!   grant it is decided at the quorum's last yes, and the resets still out finish in the
//!   background, so a frozen minority does not hold up the watchdog either. A failed
//!   extend **never deletes anything**. When the key is gone from so many nodes that a quorum is
//!   out of reach, the lock is lost (`NotHeld`, reported as [`LostReason::TakenOver`]).
//! - **Release** deletes the key (owner-checked) on every node at once and announces it. It
//!   returns once a quorum deleted it (the lock is free for others then); the deletions still
//!   out finish in the background.
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`) reads every
//!   node at once (one read-only script each) and reports what a quorum says: held when one owner
//!   holds the key on a quorum, with that owner, the highest fence counter among those nodes as
//!   the token (the holder's, or above it once other clients' first attempts found the lock
//!   busy: those advance the counters too), and the quorum-th longest TTL left as the remaining lease; free when no owner
//!   could hold a quorum even counting the nodes that did not answer; otherwise
//!   [`Unavailable`](dlock_api::LockError::Unavailable) (it cannot be told). Waiters are not
//!   counted: the waiting line on the agreed node orders them but is no exact count (the first
//!   leaves it as it sends its round).
//!
//! ## Connecting
//! `redlock://[[user]:password@]h1[:port],h2[:port],…[/db][?option=value…]`, or `redlocks://`
//! for TLS to every node (feature `tls-rustls`). See [`RedlockConfig`] for the options (quorum,
//! per-node timeout, drift, minimum validity, retry delay). A quorum below a majority is refused,
//! and so is a node listed twice, also under another address (`localhost` and `127.0.0.1`:
//! connect compares the servers' `run_id`). The client starts when a quorum of nodes answers; the others
//! are connected again whenever they are needed.
//!
//! ## Performance
//! `dlock bench --backend redlock://… --rounds 5 --duration 2s` (release build, five local
//! redis-servers, a 2-core VM; medians with [min–max] over the rounds, each floor measured in
//! the same run):
//!
//! | measurement | dlock | raw floor, same run | ratio |
//! |---|---|---|---|
//! | uncontended acquire + release | 2,600 pairs/s, p50 377 µs | parallel `SET NX PX` ×5 + parallel compare-and-delete ×5: 2,786 pairs/s, p50 343 µs | 0.93× [0.86–0.97] (0.94× [0.86–0.95] in a 3-round run; 0.88× on the same VM with a script per node on the first attempt, and 0.81–0.84× and 0.85–0.90× with it on two other VMs) |
//! | hand-off, 4 clients on one name, 2 ms hold | p50 639 µs, p99 1,321 µs | parallel `DEL`+`PUBLISH` ×5 after the same hold, the subscriber's parallel `SET NX` ×5 held at a quorum: p50 455 µs | 1.56× [1.09–1.84] (1.35× [1.26–1.49] in a 3-round run) |
//! | hand-off, 4 clients, first in line (VM T, 3- and 5-round runs) | p50 581–615 µs | the same floor, p50 491–556 µs | 1.14× [0.96–1.30], 1.22× [1.03–1.33] (1.25–1.36× before the line, same VM) |
//! | hand-off, 2 clients (one waiter, as the floor has; VM T) | p50 486 µs | the same floor, p50 657 µs | 0.71× [0.70–1.14] (1.01–1.13× before) |
//! | uncontended, decided at the quorum's last yes (VM T, 3 rounds) | 2,613 pairs/s, p50 367 µs | 2,649 pairs/s, p50 360 µs | 0.96× [0.88–1.08] and 0.99× [0.98–1.00] in two runs; 0.99× and 0.98× of the fenced floor (0.90× and 0.88× when every node's answer was waited for, same runs) |
//! | hand-off, 4 clients, first in line, decided at the quorum's last yes (VM T) | p50 477 µs, p99 1,003 µs | the same floor | 0.99× [0.99–1.04] and 0.91× [0.84–1.08] in two runs (1.16× and 0.96× waiting for every node, same runs) |
//! | uncontended, release too decided at a quorum of deletions (VM T, 3 rounds) | 2,970 pairs/s, p50 325 µs | 2,700 pairs/s (the floor waits for every node's answer to both) | 1.10× [1.10–1.15], 1.20× of the fenced floor (0.89× and 0.95× in the same run with the release waiting for every node) |
//! | many names, one client, 1 / 16 tasks | 2,723 / 12,523 pairs/s | 3,599 / 19,635 pairs/s | 0.78× / 0.69× |
//!
//! Polling Redlock clients hand a lock off in 25–63 ms at p50; the announcement wake-up is
//! about 50–100× faster. A waiter woken by a release together with others first takes the
//! agreed node alone, then the others, so that they do not split the nodes among them: that
//! costs one round trip more than the floor's single parallel round, which has one waiter and
//! nobody to split with. The first waiter in line skips that round trip: with four clients
//! contending (100 grants each, 2 ms holds) every grant came from a first-in-line round, with no
//! split vote. Since a round is decided at the quorum's last yes, as the floor's waiter holds at
//! its quorum's, the hand-off measures at the floor.
//!
//! The uncontended gap is mostly server work, five servers sharing two cores. A first attempt
//! costs each node about 2 µs of plain commands (`INFO commandstats`), where the acquire script
//! cost 7–8 µs: alternating 100 ms slices of each shape against the raw pair, over 60 slices, the
//! pipelined shape reached 0.93× of the raw pair and the script 0.87×, from a bare connection.
//! Asking the holder with `SET`'s own `GET` option instead of a `GET` of its own saves one
//! command per node: on a fourth, slower VM the pair went from 0.84× to 0.87–0.92× of the raw
//! pair (two 3-round runs).
//! What remains is the release's announcement on every node and the client's own work (the raw
//! pair alone is about 150k instructions; dlock adds about 17k: the reconnecting connection
//! manager, the per-node timeouts). The keys of a name are built once per acquire and shared.
//! The `INCR` costs nothing visible: `dlock bench` also measures a **fenced floor**, each node's
//! `SET NX PX` pipelined with the `INCR` of the name's fence counter as dlock's first attempt
//! sends them, and on a noisy VM it measured the same as the plain pair (dlock: 0.88–0.95× of
//! the plain floor over seven runs, 0.89–1.02× of the fenced one, with 20–40 µs more of the
//! bench process's CPU per pair across the five nodes).
//!
//! ## Fault model
//! Redlock assumes bounded network delays, process pauses and clock *rate* error: a holder
//! paused past its validity may find its lock taken, and only the fencing token protects the
//! resource then. A node whose wall clock jumps forward expires its keys early; a node that
//! restarts without persistence forgets its keys and counters (restart it only after the longest
//! TTL, or run it with `appendfsync always`).
//!
//! [`LostReason::RenewalFailed`]: dlock_api::LostReason::RenewalFailed
//! [`LostReason::TakenOver`]: dlock_api::LostReason::TakenOver
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod config;
mod fanout;
mod lease;
mod line;
mod lock;
mod nodes;
mod wake;

pub use config::{DEFAULT_PORT, RedlockConfig};
pub use lock::{Redlock, RedlockStats};

dlock_api::impl_distributed_lock!(Redlock);

/// The URL schemes this backend serves: `redlock://` and `redlocks://` (TLS to every node).
pub const SCHEMES: &[&str] = &["redlock", "redlocks"];

pub(crate) const BACKEND: &str = "redlock";
