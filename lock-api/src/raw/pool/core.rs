//! [`PoolCore`]: the connections of one client, their registry and their upkeep (queued
//! unlocks, keepalive, closing a connection and losing its guards).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, error::Elapsed, timeout, timeout_at};

use super::connection::Connection;
use super::driver::{DriverError, PoolConfig, SessionDriver};
use super::registry::{Registry, SharedPick, WaitPick};
use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::raw::Claim;
use crate::raw::local_queue::LocalQueue;
use crate::raw::time::after;
use crate::status::LostReason;

pub(super) type Conn<D> = Arc<Connection<D>>;

/// Why [`PoolCore::close_all`] closes each connection.
const CLIENT_CLOSED: &str = "the client was closed";

/// What a grant holds on its connection, as its `claim` asked: a lock (limit 1), a reader's
/// share, or one of `limit` permits of a semaphore, on `slot` (`None` before the server named
/// one: an undo); `leader` once a lock's holder has proclaimed, so that its release clears the
/// record it wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Hold {
    pub(super) claim: Claim,
    pub(super) slot: Option<u32>,
    pub(super) leader: bool,
}

impl Hold {
    /// A grant of `claim`, on `slot` for a permit.
    pub(super) fn granted(claim: Claim, slot: Option<u32>) -> Self {
        Self {
            claim,
            slot,
            leader: false,
        }
    }

    /// Whatever an attempt for `claim` may have taken.
    pub(super) fn any(claim: Claim) -> Self {
        Self::granted(claim, None)
    }
}

/// The shared state of one client's pool on one runtime.
pub(super) struct PoolCore<D: SessionDriver> {
    pub(super) driver: Arc<D>,
    pub(super) config: PoolConfig,
    registry: Mutex<Registry<D::Key, Conn<D>>>,
    /// Something in the registry changed: a connection freed up or closed, a key settled.
    changed: Notify,
    /// This client's waiters per name: one at a time waits at the server.
    pub(super) waiters: LocalQueue,
    next_id: AtomicU64,
}

impl<D: SessionDriver> PoolCore<D> {
    pub(super) fn new(driver: Arc<D>, config: PoolConfig) -> Self {
        Self {
            driver,
            config,
            registry: Mutex::new(Registry::default()),
            changed: Notify::new(),
            waiters: LocalQueue::new(),
            next_id: AtomicU64::new(1),
        }
    }

