//! # dlock-zookeeper: distributed locks on ZooKeeper
//!
//! The ZooKeeper backend for [dlock](https://docs.rs/dlock-rs): a [`ZkLock`] implements
//! [`dlock_api::DistributedLock`] on a ZooKeeper ensemble (3.5 or later; tested on 3.8, one
//! server and three).
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use dlock_api::{DistributedLockExt, LockOptions};
//! use dlock_zookeeper::ZkLock;
//!
//! let locks = ZkLock::connect_url("zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/myapp").await?;
//! let guard = locks.acquire_str("invoice:42", &LockOptions::new()).await?;
//! // … work, passing guard.fencing_token() with every write to the storage …
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## What it promises
//! - [x] **Strict fencing**: the token is the node's `czxid`, the ensemble-wide transaction id
//!   of its create, which only grows (across restarts and leader changes; a sequence suffix
//!   would not: it restarts when the name's node is removed and made again).
//! - [x] **FIFO, woken on release**: waiters queue by sequence; each watches only the node
//!   just before its own, so a release wakes exactly one waiter, about one round trip later
//!   (a semaphore's waiter watches the N nodes before its own).
//! - [x] **Lost signal and suspension**: a guard reports `Suspended` while its session's
//!   connection is lost (stop writing: the session may still come back), `Held` again once it
//!   is back and its node checked, and `Lost` when the session expires; `Lost` with
//!   `TakenOver` as soon as anyone else deletes its node (each node held past 250 ms is watched).
//! - [x] **Survives failover**: a lock lives in the ensemble's log; losing a server keeps it.
//! - [ ] **Extend**: the session is the lease; per-acquire TTLs are ignored and `extend` is
//!   refused with `Unsupported` before any network call. A holder that dies frees its lock when
//!   the server expires its session (the session timeout, 10 s by default).
//! - [x] **Semaphores** of up to 128 permits
//!   ([`acquire_permit`](dlock_api::DistributedLock::acquire_permit)): the lock's queue with
//!   more than one place at its head, so a permit is a lease, a fence and a waiter as a lock is
//!   (see [Semaphores](#semaphores)).
//! - [x] **Elections**: the lock's queue with a record on the head node, the term its `czxid`,
//!   observers woken by a watch (see [Elections](#elections)).
//! - [x] **Reader-writer locks** ([`read`](dlock_api::DistributedLock::read)): readers' nodes in
//!   the lock's queue, holding while no writer's node is ahead (see
//!   [Reader-writer locks](#reader-writer-locks)).
//!
//! ## How it works
//! - **One session per client**, shared by all its guards. The client library hides its
//!   heartbeats, notices a lost connection late and declares expiry itself only at 7/5 of the
//!   session timeout, so this crate runs its own heartbeat: an `exists` every third of the
//!   negotiated timeout, and a validity dated from the last acknowledged **send**
//!   (`sent + timeout - margin`, never later than the server's own deadline). A late or failed
//!   heartbeat, or a lost connection, suspends every guard until that deadline; a heartbeat
//!   answered in time resumes them, but only after each held node has been read back and found
//!   to still exist with this session as its owner (a reconnect alone proves nothing: the
//!   server may have expired the session and given the lock away meanwhile). The deadline
//!   passing or the server expiring the session loses every guard with `SessionExpired`; a
//!   new session is opened for later acquires, because the library never opens one itself.
//!   A client outlives the tokio runtime it was made on: used from another runtime once that
//!   one shut down, it attaches to the same session again, and the locks it holds go on.
//! - **Nodes.** `PREFIX/NAME/_c_<uuid>-lock-<sequence>`: the name is one path segment (a name
//!   ZooKeeper could not take as it is, with `/`, `.`, `..` or a forbidden character, is
//!   mapped to a readable part and a digest, so no two names share a node and none escapes the
//!   prefix); each create attempt carries a fresh uuid. The name's node and the prefix are
//!   created on demand as *containers*, which the server removes once empty, so cleanup never
//!   races a new waiter.
//! - **Acquire** is one transaction (`multi`): create our node and write the name's node's
//!   (empty) data. The write answers with the name's node's stat just after the create, and its
//!   child count is exact, so a node that finds itself alone holds the lock after one round trip
//!   with no listing; its token, the create's zxid, is the name's node's new `mzxid`. Otherwise
//!   it lists the queue: the lowest sequence holds. (Where an operator made the name's node
//!   without write permission for us, the create goes alone and the listing follows it.) A
//!   waiter sets an exists-watch on the node just before its own (set even if that node is
//!   already gone) and, since a node watch never reports a lost connection, also follows the
//!   session's own account; when the predecessor goes it lists again before deciding (the
//!   predecessor may have been a waiter that left, with an earlier holder still there).
//! - **Lost answers.** The library has no request timeout and queues requests made while
//!   disconnected; every request here has its own timeout. A create whose answer is lost is
//!   looked up by its uuid after a `sync`, and taken as ours only if its ephemeral owner is this
//!   session. A dropped acquire deletes its node: the create runs to completion in the
//!   background and the cleanup waits for it, so the delete always follows the create, also
//!   when its answer was lost.
//! - **Holding.** Each node held longer than 250 ms carries an exists-watch, set again after any
//!   other event: its deletion by anyone but this guard (an operator, a stray client) loses the
//!   guard with `TakenOver` at once, while the session stays healthy. The event arrives over the
//!   session's own connection, so it is the node that went, not the session. (The watch waits
//!   those 250 ms on the client's one timer task, so the many locks released sooner cost no
//!   `exists` round trip; a node deleted within them is found gone when the watch is set.)
//! - **Release** deletes our node guarded by its version; a dropped guard's node is deleted in
//!   the background.
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`) lists
//!   the name's node after a `sync` (the lowest sequence holds, the others wait; of a
//!   semaphore, the holders are the lowest up to its limit) and reads the first holder's node:
//!   its `czxid` is the token, its ephemeral owner (`session 0x…`) the holder. No remaining
//!   lease: the lease is the session.
//!
//! ## Semaphores
//! A semaphore of N permits is the lock's queue with N places at its head: a permit is one
//! ephemeral sequential node, `_c_<uuid>-permits<N>-lock-<sequence>`, and a node holds iff
//! fewer than N nodes are ahead of it. A lock is the semaphore of one: its nodes keep their
//! name (`_c_<uuid>-lock-<sequence>`) and its path its requests. Everything the lock does for
//! its node (the counted create, the marker after a lost answer, the armed cleanup, the watch
//! on a held node, the reattach) a permit gets unchanged.
//! - **Held by the session, counted by the server.** A permit is a node of its client's
//!   session: a holder that dies gives it back when the server expires the session, and a
//!   release or an expiry is a deletion that wakes the waiter it lets in. There is no counter
//!   on the side that a crash could leave wrong: the queue is the count.
//! - **Waiting.** A waiter watches each of the N nodes just before its own, and lists the
//!   queue again when one goes. Only those matter: a deletion further ahead leaves as many
//!   ahead of it as it has places, and these N still just before it. Watching only the node N
//!   places ahead (Curator's `InterProcessSemaphore`) would miss a release among the others:
//!   with holders h0, h1, h2 and a waiter, h2's release must let the waiter in, a watch on h0
//!   would not fire. The price is that a deletion wakes up to N waiters, each listing the
//!   queue, which is why a semaphore keeps at most 128 permits.
//! - **One limit per name.** The limit rides in each node's name, so the listing that decides
//!   a grant shows it too: a node of another limit ahead refuses the acquire with
//!   [`permits_mismatch`](dlock_api::raw::permits_mismatch), our node deleted first. Two limits
//!   never hold together (of two nodes, the later sees the earlier ahead). A lock that finds
//!   itself alone holds without a listing, as before; one that is not lists, and sees the
//!   semaphore's nodes. An acquire that races another refused one of a third limit can be
//!   refused by it too.
//! - **Token**: the node's `czxid`, as a lock's, so each permit's is above every node's queued
//!   before it. Permits are let in in queue order; two waiters let in by one release may learn
//!   it in either order, each still holding the token of its place.
//! - **Counting** ([`count_permits`](dlock_api::DistributedLock::count_permits)) lists the
//!   queue after a `sync` and counts the nodes at its head with the first one's limit, up to
//!   that limit: a permit counts from the moment the server's queue lets it in (before its
//!   client has heard) until its node is deleted; a node being refused never counts.
//! - **No orphans** (Curator's CURATOR-315 after a reconnect, CURATOR-462 after an interrupt,
//!   both leaving a lease node that held a permit forever): a create whose answer is lost is
//!   found by its marker, an acquire dropped at any point deletes its node through its armed
//!   cleanup, and an attach from another runtime deletes the session's nodes no guard holds and
//!   no acquire has queued. A node left by all that still dies with its session.
//!
//! ## Reader-writer locks
//! Curator's `InterProcessReadWriteLock` on the lock's queue. A reader's node is
//! `_c_<uuid>-read-lock-<sequence>`; a writer is the name's lock, whose node is unchanged. A
//! reader's node holds iff no writer's node is ahead of it, and waits on the nearest writer's
//! node ahead; a writer's node holds iff it is first, and waits on the node just before it, as
//! a lock's does.
//! - **Writers go first**: a writer's node ahead keeps every reader queued after it out, however
//!   many readers hold, so a stream of readers never starves it; when it goes, every reader
//!   between it and the next writer holds at once (each watched it).
//! - **Each share is its own node** on its client's session: a reader that dies frees its
//!   share when its session ends, whatever the other readers do. Lost answers, dropped
//!   acquires and the watch on a held node are the lock's.
//! - **Token**: the node's `czxid`, above every node queued before it, whichever the mode.
//! - A reader's node counts as a lock's for a semaphore's limit, so a semaphore's name refuses
//!   readers and a reader's name refuses permits. There is no upgrade (a reader's node never
//!   becomes a writer's), nor a downgrade.
//!
//! ## Elections
//! [`campaign`](dlock_api::DistributedLock::campaign),
//! [`leader`](dlock_api::DistributedLock::leader) and
//! [`observe`](dlock_api::DistributedLock::observe) run on the lock's queue: a candidate is a
//! lock waiter, and the leader is the node at the head of the name's queue.
//! - **Term**: the leader's node's `czxid`, its grant's fencing token, so every term is above
//!   every earlier term and lock of the name.
//! - **Value**: the data of the leader's own ephemeral node. A candidate creates its node with
//!   `lead:VALUE` as its data, so it leads with its value, the term its `czxid`, from the
//!   moment it heads the queue: a campaign writes nothing after its grant. Each later
//!   [`proclaim`](dlock_api::Leadership::proclaim) writes `[term: 8 bytes, big-endian]
//!   [value]` with a `setData` guarded by the node's version. The write lands only while the node exists, that is while this session holds the
//!   place; a deposed leader's node is gone (`NoNode`), so it can never write over its
//!   successor's record, and is answered `NotHeld`. A permit of a semaphore does not proclaim
//!   (`Unsupported`).
//! - **`leader`** lists the queue after a `sync` and reads the first node's data and stat (two
//!   round trips): a node read there is still the first, and exists only while its session
//!   does. A head node whose data is neither a record of its own `czxid` nor a candidate's
//!   value (a lock's holder) is reported as **no leader** (`None`, `Vacant`), as is a
//!   semaphore's queue. A candidate whose node heads the queue as its campaign is cancelled or
//!   times out is shown leading until its cleanup deletes the node; its campaign returns no
//!   leadership.
//! - **What ends leadership** is what ends the lock: a resignation or a dropped leadership
//!   deletes the node, the session's expiry deletes it on the server (a crashed leader leads no
//!   longer than its session timeout), and anyone else's delete loses it with `TakenOver`. A
//!   leader whose connection is lost is `Suspended` and, once back, leads on only after its node
//!   is read back as this session's, with its term's `czxid` (Curator's CURATOR-696 kept two
//!   leaders after a reconnect).
//! - **A candidate whose session ends while it waits** loses its place with the session's nodes
//!   and is never told it leads from that place: it queues again on a new session, at the back,
//!   as a lock's waiter does (its wait timeout still runs), and leads only if that new node
//!   reaches the head.
//! - **Observers** set one persistent recursive watch (ZooKeeper 3.6 or later) on the name's
//!   node, so the creation, deletion or data change of any node of the queue wakes them, with no
//!   gap to re-arm a one-shot watch in; each wake-up reads the leader as `leader` does. After a
//!   lost connection (events during it are not replayed: ZOOKEEPER-4698; and the client library
//!   does not set persistent watches again on a reconnect, so the observer does) or a new
//!   session, the stream sets its watch again, says `Missed` and reads again; a failed read or watch is reported once, then retried
//!   every `OBSERVE_RETRY`. A dropped stream drops its watch, which the client library removes
//!   on the server (`removeWatches`); if the removal is lost, the library removes the watch at
//!   its next event, which it hands to nobody.
//! - **What is left on the server**: nothing of an election beyond the lock's own nodes. The
//!   record lives and dies with the leader's node, and the name's container node goes once its
//!   queue is empty.
//!
//! ## Connecting
//! `zk://[user:password@]host[:port][,host[:port]…][/prefix][?option=value…]`, or `zks://`
//! for TLS (feature `tls`). See [`ZkConfig`] for the options: session, connect and request
//! timeouts, the ACL of created nodes. With `user:password` the client authenticates with the
//! `digest` scheme and creates its nodes readable and deletable by that identity only. The
//! prefix is a plain node path created on demand, not a chroot (which must exist beforehand).
//!
//! `zks://` talks to the servers' `secureClientPort` (served by `NettyServerCnxnFactory`),
//! trusting only the CA in `ca_cert` (the client library loads no system roots), and presents
//! `cert`/`key` if the server asks for a client certificate. Tested against ZooKeeper 3.8 with
//! PEM key and trust stores (`ssl.keyStore.type=PEM`); Debian's package needs
//! `/usr/share/java/netty-codec.jar` added to the server's class path for TLS.
//!
//! ## Performance
//! `dlock bench --backend zk://… --rounds 3 --duration 2s` measures this backend against its
//! raw protocol floor (the driver alone doing the same server work) in the same run, and prints
//! the ratio. What those runs measured, VM by VM, and what was tried to close the gap, is in the
//! repository's `BENCHMARKS.md`: numbers of one machine age with it, so they are not kept here.
//!
//! ## Fault model
//! A lock is as safe as ZooKeeper's ordering and the session timeout: a holder cut off (GC
//! pause, partition) past its session finds its guard lost, and by then the server may have
//! given the lock to another client; only the fencing token protects the resource then. While
//! suspended the holder does not know, which is what the `Suspended` status says. The
//! deadline assumes the client's and the server's clocks run at nearly the same rate (1 % and
//! 10 ms of margin).
//!
//! An outage reads as one: an `acquire` whose server stops answering rides it out within its
//! wait, and when the wait ends first it answers `Unavailable`, by its deadline plus one
//! command's timeout, never `Timeout` (which says somebody held the lock).
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod config;
mod connect;
mod election;
mod enqueue;
mod error;
mod lease;
mod lock;
mod names;
mod session;

pub use config::{DEFAULT_PORT, NodeAcl, ZkConfig};
pub use lock::ZkLock;

dlock_api::impl_distributed_lock!(ZkLock);

/// The URL schemes this backend serves: `zk://` and `zks://` (TLS).
pub const SCHEMES: &[&str] = &["zk", "zks"];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`ZkConfig::from_url`], then [`ZkConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, ZkConfig, ZkLock);

pub(crate) const BACKEND: &str = "zookeeper";
