//! [`SessionPool`]: the connection machinery of every backend whose locks live on a server
//! connection (MySQL `GET_LOCK`, Postgres session advisory locks), written once.
//!
//! A backend supplies a [`SessionDriver`]: how to open a connection, and one statement each to
//! try a lock, wait for one, unlock, ping and interrupt another connection's wait. The pool owns
//! everything else, the way OpenDAL's `MultipartWrite` trait is driven by one generic writer:
//!
//! - **Shared connections carry many locks.** An attempt runs on the least busy connection
//!   that does not hold the key (both servers stack a lock taken twice on one connection,
//!   which would let a second guard in). "Busy" counts every statement queued or running
//!   there, unlocks included, so an attempt does not wait behind another task's release. Until
//!   half of `max_connections` hold locks, a new lock goes to a connection holding none (one is
//!   opened if need be, and if the server refuses it, an open one does), so it never delays a
//!   release that is about to come; past that, locks gather on the connections that hold some,
//!   keeping the rest free for waits. A lock is released on the connection that took it; a
//!   connection is never reset or handed elsewhere while it holds anything.
//! - **Semaphores are locks with a holder limit.** A key asked with `permits` > 1 goes
//!   through the driver's `try_permit`/`wait_permit`/`unlock_permit` (the server picks the
//!   slot), along the same paths as a lock (which is the limit 1, with its own statements): the
//!   client reserves the key on at most `permits` connections, never twice on one, and refuses
//!   another number for a key it has in use
//!   ([`permits_mismatch`](crate::raw::permits_mismatch)) without asking the server; the
//!   server refuses it across clients.
//! - **Readers are locks in a shared mode.** A reader's claim
//!   ([`Claim`] with `shared`; the options of a `read` say so) goes through
//!   the driver's `try_lock_shared`/`wait_lock_shared`/`unlock_shared`, along the lock's paths.
//!   The client puts at most one share of a key on each connection, as it does permits: a
//!   connection that held a share would be granted the key's lock beside it (a server does not
//!   make a session wait for itself), and an undo of a share stacked on another could release
//!   the wrong one. So one client holds at most as many readers of a name as it has
//!   connections not lent to a wait; beyond, a reader's attempt is busy and its wait waits. The
//!   client's own readers make its writer busy without asking the server, and its writer its
//!   readers; a name this client uses as a semaphore of several permits refuses readers
//!   ([`permits_mismatch`](crate::raw::permits_mismatch), a share counting as a lock's one).
//! - **A set of locks tried together** ([`SessionPool::try_grant_all`]) reserves every key on
//!   one connection, where the driver's [`try_lock_all`](SessionDriver::try_lock_all) takes
//!   them all or none (one statement where the server allows); each grant is then a lock of
//!   its own on that connection, released and lost as a single attempt's.
//! - **A server-side wait gets a connection of its own** that holds nothing, so it never stalls
//!   other guards' releases; after the grant that connection is shared like any. At most all
//!   but one connection wait at once. This client's waiters for one name queue in the client
//!   ([`LocalQueue`](crate::raw::LocalQueue)) and one at a time waits at the server, except
//!   that readers next to each other in that line wait at the server together (each on a
//!   connection of its own): the server lets waiting readers in together only if each is in
//!   its queue, and a writer of this client that came before them is still served first,
//!   since they queue behind its turn.
//! - **Cancellation**: every statement runs to completion in a [`Detach`](crate::raw::Detach),
//!   so a dropped caller never leaves a connection mid-protocol; a dropped wait is interrupted
//!   from another connection, repeatedly until it is over, and a grant that raced the cancel is
//!   undone before the connection is used again.
//! - **Loss**: each connection is a [`Session`](crate::raw::Session) for its guards. A
//!   connection error, a statement past its timeout, or a failed keepalive ping closes it and
//!   ends that session once, which marks every guard on it lost.
//! - **Dropped guards** queue an owner-checked unlock on their connection, which its own task
//!   runs; no runtime is needed at the drop site.
//! - **Elections** are locks whose holder writes a record: the driver's `proclaim` writes it
//!   on the lease's own connection, owner-checked on the server; its `leader` reads it on any
//!   connection and counts it only while its writer's connection holds the key. Observers read
//!   again when the driver's [`leader_bell`](SessionDriver::leader_bell) rings (Postgres
//!   `NOTIFY`) and at least every second, or every
//!   [`OBSERVE_RETRY`](crate::raw::OBSERVE_RETRY) without a bell, since a dead connection
//!   tells nobody. A campaign whose wait loses its connection fails with
//!   [`LockError::Lost`](crate::LockError::Lost) (`SessionExpired`) instead of waiting again.
//! - **One set of connections per runtime.** A connection is driven by a task of the runtime
//!   that opened it, so each tokio runtime that uses the client gets connections of its own
//!   ([`PerRuntime`]), up to `max_connections` each: when one runtime
//!   ends (a `#[tokio::test]` among others running in parallel on a shared client), its
//!   connections close and their guards are lost, while locks held on the others go on.