    pub(super) fn registry(&self) -> MutexGuard<'_, Registry<D::Key, Conn<D>>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.changed.notify_waiters();
    }

    pub(super) fn unavailable(&self, why: impl Into<String>) -> LockError {
        LockError::unavailable_because(self.driver.backend(), why)
    }

    fn closed(&self) -> DriverError {
        DriverError::broken(self.unavailable("the connection is closed"))
    }

    /// Opens a connection outside the registry, within the connect timeout.
    pub(super) async fn open_raw(&self) -> Result<(D::Conn, u64)> {
        let within = self.config.connect_timeout;
        match timeout(within, self.driver.open()).await {
            Ok(opened) => opened,
            Err(_) => Err(LockError::command_timeout(self.driver.backend(), within)),
        }
    }

    /// Wraps an open connection and starts its task (queued unlocks, keepalive).
    pub(super) fn adopt(self: &Arc<Self>, conn: D::Conn, server_id: u64) -> Conn<D> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (connection, unlocks) = Connection::new(id, server_id, conn);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // Made here, not in the task: a runtime that shuts down before it first polls
                // the task drops it unstarted, and the guard must be in it by then.
                let stranded = CloseIfStranded {
                    core: Arc::downgrade(self),
                    conn: Arc::downgrade(&connection),
                };
                runtime.spawn(connection_task(stranded, unlocks, self.config.keepalive));
            }
            Err(_) => tracing::warn!(
                backend = self.driver.backend(),
                "dlock: a connection opened outside a tokio runtime is not kept alive"
            ),
        }
        connection
    }

    /// Opens a connection counted already by a pick; gives the count back if it fails.
    pub(super) async fn open_counted(self: &Arc<Self>, waiting: bool) -> Result<Conn<D>> {
        /// Gives the count back if the open fails or is cancelled.
        struct Counted<'a, D: SessionDriver>(&'a PoolCore<D>, bool, bool);
        impl<D: SessionDriver> Drop for Counted<'_, D> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.registry().open_failed(self.2);
                    self.0.notify();
                }
            }
        }
        let mut counted = Counted(self, true, waiting);
        let (conn, server_id) = self.open_raw().await?;
        counted.1 = false;
        Ok(self.adopt(conn, server_id))
    }

    /// Picks the connection for a non-blocking attempt on `key` (for `name`, as `claim` asks),
    /// reserving the key there. `Ok(None)`: this client holds or acquires as many as `claim`
    /// allows, or holds the key in the mode that excludes `claim`'s, so the answer is "busy";
    /// also when every connection waits and `patient` is false. A patient pick waits for a connection until the command timeout.
    /// The bool says whether the connection is new.
    ///
    /// # Errors
    /// [`permits_mismatch`](crate::raw::permits_mismatch) when this client has `key` in use
    /// with another number of permits (a reader's share counts as a lock's one).
    pub(super) async fn pick_shared(
        self: &Arc<Self>,
        name: &LockName,
        key: &D::Key,
        claim: Claim,
        patient: bool,
    ) -> Result<Option<(Conn<D>, bool)>> {
        let give_up = after(Instant::now(), self.config.command_timeout);
        let mut may_spread = true;
        // Most picks succeed at once: only a pick that must wait registers for changes (a lock
        // on the notifier's waiter list), and then picks again before it waits.
        let mut armed = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            if armed {
                changed.as_mut().enable();
            }
            let max = self.config.max_connections;
            let pick = if may_spread {
                self.registry().pick_shared(key, claim, max)
            } else {
                self.registry().pick_shared_gathered(key, claim, max)
            };
            match pick {
                SharedPick::Busy => return Ok(None),
                SharedPick::Mismatch(in_use) => {
                    return Err(crate::raw::permits_mismatch(name, claim.limit, in_use));
                }
                SharedPick::Use(conn) => return Ok(Some((conn, false))),
                SharedPick::Full if !patient => return Ok(None),
                SharedPick::Settling | SharedPick::Full if !armed => armed = true,
                SharedPick::Settling => {
                    if timeout_at(give_up, changed).await.is_err() {
                        return Ok(None);
                    }
                }
                SharedPick::Full => {
                    if timeout_at(give_up, changed).await.is_err() {
                        return Err(self.unavailable(format!(
                            "all {} connections are waiting on locks (raise `max_connections`)",
                            self.config.max_connections
                        )));
                    }
                }
                SharedPick::OpenToSpread => match self.open_counted(false).await {
                    Ok(conn) => return Ok(self.reserve_opened(conn, key, claim)),
                    Err(error) => {
                        // Only wanted, not needed: a connection that holds locks will do.
                        tracing::debug!(%error, "could not open a connection to spread locks over");
                        may_spread = false;
                    }
                },
                SharedPick::Open => {
                    let conn = self.open_counted(false).await?;
                    return Ok(self.reserve_opened(conn, key, claim));
                }
            }
        }
    }

    /// Registers a connection opened for an attempt on `key`, reserving the key there; `None`
    /// if someone of ours started on the key while this one opened.
    fn reserve_opened(&self, conn: Conn<D>, key: &D::Key, claim: Claim) -> Option<(Conn<D>, bool)> {
        let reserved = self
            .registry()
            .opened(conn.id, conn.clone(), Some((key, claim)), false);
        self.notify();
        reserved.then_some((conn, true))
    }

    /// Registers a connection opened for a set's attempt, reserving every key of `keys` there;
    /// false (and registered idle) if someone of ours started on one of them while it opened.
    pub(super) fn adopt_for_all(&self, conn: &Conn<D>, keys: &[D::Key]) -> bool {
        let reserved = {
            let mut registry = self.registry();
            registry.opened(conn.id, conn.clone(), None, false);
            registry.reserve_all(conn.id, keys, Claim::LOCK)
        };
        self.notify();
        reserved
    }

    /// A connection that holds nothing, lent to one server-side wait; `Ok(None)` if none is
    /// free by `wake_at`.
    pub(super) async fn take_waiting(
        self: &Arc<Self>,
        wake_at: Instant,
    ) -> Result<Option<Conn<D>>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let pick = self.registry().pick_waiting(self.config.max_connections);
            match pick {
                WaitPick::Use(conn) => return Ok(Some(conn)),
                WaitPick::Open => {
                    let conn = self.open_counted(true).await?;
                    self.registry().opened(conn.id, conn.clone(), None, true);
                    return Ok(Some(conn));
                }
                WaitPick::Full => {
                    if timeout_at(wake_at, changed).await.is_err() {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The attempt on `conn` ended; see [`Registry::attempt_done`].
    pub(super) fn attempt_done(&self, conn: &Connection<D>, key: &D::Key, granted: bool) -> bool {
        let alive = self.registry().attempt_done(conn.id, key, granted);
        self.notify();
        alive && !conn.is_dead()
    }

    /// The wait on `conn` ended; see [`Registry::wait_done`].
    pub(super) fn wait_done(
        &self,
        conn: &Connection<D>,
        granted: Option<(&D::Key, Claim)>,
    ) -> bool {
        let alive = self.registry().wait_done(conn.id, granted);
        self.notify();
        alive && !conn.is_dead()
    }

    /// Counts an unlock on `conn` as its load until the returned mark is dropped, so that
    /// attempts go to a connection with no statement waiting or running instead of queueing
    /// behind it.
    pub(super) fn unlocking<'a>(&'a self, conn: &'a Connection<D>) -> UnlockInFlight<'a, D> {
        self.registry().unlock_started(conn.id);
        UnlockInFlight { core: self, conn }
    }

    /// `key` was released (or found gone) on `conn`.
    pub(super) fn forget(&self, conn: &Connection<D>, key: &D::Key) {
        if self.registry().forget(conn.id, key) {
            self.notify();
        }
    }

    /// Queues an owner-checked unlock of `key` on `conn` (no runtime needed here). Recorded
    /// first, so an attempt on the key waits for it instead of calling the name busy while the
    /// client's record lags the server.
    pub(super) fn queue_unlock(&self, conn: &Connection<D>, key: D::Key, hold: Hold) {
        self.registry().mark_releasing(conn.id, &key);
        conn.send_unlock(key, hold);
    }

    /// The driver's non-blocking attempt for `claim`: the token and, for a permit, its slot.
    pub(super) async fn try_on_conn(
        &self,
        c: &mut D::Conn,
        name: &LockName,
        key: &D::Key,
        claim: Claim,
    ) -> std::result::Result<Option<(u64, Option<u32>)>, DriverError> {
        if claim.shared {
            let token = self.driver.try_lock_shared(c, name, key).await?;
            Ok(token.map(|token| (token, None)))
        } else if claim.limit <= 1 {
            let token = self.driver.try_lock(c, name, key).await?;
            Ok(token.map(|token| (token, None)))
        } else {
            let granted = self.driver.try_permit(c, name, key, claim.limit).await?;
            Ok(granted.map(|(token, slot)| (token, Some(slot))))
        }
    }

    /// The driver's server-side wait for `claim`.
    ///
    /// A candidate's wait (`leading`: the value it publishes) goes through the driver's
    /// [`wait_lock_as_leader`](SessionDriver::wait_lock_as_leader); the second value says
    /// whether its grant wrote the leader's record too.
    pub(super) async fn wait_on_conn(
        &self,
        c: &mut D::Conn,
        (name, key): (&LockName, &D::Key),
        claim: Claim,
        wait: Duration,
        leading: Option<&[u8]>,
    ) -> std::result::Result<(super::driver::Waited, bool), DriverError> {
        let waited = if claim.shared {
            self.driver.wait_lock_shared(c, name, key, wait).await
        } else if claim.limit > 1 {
            self.driver
                .wait_permit(c, name, key, claim.limit, wait)
                .await
        } else if let Some(value) = leading {
            return self
                .driver
                .wait_lock_as_leader(c, name, key, wait, value)
                .await;
        } else {
            self.driver.wait_lock(c, key, wait).await
        };
        waited.map(|waited| (waited, false))
    }

    /// The driver's unlock of what `hold` says (owner-checked): true if it was held.
    pub(super) async fn unlock_on(
        &self,
        c: &mut D::Conn,
        key: &D::Key,
        hold: Hold,
    ) -> std::result::Result<bool, DriverError> {
        if hold.leader {
            self.driver.unlock_leader(c, key).await
        } else if hold.claim.shared {
            self.driver.unlock_shared(c, key).await
        } else if hold.claim.limit <= 1 {
            self.driver.unlock(c, key).await
        } else {
            self.driver
                .unlock_permit(c, key, hold.claim.limit, hold.slot)
                .await
        }
    }

    /// Closes `conn` (its driver connection is in `guard`): every guard it held is lost.
    pub(super) fn close(&self, conn: &Connection<D>, guard: &mut Option<D::Conn>, why: &str) {
        let closed = guard.take();
        if !conn.mark_dead() {
            return;
        }
        let held = self.registry().remove(conn.id).unwrap_or(0);
        // One end for every guard on the connection.
        conn.guards.end(LostReason::SessionClosed);
        self.notify();
        // A connection that held nothing, closed because its client was, is the normal end of
        // a program: not worth a warning.
        if held > 0 || (closed.is_some() && why != CLIENT_CLOSED) {
            tracing::warn!(
                backend = self.driver.backend(),
                connection = conn.server_id,
                locks_lost = held,
                why,
                "dlock: a lock connection closed"
            );
        } else {
            tracing::debug!(
                backend = self.driver.backend(),
                connection = conn.server_id,
                why,
                "dlock: a connection closed"
            );
        }
        drop(closed);
    }

    /// Closes every connection: the client was closed ([`CLIENT_CLOSED`]).
    pub(super) async fn close_all(&self) {
        let connections = self.registry().connections();
        for conn in connections {
            let mut guard = conn.conn.lock().await;
            self.close(&conn, &mut guard, CLIENT_CLOSED);
        }
    }

    /// The driver connection of a locked `guard`.
    pub(super) fn conn_mut<'g>(
        &self,
        guard: &'g mut Option<D::Conn>,
    ) -> std::result::Result<&'g mut D::Conn, DriverError> {
        guard.as_mut().ok_or_else(|| self.closed())
    }

    /// The result of a driver call made under `limit`: a broken connection or a timeout closes
    /// `conn` (cut off mid-command, its state is unknown).
    pub(super) fn settle<T>(
        &self,
        conn: &Connection<D>,
        guard: &mut Option<D::Conn>,
        limit: Duration,
        outcome: std::result::Result<std::result::Result<T, DriverError>, Elapsed>,
    ) -> std::result::Result<T, DriverError> {
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(failure)) => {
                if failure.broken {
                    self.close(conn, guard, "connection error");
                }
                Err(failure)
            }
            Err(_) => {
                self.close(conn, guard, "a command timed out");
                Err(DriverError::broken(LockError::command_timeout(
                    self.driver.backend(),
                    limit,
                )))
            }
        }
    }

    /// Unlocks `key` on `conn` after a statement that may have taken it without anyone wanting
    /// it (safe: the connection did not hold the key before); if that fails, closes the
    /// connection, which frees the lock for sure.
    pub(super) async fn undo(
        &self,
        conn: &Connection<D>,
        guard: &mut Option<D::Conn>,
        key: &D::Key,
        claim: Claim,
    ) {
        self.undo_hold(conn, guard, key, Hold::any(claim)).await;
    }

    /// [`undo`](Self::undo) of what `hold` says: a candidate's grant that may have written the
    /// leader's record is undone with the record.
    pub(super) async fn undo_hold(
        &self,
        conn: &Connection<D>,
        guard: &mut Option<D::Conn>,
        key: &D::Key,
        hold: Hold,
    ) {
        let Some(c) = guard.as_mut() else { return };
        let limit = self.config.command_timeout;
        let outcome = timeout(limit, self.unlock_on(c, key, hold)).await;
        if self.settle(conn, guard, limit, outcome).is_err() {
            self.close(conn, guard, "could not undo an unwanted grant");
        }
    }

    /// From another connection, interrupts the statement running on the connection the server
    /// knows as `target`.
    pub(super) async fn interrupt(&self, target: u64) -> Result<()> {
        let limit = self.config.command_timeout;
        let shared = self.registry().least_busy_shared();
        match shared {
            Some(conn) => {
                let mut guard = conn.conn.lock().await;
                let c = self.conn_mut(&mut guard).map_err(|f| f.error)?;
                let outcome = timeout(limit, self.driver.interrupt(c, target)).await;
                self.settle(&conn, &mut guard, limit, outcome)
                    .map_err(|f| f.error)
            }
            None => {
                // A short-lived extra connection, outside the registry.
                let (mut c, _) = self.open_raw().await?;
                match timeout(limit, self.driver.interrupt(&mut c, target)).await {
                    Ok(done) => done.map_err(|f| f.error),
                    Err(_) => Err(LockError::command_timeout(self.driver.backend(), limit)),
                }
            }
        }
    }

    /// A queued unlock: unlock (owner-checked), then clear the slot.
    async fn run_queued_unlock(&self, conn: &Connection<D>, key: D::Key, hold: Hold) {
        let _load = self.unlocking(conn);
        let mut guard = conn.conn.lock().await;
        if let Some(c) = guard.as_mut() {
            let limit = self.config.command_timeout;
            let outcome = timeout(limit, self.unlock_on(c, &key, hold)).await;
            if let Err(failure) = self.settle(conn, &mut guard, limit, outcome) {
                tracing::warn!(error = %failure.error, "dlock: a background unlock failed; closing its connection");
                self.close(conn, &mut guard, "a background unlock failed");
            }
        }
        drop(guard);
        self.forget(conn, &key);
    }

    /// Pings `conn` unless it is lent to a wait or busy (a connection in use is checked by that
    /// use). A failure closes it and loses its guards.
    async fn keep_alive(&self, conn: &Connection<D>) {
        if !self.registry().is_shared(conn.id) {
            return;
        }
        let Ok(mut guard) = conn.conn.try_lock() else {
            return;
        };
        let Some(c) = guard.as_mut() else { return };
        let limit = self.config.command_timeout;
        let outcome = timeout(limit, self.driver.ping(c)).await;
        let _ = self.settle(conn, &mut guard, limit, outcome);
    }
}

