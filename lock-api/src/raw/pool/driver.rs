//! What a backend supplies to a [`SessionPool`](super::SessionPool): how to open a connection
//! and the few statements that lock, wait, unlock, ping and interrupt on it.

use std::fmt::Debug;
use std::hash::Hash;
use std::time::Duration;

use async_trait::async_trait;

use crate::election::Leader;
use crate::error::LockError;
use crate::name::LockName;

/// How a driver call failed, and whether the connection survived it.
#[derive(Debug)]
pub struct DriverError {
    /// The error the caller sees.
    pub error: LockError,
    /// The connection is unusable (I/O error, server gone, connection killed): the pool closes
    /// it, and every guard on it is lost. When false the statement failed on a live connection,
    /// and the pool undoes a lock the statement may have taken before it failed.
    pub broken: bool,
}

impl DriverError {
    /// The connection is gone or in an unknown state.
    pub fn broken(error: LockError) -> Self {
        Self {
            error,
            broken: true,
        }
    }

    /// The statement failed; the connection is fine.
    pub fn statement(error: LockError) -> Self {
        Self {
            error,
            broken: false,
        }
    }
}

/// How one server-side wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// Granted, with this fencing token.
    Granted(u64),
    /// One permit of a semaphore granted, with this fencing token, on this slot (what
    /// [`SessionDriver::unlock_permit`] releases).
    GrantedSlot(u64, u32),
    /// The wait ran out without the lock.
    NotGranted,
    /// The wait ran out with an error that can race a grant (Postgres raises `lock_timeout` with
    /// the lock already in the session's table): not granted, but the pool unlocks (owner-checked)
    /// before the connection is used again.
    NotGrantedUnsure,
}

/// What one attempt at a set of keys on one connection found
/// ([`SessionDriver::try_lock_all`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TriedAll {
    /// Every key granted, with these fencing tokens, in the keys' order.
    Granted(Vec<u64>),
    /// A key is held by someone else: the attempt holds none of them any more.
    Busy,
    /// The attempt holds none of them, and a key's own attempt decides what it is: held in
    /// another mode than a lock's (a semaphore's permits), say, which a single attempt
    /// refuses with [`permits_mismatch`](crate::raw::permits_mismatch).
    OneByOne,
}