mod acquire;
mod attempt;
mod connection;
mod core;
mod driver;
mod election;
mod lease;
mod registry;
mod set;

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

pub use driver::{DriverError, PoolConfig, SessionDriver, TriedAll, Waited, try_lock_each};

use crate::error::Result;
use crate::name::LockName;
use crate::options::LockOptions;
use crate::raw::engine::Grant;
use crate::raw::{Claim, Holdings, PerRuntime};

/// The connections of one client of a session-lock server; see the [module docs](self).
///
/// Cheap to clone: clones share the connections. Dropping the last clone and every guard closes
/// the connections, which frees their locks on the server.
pub struct SessionPool<D: SessionDriver> {
    shared: Arc<Shared<D>>,
}

struct Shared<D: SessionDriver> {
    driver: Arc<D>,
    config: PoolConfig,
    cores: PerRuntime<Arc<core::PoolCore<D>>>,
    holdings: Holdings,
}

impl<D: SessionDriver> Clone for SessionPool<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<D: SessionDriver> SessionPool<D> {
    /// A pool of `driver`'s connections; it opens none yet.
    pub fn new(driver: D, config: PoolConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                driver: Arc::new(driver),
                config,
                cores: PerRuntime::new(),
                holdings: Holdings::default(),
            }),
        }
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.shared.driver
    }

    /// The limits the pool runs with (`max_connections` is per runtime that uses the pool).
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// What the client of this pool holds: a backend's
    /// [`RawLock::holdings`](crate::raw::RawLock::holdings).
    pub fn holdings(&self) -> &Holdings {
        &self.shared.holdings
    }

    /// Closes every connection of the pool, on every runtime: a backend's
    /// [`RawLock::shutdown`](crate::raw::RawLock::shutdown), once `close` has released its
    /// locks. A connection lent to a wait is closed when the wait (which `close` ended) lets
    /// go of it.
    ///
    /// # Cancel safety
    /// Cancel safe: the connections not closed yet stay open, and close with the pool.
    pub async fn shutdown(&self) {
        for core in self.shared.cores.running() {
            core.close_all().await;
        }
    }

    /// The connections of the runtime this is called on. Outside a runtime, a set of its own
    /// that nothing keeps: its connections would have no task to keep them alive.
    fn core(&self) -> Arc<core::PoolCore<D>> {
        let make = || {
            Arc::new(core::PoolCore::new(
                self.shared.driver.clone(),
                self.shared.config.clone(),
            ))
        };
        self.shared
            .cores
            .get_or_make(|_| make())
            .unwrap_or_else(make)
    }

    /// Opens one idle connection now (at connect time, so a wrong address or password fails
    /// there rather than at the first acquire).
    ///
    /// # Errors
    /// What the driver's `open` returns, or a timeout past the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a connection half opened is dropped, and nothing is registered.
    pub async fn open_idle(&self) -> Result<()> {
        let (conn, server_id) = self.core().open_raw().await?;
        self.adopt_idle(conn, server_id);
        Ok(())
    }

    /// Keeps a connection the backend opened itself with [`SessionDriver::open`] (say, to check
    /// its schema at connect time) as an idle connection of the pool.
    pub fn adopt_idle(&self, conn: D::Conn, server_id: u64) {
        let core = self.core();
        let conn = core.adopt(conn, server_id);
        core.registry().adopt_idle(conn.id, conn);
    }

    /// One attempt to take `key` (for `name`) that does not wait at the server: `Ok(None)` if
    /// it is taken (by anyone, this client included). Waits up to the command timeout for a
    /// connection when every one is lent to a wait. `limit` is how many may hold it: 1 for a
    /// lock (the driver's [`try_lock`](SessionDriver::try_lock)), a semaphore's permits above
    /// that (its [`try_permit`](SessionDriver::try_permit)); the client puts at most one permit
    /// of a key on each connection, so it holds at most as many permits of one name as it has
    /// connections not lent to a wait.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](crate::LockError::Unavailable) when no connection can be had
    /// or the server does not answer; [`permits_mismatch`](crate::raw::permits_mismatch) when
    /// the name is in use with another limit, here or on the server; the driver's errors
    /// otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: the statement runs to completion in the background, and a lock it took is
    /// released there.
    pub async fn try_grant(
        &self,
        name: &LockName,
        key: &D::Key,
        limit: u32,
    ) -> Result<Option<Grant>> {
        let claim = Claim {
            limit,
            shared: false,
        };
        self.try_claim(name, key, claim).await
    }

    /// [`try_grant`](Self::try_grant) of what `claim` asks: a lock or a permit as there, or
    /// with `claim.shared` a reader's share of the name's lock (the driver's
    /// [`try_lock_shared`](SessionDriver::try_lock_shared)), busy while a writer holds it or
    /// waits for it. The client puts at most one share of a key on each connection.
    ///
    /// # Errors
    /// As [`try_grant`](Self::try_grant); a reader of a name in use as a semaphore of several
    /// permits is refused with [`permits_mismatch`](crate::raw::permits_mismatch).
    ///
    /// # Cancel safety
    /// As [`try_grant`](Self::try_grant).
    pub async fn try_claim(
        &self,
        name: &LockName,
        key: &D::Key,
        claim: Claim,
    ) -> Result<Option<Grant>> {
        acquire::try_grant(&self.core(), name, key, claim, true).await
    }

    /// One attempt at every key of `keys` (for `names`, in the same order) together on one
    /// connection, in the driver's [`try_lock_all`](SessionDriver::try_lock_all): each member a
    /// lock of its own there, released on its own and lost with the connection as a single
    /// [`try_grant`](Self::try_grant)'s grant is; or none. `Busy` when a key is taken (this
    /// client's own holds answer without the server); `OneByOne` when each key's own attempt
    /// should decide (a key in use here with another claim or on its way out, every
    /// connection lent to a wait, or a set of more than 64 keys). Locks only (the limit 1):
    /// semaphores and readers go one by one.
    ///
    /// # Errors
    /// As [`try_grant`](Self::try_grant).
    ///
    /// # Cancel safety
    /// Cancel safe: the attempt runs to completion in the background, and the locks it took
    /// are released there; a statement error unlocks every key on the connection.
    pub async fn try_grant_all(
        &self,
        names: &[LockName],
        keys: &[D::Key],
    ) -> Result<crate::raw::GrantedAtOnce> {
        set::try_grant_all(&self.core(), names, keys).await
    }

    /// Waits for `key` (for `name`) until `deadline` (`None`: no limit): `Ok(None)` if the
    /// deadline passed. A wait whose connection is killed waits again on a new one. With
    /// options that ask for a shared hold ([`LockOptions::is_shared`]) it waits for a reader's
    /// share, as [`try_claim`](Self::try_claim) takes one.
    ///
    /// # Errors
    /// As [`try_grant`](Self::try_grant), after the retries `options` allow.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call interrupts its server-side wait and releases the lock if the
    /// server granted it meanwhile.
    pub async fn wait_grant(
        &self,
        name: &LockName,
        key: &D::Key,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let claim = Claim::new(limit, options);
        acquire::wait_grant(&self.core(), name, key, claim, options, deadline).await
    }

    /// The leader of `name` (whose key is `key`) as the driver's
    /// [`leader`](SessionDriver::leader) reads it: counted only while the connection that
    /// wrote the record holds the key. Runs on the least busy shared connection, or on one that
    /// holds nothing.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](crate::LockError::Unavailable) when no connection can be had
    /// or the server does not answer; the driver's errors otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads, and the statement runs to completion in the background.
    pub async fn leader(&self, name: &LockName, key: &D::Key) -> Result<Option<crate::Leader>> {
        election::leader(&self.core(), name, key).await
    }

    /// A stream of `name`'s leader (whose key is `key`): the current state first, then the
    /// state read again whenever the driver's [`leader_bell`](SessionDriver::leader_bell)
    /// rings (a proclaim, a resignation, a successor's first proclaim, heard as it happens) and
    /// at least every second, or without a bell every
    /// [`OBSERVE_RETRY`](crate::raw::OBSERVE_RETRY). A session server tells nobody when a
    /// connection dies, so a dead leader that no successor replaces is seen only by reading
    /// again; a term that starts and ends between two reads goes unseen. A failed read is
    /// reported as an error item, and the next state read after it follows a
    /// [`LeaderEvent::Missed`](crate::LeaderEvent::Missed). Every state read is reported;
    /// [`raw::observe`](crate::raw::observe) drops the repeats. The stream holds no connection
    /// between reads: dropping it leaves nothing registered or borrowed but its share of the
    /// driver's bell.
    pub fn observe_leader(&self, name: &LockName, key: &D::Key) -> crate::LeaderStream {
        election::observe(self.clone(), name.clone(), key.clone())
    }

    /// The driver's [`leader_bell`](SessionDriver::leader_bell) for `key`, within the connect
    /// timeout and the command timeout together (it may open its connection and subscribe).
    async fn leader_bell(&self, key: &D::Key) -> Result<Option<crate::raw::ChangeBell>> {
        let config = &self.shared.config;
        let within = config
            .connect_timeout
            .saturating_add(config.command_timeout);
        tokio::time::timeout(within, self.shared.driver.leader_bell(key))
            .await
            .unwrap_or_else(|_| {
                Err(crate::LockError::unavailable_because(
                    self.shared.driver.backend(),
                    format!("no change bell within {within:?}"),
                ))
            })
    }

    /// Whether this client holds `key`, or has an attempt on it in flight.
    pub fn holds(&self, key: &D::Key) -> bool {
        let cores = self.shared.cores.running();
        cores.iter().any(|core| core.registry().holds(key))
    }

    /// The server's id of the connection holding `key` for one of this client's guards: for
    /// operators and fault tests (`KILL <id>`, `pg_terminate_backend(<pid>)`).
    pub fn holder(&self, key: &D::Key) -> Option<u64> {
        let cores = self.shared.cores.running();
        cores
            .iter()
            .find_map(|core| core.registry().holder(key).map(|c| c.server_id))
    }

    /// How many connections are open or being opened, on every runtime that still runs.
    pub fn connections(&self) -> usize {
        let cores = self.shared.cores.running();
        cores.iter().map(|core| core.registry().total()).sum()
    }
}

impl<D: SessionDriver> fmt::Debug for SessionPool<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionPool")
            .field("driver", &self.shared.driver)
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}