/// An unlock counted in its connection's load; see [`PoolCore::unlocking`].
pub(super) struct UnlockInFlight<'a, D: SessionDriver> {
    core: &'a PoolCore<D>,
    conn: &'a Connection<D>,
}

impl<D: SessionDriver> Drop for UnlockInFlight<'_, D> {
    fn drop(&mut self) {
        self.core.registry().unlock_ended(self.conn.id);
    }
}

/// Per connection: runs queued unlocks in order and keeps the connection alive. Ends when the
/// connection closes or the pool is gone; dropped unfinished with its runtime, it closes the
/// connection (`stranded`).
async fn connection_task<D: SessionDriver>(
    stranded: CloseIfStranded<D>,
    mut unlocks: mpsc::UnboundedReceiver<(D::Key, Hold)>,
    keepalive: Duration,
) {
    // A config built in code may carry a zero keepalive, which `interval` refuses.
    let mut tick = tokio::time::interval(keepalive.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            queued = unlocks.recv() => {
                let Some((key, hold)) = queued else { return };
                let Some((core, conn)) = stranded.upgrade() else { return };
                core.run_queued_unlock(&conn, key, hold).await;
            }
            _ = tick.tick() => {
                let Some((core, conn)) = stranded.upgrade() else { return };
                if conn.is_dead() {
                    return;
                }
                core.keep_alive(&conn).await;
            }
        }
    }
}

/// Closes a connection whose task is dropped while the connection and its pool live on: the
/// task's runtime shut down (a `#[tokio::test]` ended, say) and took the connection's socket
/// with it, which was registered there. Its locks are gone with it: its guards are told so at
/// once, and the pool opens another connection on the runtime that asks next instead of
/// handing this one out.
struct CloseIfStranded<D: SessionDriver> {
    core: Weak<PoolCore<D>>,
    conn: Weak<Connection<D>>,
}

impl<D: SessionDriver> CloseIfStranded<D> {
    /// The pool and the connection, while both live.
    fn upgrade(&self) -> Option<(Arc<PoolCore<D>>, Conn<D>)> {
        Some((self.core.upgrade()?, self.conn.upgrade()?))
    }
}

impl<D: SessionDriver> Drop for CloseIfStranded<D> {
    fn drop(&mut self) {
        let Some((core, conn)) = self.upgrade() else {
            return;
        };
        if conn.is_dead() {
            return;
        }
        // A statement running on it from another runtime now fails there, and closes it.
        if let Ok(mut guard) = conn.conn.try_lock() {
            core.close(&conn, &mut guard, "the tokio runtime it ran on shut down");
        }
    }
}