/// The lock statements of one SQL server, for a [`SessionPool`](super::SessionPool).
///
/// Every method runs one exchange on a connection the pool lent it. The pool bounds each call
/// with its timeouts and closes a connection whose call timed out, so a driver needs no timeouts
/// of its own; it only tells a broken connection from a failed statement ([`DriverError`]).
/// Locks are per connection on the server (MySQL `GET_LOCK`, Postgres session advisory locks);
/// the pool makes sure a key is never locked twice on one connection (both servers would stack
/// it) and that a lock is released on the connection that took it.
#[async_trait]
pub trait SessionDriver: Debug + Send + Sync + 'static {
    /// One server connection.
    type Conn: Send + 'static;
    /// The server-side lock key (a mapped name, an advisory key).
    type Key: Clone + Eq + Hash + Debug + Send + Sync + 'static;

    /// The backend tag for errors (`"mysql"`).
    fn backend(&self) -> &'static str;

    /// Opens and sets up a connection; returns it with the server's id for it (what
    /// [`interrupt`](Self::interrupt) targets).
    ///
    /// # Errors
    /// Whatever keeps the connection from opening; the pool bounds it by its connect timeout.
    async fn open(&self) -> Result<(Self::Conn, u64), LockError>;

    /// Takes `key` (of `name`) without waiting: `Some(token)` if granted, `None` if someone
    /// holds it. A server that keeps semaphores on the same keys refuses a name held as a
    /// semaphore with [`permits_mismatch`](crate::raw::permits_mismatch).
    async fn try_lock(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
    ) -> Result<Option<u64>, DriverError>;

    /// Takes every key of `keys` (of `names`, in the same order) on this one connection
    /// without waiting, all or none: [`TriedAll::Granted`] with a token per key, drawn after
    /// its grant as [`try_lock`](Self::try_lock) draws it; otherwise the driver has released
    /// every key it took in this call. The pool runs it only on a connection that holds none of
    /// the keys. A statement error may leave some taken: the pool then unlocks each
    /// (owner-checked).
    ///
    /// The default is [`try_lock_each`]: a round trip per key; a server that can try them all
    /// in one statement does better.
    async fn try_lock_all(
        &self,
        conn: &mut Self::Conn,
        names: &[LockName],
        keys: &[Self::Key],
    ) -> Result<TriedAll, DriverError> {
        try_lock_each(self, conn, names, keys).await
    }

    /// Waits on the server for `key`, for at most `wait`.
    async fn wait_lock(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        wait: Duration,
    ) -> Result<Waited, DriverError>;

    /// Releases `key` if this connection holds it: true if it did.
    async fn unlock(&self, conn: &mut Self::Conn, key: &Self::Key) -> Result<bool, DriverError>;

    /// Takes one of `permits` permits of `key` (`permits` >= 2) without waiting:
    /// `Some((token, slot))` if granted, `None` if all are taken. A name in use with another
    /// number of permits (a lock has one) is refused with
    /// [`permits_mismatch`](crate::raw::permits_mismatch), as a statement error after which the
    /// pool calls `unlock_permit(.., None)`. The pool never runs it on a connection that holds
    /// a permit of `key` already, so a connection holds at most one permit of a name. The
    /// default answers `Unsupported`.
    async fn try_permit(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
        permits: u32,
    ) -> Result<Option<(u64, u32)>, DriverError> {
        let _ = (conn, name, key, permits);
        Err(DriverError::statement(crate::semaphore::unsupported(
            self.backend(),
        )))
    }

    /// Waits on the server, for at most `wait`, for one of `permits` permits of `key`:
    /// [`Waited::GrantedSlot`] when granted. A driver may wait less than `wait` (the pool asks
    /// again). The default answers `Unsupported`.
    async fn wait_permit(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
        permits: u32,
        wait: Duration,
    ) -> Result<Waited, DriverError> {
        let _ = (conn, name, key, permits, wait);
        Err(DriverError::statement(crate::semaphore::unsupported(
            self.backend(),
        )))
    }

    /// Releases the permit of `key` this connection holds on `slot`: true if it did. With
    /// `slot` `None`, undoes whatever a failed or unwanted `try_permit`/`wait_permit` may have
    /// left of `key` on this connection. The default answers `Unsupported`.
    async fn unlock_permit(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
        permits: u32,
        slot: Option<u32>,
    ) -> Result<bool, DriverError> {
        let _ = (conn, key, permits, slot);
        Err(DriverError::statement(crate::semaphore::unsupported(
            self.backend(),
        )))
    }

    /// Takes a reader's share of `key` (of `name`) without waiting: `Some(token)` if granted,
    /// `None` if a writer (the key's lock) holds it **or waits for it**, so that a waiting
    /// writer goes before readers that come after it. A name held as a semaphore of several
    /// permits is refused with [`permits_mismatch`](crate::raw::permits_mismatch), as a
    /// statement error after which the pool calls [`unlock_shared`](Self::unlock_shared). The
    /// pool never runs it on a connection that holds `key` in any mode. The default answers
    /// `Unsupported`.
    async fn try_lock_shared(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
    ) -> Result<Option<u64>, DriverError> {
        let _ = (conn, name, key);
        Err(DriverError::statement(crate::reader_writer::unsupported(
            self.backend(),
        )))
    }

    /// Waits on the server, for at most `wait`, for a reader's share of `key`, in the server's
    /// queue with the writers (readers waiting together ahead of the next writer are let in
    /// together): [`Waited::Granted`] when granted. The default answers `Unsupported`.
    async fn wait_lock_shared(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
        wait: Duration,
    ) -> Result<Waited, DriverError> {
        let _ = (conn, name, key, wait);
        Err(DriverError::statement(crate::reader_writer::unsupported(
            self.backend(),
        )))
    }

    /// Releases the reader's share of `key` this connection holds (and whatever else a
    /// reader's statement takes with it): true if it did. Also the undo of a failed or unwanted
    /// `try_lock_shared`/`wait_lock_shared`. The default answers `Unsupported`.
    async fn unlock_shared(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
    ) -> Result<bool, DriverError> {
        let _ = (conn, key);
        Err(DriverError::statement(crate::reader_writer::unsupported(
            self.backend(),
        )))
    }

    /// Writes `term` and `value` as the leader's record of `name` (whose key is `key`), in one
    /// statement, **only if this connection holds `key` now** (checked on the server, not from
    /// the client's records) and no record of a higher term is there; with the record goes
    /// what [`leader`](Self::leader) needs to tell whether its writer still holds the key (the
    /// connection's server id). Returns whether it wrote. The pool runs it on the connection
    /// that holds the lease, and releases that lease with
    /// [`unlock_leader`](Self::unlock_leader). The default answers `Unsupported`.
    async fn proclaim(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
        term: u64,
        value: &[u8],
    ) -> Result<bool, DriverError> {
        let _ = (conn, name, key, term, value);
        Err(DriverError::statement(crate::election::unsupported(
            self.backend(),
        )))
    }

    /// The leader's record of `name` (whose key is `key`), counted only if the connection that
    /// wrote it holds `key` **now**: a record left by a connection that closed, or by a holder
    /// that released, reads as `None` without anyone cleaning it up. Runs on any connection of
    /// the pool. The default answers `Unsupported`.
    async fn leader(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
    ) -> Result<Option<Leader>, DriverError> {
        let _ = (conn, name, key);
        Err(DriverError::statement(crate::election::unsupported(
            self.backend(),
        )))
    }

    /// [`wait_lock`](Self::wait_lock) for a campaign's candidate: on a grant, the same statement
    /// also writes `value` as the leader's record of `name`, with the grant's token as the term,
    /// as [`proclaim`](Self::proclaim) would (never over a higher term), so the new leader needs
    /// no round trip of its own before it leads. Returns the wait's outcome and whether the
    /// record was written with the token it returns (a token changed after the statement, by a
    /// fence's renewal say, is not: the pool then proclaims as usual). Nothing is written unless
    /// granted. The default waits with `wait_lock` and writes nothing.
    async fn wait_lock_as_leader(
        &self,
        conn: &mut Self::Conn,
        name: &LockName,
        key: &Self::Key,
        wait: Duration,
        value: &[u8],
    ) -> Result<(Waited, bool), DriverError> {
        let _ = (name, value);
        Ok((self.wait_lock(conn, key, wait).await?, false))
    }

    /// Releases `key` as [`unlock`](Self::unlock) does, and deletes the leader's record this
    /// connection wrote for it (only if its writer is this connection: a successor's record
    /// stays): what the pool runs instead of `unlock` for a lease that proclaimed. Without it a
    /// record would count again as soon as its connection took the key once more, for a lock
    /// or another campaign that has not proclaimed yet. The default is `unlock`, for drivers
    /// without elections, whose leases never proclaim.
    async fn unlock_leader(
        &self,
        conn: &mut Self::Conn,
        key: &Self::Key,
    ) -> Result<bool, DriverError> {
        self.unlock(conn, key).await
    }

    /// A bell that rings when the leader's record of `key` may have changed (a proclaim, a
    /// resignation, a successor's first proclaim), heard from the server as it happens, so that
    /// observers read the record at once. Made before the observer's first read, so a change
    /// between that read and the bell is not missed. `Ok(None)`, the default: the server tells
    /// nobody, and observers read every [`OBSERVE_RETRY`](crate::raw::OBSERVE_RETRY). No server
    /// rings for a connection that dies, so observers with a bell still read now and then (see
    /// [`SessionPool::observe_leader`](super::SessionPool::observe_leader)).
    ///
    /// # Errors
    /// Whatever keeps the bell from being set up (its connection, its subscribe); the observer
    /// reads on its timer meanwhile and asks again later.
    async fn leader_bell(
        &self,
        key: &Self::Key,
    ) -> Result<Option<crate::raw::ChangeBell>, LockError> {
        let _ = key;
        Ok(None)
    }

    /// A round trip that proves the connection (and so its locks) alive.
    async fn ping(&self, conn: &mut Self::Conn) -> Result<(), DriverError>;

    /// From `conn`, interrupts the statement running on the connection the server knows as
    /// `target` (`KILL QUERY`, `pg_cancel_backend`). A late interrupt must not harm the target's
    /// next statement; the pool repeats it until the wait it cancels is over, and sends nothing
    /// else on the target meanwhile.
    async fn interrupt(&self, conn: &mut Self::Conn, target: u64) -> Result<(), DriverError>;
}

