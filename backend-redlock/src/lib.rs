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
//!   at once ([`LostReason::TakenOver`]).
//! - [x] **Takeover signal**: a holder whose keys went (expired while it was paused, deleted by
//!   an operator, lost with a restart) learns it as another client takes the lock, not at its
//!   next renewal (a third of the TTL). A lock held for 250 ms marks itself watched on every
//!   node, and whoever takes it over a vanished key tells the holder's client on its channel
//!   there; once the lock is taken on more nodes than the quorum can spare (`N − quorum`), the
//!   guard is lost ([`LostReason::TakenOver`]). Waiters look at the nodes every second, so keys
//!   that went without an announcement reach them within about a second, not at the old
//!   lease's end.
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
//! - **No semaphores** (`max_permits` is 0; the calls answer `Unsupported`): a grant of one of N
//!   permits on a quorum of nodes each holding fewer than N does not bound the total. With five
//!   nodes and two permits, grants on nodes {1,2,3}, {3,4,5} and {1,4,5} never find a node with
//!   two already, yet three hold at once. A lock (N = 1) is safe because any two quorums share a
//!   node; N + 1 quorums need not share one. Use the Redis backend's semaphore on one deployment.
//! - **No elections** (`elections` is false; `campaign`, `leader` and `observe` answer
//!   `Unsupported`): a term must be one rising sequence per name, and a grant's token here is the
//!   highest of N independent counters, which nodes that missed grants or lost a counter can
//!   disagree on, so two terms need not be ordered as their leaderships were; and a value
//!   published on a quorum can differ between nodes (a deposed leader's proclaim can still land
//!   on the nodes its successor's quorum did not reach), so readers of different nodes could name
//!   different leaders. Use the Redis backend's elections on one deployment.
//! - **No reader-writer locks** (`reader_writer` is false; `read` answers `Unsupported`): readers
//!   would be counted on independent nodes, each seeing only the shares whose quorum reached it,
//!   and writers go first only through one line that every reader and writer consults, which
//!   the nodes do not share: a waiting writer known to some nodes holds readers back there and
//!   not on others, so readers and writers split the votes and can keep each other out. Use the
//!   Redis backend's reader-writer locks on one deployment.
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
//!   of the name's fence counter, then `GET` of the name's watch mark (a holder to tell, see
//!   *Takeover signal*); the first in the waiting line also asks `PTTL` of the key (how long
//!   the holder has left). A waiter's later attempts, which may reach
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
//! - **Waiting**: a client's waiters for one name line up in the client first (`raw::LocalQueue`),
//!   and only the first of them waits at the nodes: a release wakes one waiter per client, not
//!   every task that waits. That waiter subscribes to the name's channel `PREFIX:{NAME}:released` on
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
//! `dlock bench --backend redlock://… --rounds 3 --duration 2s` measures this backend against its
//! raw protocol floor (the driver alone doing the same server work) in the same run, and prints
//! the ratio. What those runs measured, VM by VM, and what was tried to close the gap, is in the
//! repository's `BENCHMARKS.md`: numbers of one machine age with it, so they are not kept here.
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
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod client;
mod config;
mod fanout;
mod held;
mod lease;
mod line;
mod lock;
mod nodes;
mod release;
mod renew;
mod wake;

pub use config::{DEFAULT_PORT, RedlockConfig};
pub use lock::{Redlock, RedlockStats};

dlock_api::impl_distributed_lock!(Redlock);

/// The URL schemes this backend serves: `redlock://` and `redlocks://` (TLS to every node).
pub const SCHEMES: &[&str] = &["redlock", "redlocks"];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`RedlockConfig::from_url`], then [`RedlockConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, RedlockConfig, Redlock);

pub(crate) const BACKEND: &str = "redlock";
