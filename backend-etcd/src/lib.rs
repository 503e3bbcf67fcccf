//! # dlock-etcd: distributed locks on etcd
//!
//! The etcd backend for [dlock](https://docs.rs/dlock-rs): an [`EtcdLock`] implements
//! [`dlock_api::DistributedLock`] on an etcd cluster (v3 API; one member or many).
//!
//! ```no_run
//! # async fn demo() -> dlock_api::Result<()> {
//! use dlock_api::{DistributedLockExt, LockOptions};
//! use dlock_etcd::EtcdLock;
//!
//! let locks = EtcdLock::connect_url("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/myapp").await?;
//! let guard = locks.acquire_str("invoice:42", &LockOptions::new()).await?;
//! // … work, passing guard.fencing_token() with every write to the storage …
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## What it promises
//! - [x] **Strict fencing**: the token is the key's *create revision*, a cluster-wide counter
//!   that only grows, across restarts and leader changes.
//! - [x] **FIFO, woken on release**: waiters queue by create revision; each watches the name's
//!   deletions (one watch stream per client) and takes the lock once every key ahead of it is
//!   gone (a permit once fewer than the limit are left), about one round trip after the
//!   release.
//! - [x] **Extend** and automatic renewal, through leases this client keeps alive.
//! - [x] **Lost signal and suspension**: a guard reports `Suspended` while its lease's keep-alives
//!   fail, and `Lost` when the lease ends or its key goes.
//! - [x] **Survives failover**: a lock lives in the raft log; a leader change keeps it.
//! - [x] **Semaphores** of up to 512 permits (see *Semaphores* below), on the same queue: a lock
//!   is a semaphore of one permit.
//! - [x] **Elections** (see *Elections* below), on the lock's queue, without etcd's own
//!   election API: the term is the leader key's create revision.
//! - [x] **Reader-writer locks** (see *Reader-writer locks* below), on the lock's queue:
//!   readers' keys hold while no writer's key is older.
//! - **Minimum TTL: the cluster's shortest lease**, and never under 2 s
//!   ([`Capabilities::min_ttl`](dlock_api::Capabilities::min_ttl)). etcd silently lengthens a
//!   shorter lease to its own minimum (`ceil(1.5 × election timeout)`: 2 s on default timing,
//!   5 s with a 3 s election timeout), which would hold a dead holder's lock longer than asked.
//!   The client learns that minimum at connect (its probe is a one-second lease, whose answer
//!   carries the TTL the server made of it), so a shorter TTL is an `InvalidArgument` before any
//!   network call; a grant that still comes back longer than asked (a new leader with other
//!   timing) is revoked and refused with the same error, naming the minimum.
//! - **Expiry lag** ([`Capabilities::expiry_lag`](dlock_api::Capabilities::expiry_lag)): a TTL
//!   is rounded up to whole seconds, and the leader expires leases on a sweep every 500 ms, so a
//!   vanished holder's lock is freed up to 1.5 s after its TTL (a 2 s lease 2.30-2.35 s after
//!   its last renewal, a 3 s one 3.32-3.43 s after, measured on etcd 3.4).
//! - **A waiter's lease that ends** (revoked, expired, or the client's session ended while the
//!   server was down) loses nothing, since a waiter holds nothing: it joins the line again on a
//!   live lease within its wait, riding out a server that is down meanwhile, and answers
//!   `Unavailable` only if the server stays unreachable.
//!
//! ## How it works
//! - **Session leases.** A client keeps one etcd lease per TTL (in whole seconds) alive and
//!   shares it among every guard with that TTL: a hundred locks cost one keep-alive stream, not
//!   a hundred renewals. The keep-alive loop sends one request at a time and dates the lease's
//!   validity from the acknowledged *send* (`sent + granted TTL − margin`), never from the
//!   answer's arrival. A keep-alive that fails suspends every guard on the lease and reopens
//!   the stream with back-off; the deadline passing, or an answer with TTL 0, loses them with
//!   `SessionExpired`. An acquire with `Renewal::Off` gets a lease of its own that nobody keeps
//!   alive: it ends at its TTL unless extended.
//! - **Keys.** `PREFIX/NAME/LEASE-SLOT`, its value the name's limit of permits (empty for a
//!   lock, as every key was before semaphores; `read` for a reader's, `lead:VALUE` for a
//!   campaign's candidate, see *Elections*): the name percent-encoded (so `/` in a name can never
//!   make one name's range cover another's), the lease in hex, and the first slot the client
//!   does not use for that name and lease (two tasks of one client never share a key). A key is
//!   named again only once it is known gone, so acquire after acquire reuses the same few keys:
//!   etcd keeps a deleted key in its index until compaction and every queue read walks the
//!   name's range there, so a fresh key per acquire would make a busy name slower with every
//!   acquire until the next compaction.
//! - **Acquire** is one transaction: *if our key does not exist, put it on the lease, and read
//!   the newest keys of the name* (ours and up to eight before it, or as many as the limit). A
//!   read inside a write transaction sees its own put, so the answer is `[ours, the ones
//!   before]`; with fewer keys before ours than the limit (for a lock: none), we hold, and our
//!   create revision is the transaction's revision. `try_acquire` of a lock instead puts only
//!   if the name has no key at all (no write when busy).
//! - **A set of locks** (`try_acquire_all`, and `acquire_all` before it waits) is one
//!   transaction when free: *if every name's range is empty* (a create-revision compare over a
//!   range holds for each key in it, and over an empty one compares a missing key, revision 0),
//!   *put our key under each name*, as its single try would, so every member's token is that
//!   transaction's revision; otherwise it reads each name's oldest key and writes nothing: the
//!   set is busy, or, for a name in use as a semaphore, the names go one by one and the single
//!   try answers. Sets of more than 64 names go one by one (etcd's default `--max-txn-ops` is
//!   128).
//! - **Waiting** watches every deletion under the name from the read's revision + 1 (a start
//!   above the current revision is served at once by the server's synced watchers; an older
//!   one waits for its 100 ms catch-up loop, and none at all can miss the release). One watch
//!   delivers its events in revision order, and every event of one revision in one response,
//!   so a deletion of our own key is seen no later than any deletion ahead of it: revoking a
//!   lease that carries both a holder's key and its own client's waiting key deletes both in one
//!   revision, and the waiter reads the whole response before deciding (it is granted only at a
//!   revision where its own key still exists). When the read saw every key ahead of ours (eight
//!   or fewer), the lock is ours once each of them has been seen deleted, with no further round
//!   trip: no key created before ours can appear any more. (Unless our lease's validity has passed by
//!   then, as for a waiter paused long after the last deletion happened: then a re-read decides,
//!   and finds our key gone if the lease ended.) Deeper in a longer queue, a waiter watches only
//!   the nearest key ahead of its own (the nearest `N` for a semaphore of `N` permits, up to
//!   eight; a larger semaphore keeps the name-wide watch) and its own key, each by a watch of its
//!   own: while those keys are there the lock cannot be ours, and any event of them leads to a
//!   linearizable re-read (never a serializable one: a lagging member can hide a live
//!   predecessor) that confirms our key still exists and that no key created before it remains.
//!   So a release reaches the waiters near the head and the one behind it, not every waiter of
//!   the line (1,000 waiters on one name each answering every release overwhelmed the server).
//!   A compacted watch re-reads; a slow fallback check every few seconds catches any event the
//!   server lost (deep in a line, a compare of the watched keys, whose cost does not grow with the
//!   line, where a read of the line sorts every key of the name). One watch stream per client
//!   carries every waiter's and holder's watch, and one periodic transaction per 64 held keys
//!   checks every key the client holds.
//! - **Semaphores** ([`acquire_permit`](dlock_api::DistributedLock::acquire_permit)) are the
//!   same line: a key holds one of the name's N permits while fewer than N keys of the name
//!   have a lower create revision, so the permits go in FIFO order and a permit is a lease like
//!   a lock (it ends with its key's lease: released, revoked, or expired when its client stops
//!   keeping it alive), and its token is its key's create revision, above every earlier grant's
//!   of the name. A waiter counts the deletions of the keys its read showed ahead of its own:
//!   when the read showed all of them, it holds once fewer than N are left, with no further
//!   read (no key created before ours can appear any more); when the line was longer than the
//!   read, a read decides once fewer than N of the ones it saw are left. A deleted key the read
//!   did not show counts for nothing, since a delete event does not say whether it was ahead.
//!   A waiter is granted only at a revision where its own key still exists, and never past its
//!   lease's validity without a read (etcd's own election and RWMutex recipes could answer a
//!   waiter whose key had gone with its lease: etcd-io/etcd #19597, #16221). `try_acquire_permit`
//!   joins the line and leaves it again when it is not granted (two writes when busy: "fewer
//!   than N keys" is no compare a transaction has).
//! - **One limit per name.** Each key's value is the limit it was put with. A read that shows a
//!   key ahead of ours with another limit (a lock, a reader's and a candidate's key count as
//!   one) refuses the acquire with
//!   `InvalidArgument` naming both numbers, after deleting our key (owner-checked by its create
//!   revision) so nothing is left. Every read that grants shows every key ahead of ours, so two
//!   keys that were ever in the line together never hold by two limits; an acquire behind a
//!   line longer than its read is refused once its read reaches the other limit. `count_permits`
//!   is one linearizable read of the range's count and its oldest key:
//!   `min(keys, the oldest key's limit)` (the keys past the limit wait); linearizable, so a count
//!   right after an acknowledged release or grant never shows the line before it, as a lagging
//!   member's serializable read could.
//! - **Holding**: each holder watches its own key, from 250 ms after its grant (a lock released
//!   sooner costs no watch; the watch starts from the grant's revision, so nothing in between
//!   is missed); its deletion (the lease revoked or expired, or someone deleting it) marks the
//!   guard lost. The holder also reads its key every few seconds, so a deletion event the
//!   server lost still ends the guard.
//! - **Release** deletes the key in a transaction guarded by its create revision, so a stale
//!   release can never remove a newer key. A dropped acquire deletes its key (also when the
//!   create's reply was lost), a dropped guard is released in the background, and a forgotten
//!   guard's key moves onto a lease nobody renews, so it ends within its TTL.
//! - **Extend**: in the same TTL class, one keep-alive of the kept-alive lease (the validity is
//!   the lease's TTL). To another class, the key moves onto the client's kept-alive lease of
//!   that class, and on a lease of its own onto a new lease of the asked TTL, in a transaction
//!   guarded by the create revision (`put` with `ignore_value`), which keeps the create
//!   revision: the fence and the queue place do not change. A moved guard follows its new
//!   lease: its suspension, its end and its validity.
//! - **Inspection** ([`inspect`](dlock_api::DistributedLock::inspect), `dlock status`) is a
//!   linearizable read of the name's oldest key (the holder: its create revision is the token,
//!   its lease the holder's identity) and of how many keys the name has (the others wait), then
//!   the lease's time to live (`LeaseTimeToLive`, whole seconds) as the remaining lease. On a
//!   semaphore's name it shows the oldest permit, and counts the other keys, holders past the
//!   first included, as waiting: `count_permits` is the count of holders.
//!
//! ## Reader-writer locks
//! [`read`](dlock_api::DistributedLock::read) puts a key in the lock's line with the value
//! `read`; a writer is the name's lock, whose key is unchanged. A reader's key holds while no
//! older key of the name is a writer's (Curator's `InterProcessReadWriteLock` by create
//! revision): its read of the line has no limit, since only every key ahead of it can show
//! that none is a writer's, and it waits on the deletions of the writers' keys it saw. A
//! writer's key holds once it is the oldest, as a lock's does.
//! - **Writers go first**: a writer's key ahead keeps every reader queued after it waiting,
//!   however many readers hold, and its deletion lets all of them in at once (each watched it).
//! - **A waiter whose lease ended never wins** (the bug of etcd's own RWMutex recipe,
//!   etcd-io/etcd #16221): a reader or writer whose key went joins the line again, as a lock's
//!   waiter does, and a grant is only ever taken at a revision where its key exists.
//! - **Each share is its own key** on its client's lease: a reader that dies frees its share
//!   when its lease ends, whatever the other readers renew.
//! - **Token**: the key's create revision, above every earlier key's, whichever the mode.
//! - A reader's key counts as a lock's for a semaphore's limit: a semaphore's name refuses
//!   readers, and a reader's name refuses permits. No upgrade, no downgrade.
//!
//! ## Elections
//! A [`campaign`](dlock_api::DistributedLock::campaign) acquires the name as a lock, so a
//! candidate queues, waits, renews and is lost exactly as a lock's holder is; its queue key
//! carries its value, so it leads with it from the revision its key becomes the oldest.
//! - **Term**: the leader key's create revision, i.e. the grant's fencing token: above every
//!   earlier term and lock of the name, across restarts and leader changes.
//! - **Where the value lives**: first in the candidate's own queue key, put as `lead:VALUE`
//!   (a lock's key in every other respect). When the key ahead of it goes, that one revision
//!   makes the candidate the leader with its value: the campaign's publication after its grant
//!   writes nothing, so a hand-over costs what a lock's does (the candidate's wait ends on the
//!   deletion, with no round trip after it), and a campaign on a free name is its one acquire
//!   transaction. A value proclaimed later goes in one record per name, `PREFIX/ENCODED0` (the
//!   name's range with its final `/` raised to `0`, which is where etcd's prefix range of the
//!   queue ends: no name's queue read ever sees it, and `[PREFIX/ENCODED/, PREFIX/ENCODED0]`
//!   holds this name's keys and record and nothing of another name's). Its value is
//!   `TERM:VALUE`. It is put **on the leader key's own lease**, in one transaction *if the key
//!   still has its create revision*, so a leader whose key went (lease revoked or expired, or
//!   deleted by someone) is refused with `NotHeld` and can never overwrite a later term's
//!   record. An `extend` that moves the key to another lease keeps its value, and moves the
//!   record with it in the same transaction.
//! - **Who leads**: [`leader`](dlock_api::DistributedLock::leader) is one transaction of two
//!   reads (linearizable): the name's oldest key and the record. The record counts only if its
//!   term is that key's create revision (a proclaim since the grant); else the value that key
//!   carried as a candidate, at its create revision; else nobody (a plain lock's key, with a
//!   record left by an earlier term or none). A candidate's key that is the oldest is shown
//!   leading before its campaign has heard of its grant, as its key holds the name from that
//!   revision; one whose campaign gave up at that moment (cancelled, timed out, or its session
//!   ended on this client first) is shown until its key is deleted, by that campaign's cleanup
//!   or with its lease, though its campaign never returns a leadership.
//! - **What ends leadership**: a resignation (its key and record deleted in one transaction,
//!   guarded by the key's create revision), or the lease ending (revoked, or expired when this
//!   client stops keeping it alive: both key and record go with it), or the key deleted by
//!   someone else. The guard's `lost()` fires as for a lock.
//! - **Observers** ([`observe`](dlock_api::DistributedLock::observe)) read the leader, then
//!   watch the name's keys and its record in one etcd watch (on the client's shared watch
//!   stream) from the revision after that read, so nothing in between is missed; each revision
//!   the watch reports is read again *at that revision*, so the states come in order. They are
//!   woken by the server only (no timer): a leader that crashes is reported `Vacant` (or the
//!   next `Leads`) when etcd expires its lease. A broken watch stream is reopened and every watch
//!   made again from the revision after its last event, with nothing missed; a watch whose
//!   history was compacted meanwhile, or a read that failed, yields `Missed` then the state now
//!   (after a failed read: one error item, then a try every `OBSERVE_RETRY`). Dropping the stream
//!   cancels its watch on the server. A hand-over is one revision (the old leader's key and
//!   record deleted, the candidate's key now the oldest with its value): observers go from one
//!   leader to the next without a `Vacant` between.
//! - **A candidate whose lease ends while it waits** (etcd-io/etcd #19597) is never told it
//!   leads: its queue key went with the lease, a waiter is granted only at a revision where its
//!   own key exists, and a campaign whose key went fails with `Lost` (`SessionExpired`) at once;
//!   its caller decides whether to stand again. (A lock's waiter in its place joins the line
//!   again on a live lease within its wait.) A campaign that fails after its grant resigns at
//!   once (etcd-io/etcd #21128).
//! - **What is left on the server**: nothing after a resignation. A leader that vanished
//!   without resigning leaves its key and record until its lease ends (its TTL after its last
//!   keep-alive), then nothing; a dropped leadership is resigned in the background, as a
//!   dropped guard is released. A record whose key was deleted by someone else stays on the
//!   still-live lease until that lease ends or a later leader of the name proclaims or resigns,
//!   ignored meanwhile, one per name at most. A semaphore's permit cannot proclaim (`Unsupported`).
//! - **Older clients**: a dlock client from before candidates' keys carried their value reads
//!   `lead:VALUE` as an unknown limit, so its acquire or campaign behind such a key is refused
//!   (`InvalidArgument`), and its `leader()` shows nobody for a leader that has not proclaimed
//!   since its grant: upgrade every client of an election's names together.
//!
//! ## Connecting
//! `etcd://[user:password@]host[:port][,host[:port]…][/prefix][?option=value…]`, or `etcds://`
//! for TLS (feature `tls`; options `ca_cert`, `cert`, `key`). See [`EtcdConfig`] for the
//! options. The client sets HTTP/2 keep-alive (also while idle), connect and request timeouts,
//! and `require_leader`, so a member cut off from its leader fails requests instead of hanging;
//! since the client library's connect touches no server, `connect` reads once to prove the
//! cluster answers. Idempotent requests are retried on failure (the balancer may pick another
//! member); streams are reopened. With `user:password`, `etcd://` sends the password in clear.
//! A client outlives the tokio runtime it was made on (a `static` shared by `#[tokio::test]`s):
//! its first use after that runtime shut down connects again on the caller's, and starts there
//! the watch stream and the keep-alives of the leases its guards still hold.
//!
//! ## Cargo features
//! - `tls`: `etcds://` (TLS) with rustls and the system's roots.
//! - `driver`: `EtcdConfig::connect_options`, the etcd-client options of every client dlock
//!   makes, for tools that talk to the same server with the driver directly, as `dlock bench`'s
//!   raw floors do. These types follow the driver's versions, so they are opt-in and outside this
//!   crate's stable surface.
//! - `testing`: hooks dlock's own fault suites use; not for applications, not covered by semver.
//!
//! ## Performance
//! `dlock bench --backend etcd://… --rounds 3 --duration 2s` measures this backend against its
//! raw protocol floor (the driver alone doing the same server work) in the same run, and prints
//! the ratio. What those runs measured, VM by VM, and what was tried to close the gap, is in the
//! repository's `BENCHMARKS.md`: numbers of one machine age with it, so they are not kept here.
//!
//! ## Fault model and versions
//! A lock is as safe as etcd's linearizability and the lease deadline: a holder that stops (GC
//! pause, partition) past its lease may find its lock taken, and only the fencing token protects
//! the resource then. Crash liveness is the TTL + up to 0.5 s (the leader checks expiry every
//! 500 ms) + raft, plus up to a TTL per leader change (a new leader restarts every lease at its
//! full TTL).
//!
//! etcd 3.4.x before 3.4.31/3.4.38 has lease and watch bugs (leases revoked by an old leader,
//! keep-alives answering success for a revoked lease, watch events lost after compaction). This
//! backend defends against them (own-key watches, a re-read before holding, fallback re-reads,
//! a compacted watch re-reads), and is tested against 3.4.23; in production use **etcd 3.5.23+
//! or 3.6**.
//!
//! Building needs `protoc` and the protobuf well-known includes (`protobuf-compiler` and
//! `libprotobuf-dev` on Debian): the client library compiles etcd's API at build time.
#![cfg_attr(docsrs, feature(doc_cfg))]
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod client;
mod config;
mod connection;
mod election;
mod error;
mod held;
mod keys;
mod lease;
mod lock;
mod own_key;
mod queue;
mod session;
mod watch;

pub use config::{DEFAULT_PORT, EtcdConfig};
pub use lock::EtcdLock;

dlock_api::impl_distributed_lock!(EtcdLock);

/// The URL schemes this backend serves: `etcd://` and `etcds://` (TLS).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];

/// How the `dlock` facade and CLI find this backend: its name, [`SCHEMES`], and a connect from
/// a URL and options ([`EtcdConfig::from_url`], then [`EtcdConfig::set_option`] for each option).
pub const REGISTRATION: dlock_api::raw::Registration =
    dlock_api::registration!(BACKEND, SCHEMES, EtcdConfig, EtcdLock);

pub(crate) const BACKEND: &str = "etcd";