/// [`SessionDriver::try_lock_all`] one key after another on `conn` with the driver's
/// [`try_lock`](SessionDriver::try_lock), a round trip each, unlocking what it took at the
/// first busy key: the trait's default, and the fallback of a driver whose one statement does
/// not fit every configuration.
///
/// # Errors
/// The driver's, as they come; what was taken before is left to the pool's undo.
pub async fn try_lock_each<D: SessionDriver + ?Sized>(
    driver: &D,
    conn: &mut D::Conn,
    names: &[LockName],
    keys: &[D::Key],
) -> Result<TriedAll, DriverError> {
    let mut tokens = Vec::with_capacity(keys.len());
    for (name, key) in names.iter().zip(keys) {
        match driver.try_lock(conn, name, key).await? {
            Some(token) => tokens.push(token),
            None => {
                for taken in keys.iter().take(tokens.len()) {
                    driver.unlock(conn, taken).await?;
                }
                return Ok(TriedAll::Busy);
            }
        }
    }
    Ok(TriedAll::Granted(tokens))
}

/// The limits and cadences of a [`SessionPool`](super::SessionPool).
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Connections the client opens at most: shared ones holding locks, ones borrowed for one
    /// server-side wait, idle ones. At most all but one wait at the server at once, so tries and
    /// releases always find a connection.
    pub max_connections: usize,
    /// Bound on opening a connection.
    pub connect_timeout: Duration,
    /// Bound on each statement's reply (a wait gets its wait on top).
    pub command_timeout: Duration,
    /// How often each shared connection is pinged: the bound on noticing a killed connection,
    /// whose guards are then lost.
    pub keepalive: Duration,
    /// The longest single server-side wait; longer waits are issued again, so a silently dead
    /// connection is noticed within this plus the command timeout.
    pub wait_chunk: Duration,
    /// How long past its deadline a wait still waits for the server's own answer before it gives
    /// up on the client side and interrupts the server's wait.
    pub wait_slack: Duration,
}

impl PoolConfig {
    /// A pool of at most `max_connections`, with the given timeouts and keepalive cadence; waits
    /// go to the server in pieces of at most 30 s, and the client gives up on a server's wait
    /// 250 ms past its deadline.
    pub fn new(
        max_connections: usize,
        connect_timeout: Duration,
        command_timeout: Duration,
        keepalive: Duration,
    ) -> Self {
        Self {
            max_connections,
            connect_timeout,
            command_timeout,
            keepalive,
            wait_chunk: Duration::from_secs(30),
            wait_slack: Duration::from_millis(250),
        }
    }

    /// Sets the longest single server-side wait.
    pub fn with_wait_chunk(mut self, wait_chunk: Duration) -> Self {
        self.wait_chunk = wait_chunk;
        self
    }
}
