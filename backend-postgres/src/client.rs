//! The client's connections: a few **sessions**, each holding many locks, plus connections
//! borrowed for one blocking wait at a time.
//!
//! Rules kept here (see the crate docs for why):
//! - a key is never locked on a session that holds it, or has an attempt on it in flight
//!   (advisory locks stack per session: that would let a second guard in and leave a stacked
//!   lock behind);
//! - a blocking wait runs on a connection that holds nothing else (an *exclusive* one), so it
//!   never stalls other guards' releases; after the grant that connection is a session like any;
//! - a lock is released on the session that took it; a session goes back to idle only when it
//!   holds nothing;
//! - at most `max_connections` connections; lockers wait for one rather than exceed it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, LocalQueue, PendingAcquire, Session as GuardSession};
use dlock_api::{LockError, LostReason, Result};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::{ConnectOptions, Connection, Row};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};

use crate::config::PostgresConfig;
use crate::error::{
    LOCK_NOT_AVAILABLE, QUERY_CANCELED, is_connection_error, map_err, sqlstate, timed_out,
    unavailable,
};
use crate::key::RawKey;
use crate::sql::{self, Sql};

/// One connection and its server-side session.
pub(crate) struct Session {
    pub(crate) id: u64,
    /// The backend's process id (for `pg_cancel_backend` and for operators).
    pub(crate) pid: i32,
    /// `None` once the session was closed (killed, failed): its locks are gone.
    pub(crate) conn: tokio::sync::Mutex<Option<PgConnection>>,
    dead: AtomicBool,
    /// Unlocks queued from places that cannot await (drop, cancelled acquires); the session's
    /// task runs them in order.
    unlocks: mpsc::UnboundedSender<RawKey>,
    /// The fate every guard on this session shares: ended (lost) when the session closes.
    pub(crate) guards: Arc<GuardSession>,
    /// The client, for the bookkeeping of queued unlocks.
    client: Weak<Client>,
}

impl Session {
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Queues an owner-checked unlock of `key` on this session (works without a runtime at the
    /// call site; the session's task runs it).
    pub(crate) fn queue_unlock(&self, key: RawKey) {
        // Recorded first, so a try on the key waits for this unlock instead of calling the name
        // busy while the client's own record lags the server.
        if let Some(client) = self.client.upgrade() {
            client.mark_releasing(self.id, key);
        }
        let _ = self.unlocks.send(key);
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .field("dead", &self.is_dead())
            .finish()
    }
}

enum Slot {
    /// An attempt is in flight, or a granted wait awaits its acquire: nobody else may lock the
    /// key here.
    Pending,
    /// An unlock of the key is queued on this session (a dropped guard, a cancelled attempt);
    /// `attempt`: the slot was an attempt's, counted in `inflight`.
    Releasing { attempt: bool },
    /// A guard holds the key on this session.
    /// (Its guard learns of a closed session through the session's `guards`.)
    Held,
}

struct Entry {
    session: Arc<Session>,
    slots: HashMap<RawKey, Slot>,
    /// Borrowed for one blocking wait: not for shared use.
    exclusive: bool,
    /// Non-blocking attempts queued on this session (to spread concurrent attempts).
    inflight: u32,
}

impl Entry {
    fn is_idle(&self) -> bool {
        self.slots.is_empty() && !self.exclusive && self.inflight == 0
    }
}

#[derive(Default)]
struct State {
    /// Open connections plus connections being opened.
    total: usize,
    sessions: HashMap<u64, Entry>,
    /// Keys this client holds or is acquiring on a shared session, with a count of slots.
    local: HashMap<RawKey, u32>,
}

impl State {
    fn add_local(&mut self, key: RawKey) {
        *self.local.entry(key).or_default() += 1;
    }

    fn drop_local(&mut self, key: RawKey) {
        if let Some(n) = self.local.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.local.remove(&key);
            }
        }
    }
}

/// A granted lock, on its way from the wait task to the acquire: if it is dropped before the
/// acquire turns it into a guard (the acquire was cancelled), the lock is released.
pub(crate) struct Grant {
    pub(crate) session: Arc<Session>,
    pub(crate) key: RawKey,
    pub(crate) token: i64,
    armed: bool,
}

impl Grant {
    pub(crate) fn disarm(mut self) -> (Arc<Session>, i64) {
        self.armed = false;
        (self.session.clone(), self.token)
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.armed {
            self.session.queue_unlock(self.key);
        }
    }
}

/// How one server-side wait ended.
pub(crate) enum WaitOutcome {
    Granted(Grant),
    /// `lock_timeout` fired: the lock is still someone else's.
    NotGranted,
}

/// What the blocking path got while looking for a connection.
pub(crate) enum Exclusive {
    Session(Arc<Session>),
    /// No connection became free before `wake_at`.
    Woke,
}

/// One client: its configuration, statements and connections.
pub(crate) struct Client {
    pub(crate) config: PostgresConfig,
    pub(crate) sql: Sql,
    connect: PgConnectOptions,
    state: Mutex<State>,
    /// This client's waiters per name: one at a time waits at the server.
    pub(crate) waiters: LocalQueue,
    /// Signalled when a connection may have become free (idle, closed).
    capacity: Notify,
    next_id: AtomicU64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock_state();
        f.debug_struct("Client")
            .field("config", &self.config)
            .field("connections", &st.total)
            .field("held_keys", &st.local.len())
            .finish()
    }
}

/// The connect options every dlock connection uses.
pub(crate) fn connect_options(config: &PostgresConfig) -> PgConnectOptions {
    let mut options = PgConnectOptions::new_without_pgpass()
        .host(&config.host)
        .port(config.port)
        .username(&config.user)
        .database(&config.database)
        .ssl_mode(PgSslMode::Disable)
        .application_name(&config.application_name)
        .options([
            // Fence tokens must survive a crash even where the server runs asynchronously.
            ("synchronous_commit", "on".to_owned()),
            // A blocking wait is bounded by lock_timeout, not by a server-wide statement limit.
            ("statement_timeout", "0".to_owned()),
            ("idle_in_transaction_session_timeout", "0".to_owned()),
            // pg_advisory_unlock of a key not held warns; we handle the `false` ourselves.
            ("client_min_messages", "error".to_owned()),
            (
                "tcp_keepalives_idle",
                config.tcp_keepalives_idle.as_secs().max(1).to_string(),
            ),
            (
                "tcp_keepalives_interval",
                config.tcp_keepalives_interval.as_secs().max(1).to_string(),
            ),
            (
                "tcp_keepalives_count",
                config.tcp_keepalives_count.to_string(),
            ),
        ])
        .disable_statement_logging();
    if let Some(password) = &config.password {
        options = options.password(password.expose());
    }
    options
}

/// Opens one connection within the connect timeout.
pub(crate) async fn open_connection(config: &PostgresConfig) -> Result<PgConnection> {
    open_with(&connect_options(config), config.connect_timeout).await
}

pub(crate) async fn open_with(
    options: &PgConnectOptions,
    within: Duration,
) -> Result<PgConnection> {
    match timeout(within, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) if matches!(e, sqlx::Error::Database(_)) && !is_connection_error(&e) => {
            // Authentication, unknown database, …: a configuration problem, not an outage.
            Err(crate::config::config_error(format!(
                "the server refused the connection: {}",
                e.as_database_error().map(|d| d.message()).unwrap_or("")
            )))
        }
        Ok(Err(e)) => Err(LockError::unavailable(crate::BACKEND, e)),
        Err(_) => Err(timed_out(within)),
    }
}

/// Releases `key` on `conn`, retrying if a late cancel request (ours) hits the statement.
/// Returns whether the session held the key.
pub(crate) async fn unlock_on(
    conn: &mut PgConnection,
    key: RawKey,
    within: Duration,
) -> Result<bool> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        match timeout(within, sql::unlock(key).fetch_one(&mut *conn)).await {
            Ok(Ok(row)) => return row.try_get::<bool, _>(0).map_err(map_err),
            Ok(Err(e)) if attempts < 3 && sqlstate(&e).as_deref() == Some(QUERY_CANCELED) => {}
            Ok(Err(e)) => return Err(map_err(e)),
            Err(_) => return Err(timed_out(within)),
        }
    }
}

impl Client {
    pub(crate) fn new(config: PostgresConfig, sql: Sql) -> Self {
        Self {
            connect: connect_options(&config),
            config,
            sql,
            state: Mutex::new(State::default()),
            waiters: LocalQueue::new(),
            capacity: Notify::new(),
            next_id: AtomicU64::new(1),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this client holds `key` (or is acquiring it on a shared session).
    pub(crate) fn holds_locally(&self, key: RawKey) -> bool {
        self.lock_state().local.contains_key(&key)
    }

    /// Number of open connections (for tests and `Debug`).
    pub(crate) fn connections(&self) -> usize {
        self.lock_state().total
    }

    /// Opens a connection and starts its session task. Counts against `total` already; gives
    /// the count back if it fails or is cancelled.
    async fn open_session(self: &Arc<Self>) -> Result<Arc<Session>> {
        struct Opening<'a>(&'a Client, bool);
        impl Drop for Opening<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.lock_state().total -= 1;
                    self.0.capacity.notify_waiters();
                }
            }
        }
        let mut opening = Opening(self, true);
        let conn = open_with(&self.connect, self.config.connect_timeout).await?;
        let session = self.adopt(conn).await?;
        opening.1 = false;
        Ok(session)
    }

    /// Wraps an open connection into a session and starts its task.
    async fn adopt(self: &Arc<Self>, mut conn: PgConnection) -> Result<Arc<Session>> {
        let within = self.config.command_timeout;
        // The backend pid, and no idle_session_timeout (PG 14+) on a session holding locks.
        let row = timeout(
            within,
            sqlx::query(
                "SELECT pg_backend_pid(), (SELECT set_config('idle_session_timeout', '0', false) \
                 WHERE current_setting('server_version_num')::int >= 140000)",
            )
            .fetch_one(&mut conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)?;
        let pid: i32 = row.try_get(0).map_err(map_err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let session = Arc::new(Session {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            pid,
            conn: tokio::sync::Mutex::new(Some(conn)),
            dead: AtomicBool::new(false),
            unlocks: tx,
            guards: Arc::default(),
            client: Arc::downgrade(self),
        });
        tokio::spawn(session_task(
            Arc::downgrade(self),
            Arc::downgrade(&session),
            rx,
            self.config.keepalive,
        ));
        Ok(session)
    }

    /// Parks an already open connection (the one `connect` checked the server with) as idle.
    pub(crate) async fn adopt_idle(self: &Arc<Self>, conn: PgConnection) -> Result<()> {
        let session = self.adopt(conn).await?;
        self.lock_state().total += 1;
        self.insert(session, None, false);
        self.capacity.notify_waiters();
        Ok(())
    }

    fn insert(&self, session: Arc<Session>, pending: Option<RawKey>, exclusive: bool) {
        let mut st = self.lock_state();
        let mut slots = HashMap::new();
        let mut inflight = 0;
        if let Some(key) = pending {
            slots.insert(key, Slot::Pending);
            inflight = 1;
            st.add_local(key);
        }
        st.sessions.insert(
            session.id,
            Entry {
                session,
                slots,
                exclusive,
                inflight,
            },
        );
    }

    /// Closes `session` (its connection is in `conn`): every guard it holds is lost.
    pub(crate) fn kill(&self, session: &Session, conn: &mut Option<PgConnection>, why: &str) {
        session.dead.store(true, Ordering::Release);
        let closed = conn.take();
        let mut lost = 0;
        {
            let mut st = self.lock_state();
            if let Some(entry) = st.sessions.remove(&session.id) {
                st.total -= 1;
                for (key, slot) in entry.slots {
                    st.drop_local(key);
                    if matches!(slot, Slot::Held) {
                        lost += 1;
                    }
                }
            }
        }
        // One end for every guard on the session.
        session.guards.end(LostReason::SessionClosed);
        self.capacity.notify_waiters();
        if lost > 0 || closed.is_some() {
            tracing::warn!(
                pid = session.pid,
                locks_lost = lost,
                "postgres: session closed: {why}"
            );
        }
        drop(closed);
    }

    /// Picks a shared session for a non-blocking attempt on `key` and reserves the key there.
    /// `None`: this client already holds (or is acquiring) `key`, so the answer is "busy".
    /// With `patient` false, gives up at once (as "busy") when no connection is free.
    async fn pick_shared(
        self: &Arc<Self>,
        key: RawKey,
        patient: bool,
    ) -> Result<Option<Arc<Session>>> {
        enum Next {
            Busy,
            /// Our own attempt or cleanup on the key is in flight: its answer comes within a
            /// round trip, so wait for it rather than call a free name busy.
            Settling,
            Use(Arc<Session>),
            Open,
            Wait,
        }
        let give_up = after(Instant::now(), self.config.command_timeout);
        loop {
            let notified = self.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut st = self.lock_state();
                if st.local.contains_key(&key) {
                    let releasing = st
                        .sessions
                        .values()
                        .any(|e| matches!(e.slots.get(&key), Some(Slot::Releasing { .. })));
                    if releasing {
                        Next::Settling
                    } else {
                        Next::Busy
                    }
                } else {
                    // Least busy first; among equals, a session that already holds locks (so
                    // locks gather on few sessions and idle connections stay free for waits).
                    let best = st
                        .sessions
                        .values()
                        .filter(|e| {
                            !e.exclusive && !e.session.is_dead() && !e.slots.contains_key(&key)
                        })
                        .min_by_key(|e| (e.inflight, e.slots.is_empty()))
                        .map(|e| (e.session.id, e.inflight));
                    let pick = match best {
                        Some((id, 0)) => Some(id),
                        _ if st.total < self.config.max_connections => None,
                        Some((id, _)) => Some(id),
                        None => None,
                    };
                    match pick {
                        Some(id) => {
                            let entry = st.sessions.get_mut(&id).expect("picked session exists");
                            entry.slots.insert(key, Slot::Pending);
                            entry.inflight += 1;
                            let session = entry.session.clone();
                            st.add_local(key);
                            Next::Use(session)
                        }
                        None if st.total < self.config.max_connections => {
                            st.total += 1;
                            Next::Open
                        }
                        None => Next::Wait,
                    }
                }
            };
            match next {
                Next::Busy => return Ok(None),
                Next::Settling => {
                    tokio::select! {
                        _ = notified => continue,
                        _ = sleep_until(give_up) => return Ok(None),
                    }
                }
                Next::Use(session) => return Ok(Some(session)),
                Next::Wait if !patient => return Ok(None),
                Next::Wait => {
                    tokio::select! {
                        _ = notified => continue,
                        _ = sleep_until(give_up) => return Err(unavailable(format!(
                            "all {} connections are busy waiting for locks (max_connections)",
                            self.config.max_connections
                        ))),
                    }
                }
                Next::Open => {}
            }
            let session = self.open_session().await?;
            if self.holds_locally(key) {
                // Someone else of ours started on the key meanwhile: park the new connection.
                self.insert(session, None, false);
                self.capacity.notify_waiters();
                return Ok(None);
            }
            self.insert(session.clone(), Some(key), false);
            return Ok(Some(session));
        }
    }

    /// An unlock of `key` is queued on `session`: record it (see [`Slot::Releasing`]).
    fn mark_releasing(&self, session: u64, key: RawKey) {
        let mut st = self.lock_state();
        if let Some(slot) = st
            .sessions
            .get_mut(&session)
            .and_then(|entry| entry.slots.get_mut(&key))
        {
            let attempt = matches!(slot, Slot::Pending);
            *slot = Slot::Releasing { attempt };
        }
    }

    /// The attempt on `session` ended: forget its reservation (or slot) of `key`.
    pub(crate) fn remove_slot(&self, session: u64, key: RawKey, attempt: bool) {
        let changed = {
            let mut st = self.lock_state();
            let Some(entry) = st.sessions.get_mut(&session) else {
                return;
            };
            if attempt {
                entry.inflight = entry.inflight.saturating_sub(1);
            }
            let removed = entry.slots.remove(&key).is_some();
            let idle = entry.is_idle();
            if removed {
                st.drop_local(key);
            }
            removed || idle
        };
        if changed {
            // A connection freed up, or a key settled that a try may be waiting on.
            self.capacity.notify_waiters();
        }
    }

    /// The attempt on `session` was granted: the slot now belongs to a guard.
    fn set_held(&self, session: u64, key: RawKey, attempt: bool) -> bool {
        let mut st = self.lock_state();
        let Some(entry) = st.sessions.get_mut(&session) else {
            return false;
        };
        if attempt {
            entry.inflight = entry.inflight.saturating_sub(1);
        }
        entry.slots.insert(key, Slot::Held);
        true
    }

    /// One non-blocking attempt: `pg_try_advisory_lock` and the token in one statement, on a
    /// shared session. On success the slot is registered and the session, token and the guard's state
    /// are returned.
    ///
    /// With `patient` false (the polling fallback of a blocking acquire), an attempt that finds
    /// no free connection counts as busy instead of waiting for one.
    pub(crate) async fn try_lock(
        self: &Arc<Self>,
        key: RawKey,
        patient: bool,
    ) -> Result<Option<(Arc<Session>, i64, Arc<LeaseState>)>> {
        let within = self.config.command_timeout;
        let mut retried = false;
        loop {
            let Some(session) = self.pick_shared(key, patient).await? else {
                return Ok(None);
            };
            // From here until the slot is registered, a dropped future must not leave the key
            // held: the cleanup queues an owner-checked unlock on the same session (harmless if
            // the statement never ran), which also clears the reservation.
            let pending = {
                let session = session.clone();
                PendingAcquire::arm(move || session.queue_unlock(key))
            };
            let mut guard = session.conn.lock().await;
            let Some(conn) = guard.as_mut() else {
                // Closed while we queued; its slots went with it.
                drop(guard);
                pending.disarm();
                if retried {
                    return Err(unavailable("the session closed"));
                }
                retried = true;
                continue;
            };
            let outcome = timeout(within, self.sql.try_lock(key).fetch_one(&mut *conn)).await;
            let row = match outcome {
                Ok(Ok(row)) => row,
                Ok(Err(e)) if is_connection_error(&e) => {
                    self.kill(&session, &mut guard, "connection failed");
                    pending.disarm();
                    if !retried {
                        // A stale idle connection (server restarted): a fresh one may work.
                        retried = true;
                        continue;
                    }
                    return Err(map_err(e));
                }
                Ok(Err(e)) => {
                    // The lock may have been granted before the failure (e.g. nextval refused).
                    self.undo(&session, &mut guard, key).await;
                    drop(guard);
                    self.remove_slot(session.id, key, true);
                    pending.disarm();
                    return Err(map_err(e));
                }
                Err(_) => {
                    self.kill(&session, &mut guard, "statement timed out");
                    pending.disarm();
                    return Err(timed_out(within));
                }
            };
            drop(guard);
            let token: Option<i64> = match row.try_get(0) {
                Ok(token) => token,
                Err(e) => {
                    // Cannot tell: let the cleanup unlock.
                    return Err(map_err(e));
                }
            };
            return match token {
                Some(token) => {
                    let state = Arc::new(LeaseState::on_session(None, session.guards.clone()));
                    if !self.set_held(session.id, key, true) {
                        // Killed between the reply and here: the lock went with the session.
                        pending.disarm();
                        return Err(unavailable("the session closed"));
                    }
                    pending.disarm();
                    Ok(Some((session, token, state)))
                }
                None => {
                    self.remove_slot(session.id, key, true);
                    pending.disarm();
                    Ok(None)
                }
            };
        }
    }

    /// After a failed statement that may have taken `key`: unlock it, or close the session.
    async fn undo(&self, session: &Session, guard: &mut Option<PgConnection>, key: RawKey) {
        let Some(conn) = guard.as_mut() else { return };
        if unlock_on(conn, key, self.config.command_timeout)
            .await
            .is_err()
        {
            self.kill(session, guard, "could not undo a failed lock statement");
        }
    }

    /// Takes a connection that holds nothing for one blocking wait, opening one if allowed.
    /// Returns [`Exclusive::Woke`] if none is free by `wake_at`.
    pub(crate) async fn take_exclusive(
        self: &Arc<Self>,
        wake_at: Option<Instant>,
    ) -> Result<Exclusive> {
        loop {
            let notified = self.capacity.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let taken = {
                let mut st = self.lock_state();
                let idle = st
                    .sessions
                    .values_mut()
                    .find(|e| e.is_idle() && !e.session.is_dead());
                if let Some(entry) = idle {
                    entry.exclusive = true;
                    Some(Some(entry.session.clone()))
                } else if st.total < self.config.max_connections {
                    st.total += 1;
                    Some(None)
                } else {
                    None
                }
            };
            match taken {
                Some(Some(session)) => return Ok(Exclusive::Session(session)),
                Some(None) => {
                    let session = self.open_session().await?;
                    self.insert(session.clone(), None, true);
                    return Ok(Exclusive::Session(session));
                }
                None => match wake_at {
                    Some(at) => tokio::select! {
                        _ = notified => {}
                        _ = sleep_until(at) => return Ok(Exclusive::Woke),
                    },
                    None => notified.await,
                },
            }
        }
    }

    /// Gives an exclusive connection back (the wait ended without a lock).
    pub(crate) fn end_exclusive(&self, session: u64) {
        {
            let mut st = self.lock_state();
            if let Some(entry) = st.sessions.get_mut(&session) {
                entry.exclusive = false;
            }
        }
        self.capacity.notify_waiters();
    }

    /// Registers a granted blocking wait: the connection turns into a shared session holding
    /// `key` (as a reservation until the acquire registers the guard).
    fn grant_exclusive(&self, session: u64, key: RawKey) -> bool {
        let mut st = self.lock_state();
        let Some(entry) = st.sessions.get_mut(&session) else {
            return false;
        };
        entry.exclusive = false;
        entry.slots.insert(key, Slot::Pending);
        st.add_local(key);
        true
    }

    /// Turns a [`Grant`]'s reservation into a guard's slot.
    pub(crate) fn hold_granted(&self, session: u64, key: RawKey) -> bool {
        self.set_held(session, key, false)
    }

    /// Runs one server-side wait (`pg_advisory_lock` under `lock_timeout = slice`) on the
    /// exclusive `session`, in a task of its own so that a dropped acquire can be cleaned up:
    /// the task then sends a cancel request for the wait and releases the lock if it was
    /// granted anyway.
    pub(crate) fn spawn_wait(
        self: &Arc<Self>,
        session: Arc<Session>,
        key: RawKey,
        slice: Duration,
    ) -> oneshot::Receiver<Result<WaitOutcome>> {
        let (mut tx, rx) = oneshot::channel();
        let client = self.clone();
        tokio::spawn(async move {
            let outcome = client.wait_on(&session, key, slice, &mut tx).await;
            let outcome = match outcome {
                Ok(Some(token)) => {
                    if client.grant_exclusive(session.id, key) {
                        Ok(WaitOutcome::Granted(Grant {
                            session: session.clone(),
                            key,
                            token,
                            armed: true,
                        }))
                    } else {
                        Err(unavailable("the session closed"))
                    }
                }
                Ok(None) => {
                    client.end_exclusive(session.id);
                    Ok(WaitOutcome::NotGranted)
                }
                Err(e) => {
                    client.end_exclusive(session.id);
                    Err(e)
                }
            };
            // If the acquire is gone, the value comes back and is dropped: an unclaimed Grant
            // queues the unlock.
            let _ = tx.send(outcome);
        });
        rx
    }

    async fn wait_on(
        &self,
        session: &Session,
        key: RawKey,
        slice: Duration,
        tx: &mut oneshot::Sender<Result<WaitOutcome>>,
    ) -> Result<Option<i64>> {
        let ms = slice.as_millis().clamp(1, u64::MAX as u128) as u64;
        let bound = slice.saturating_add(self.config.command_timeout);
        let mut guard = session.conn.lock().await;
        let Some(conn) = guard.as_mut() else {
            return Err(unavailable("the session closed"));
        };
        let result = {
            let wait = timeout(bound, self.sql.wait_lock(key, ms).fetch_one(&mut *conn));
            tokio::pin!(wait);
            tokio::select! {
                result = &mut wait => result,
                _ = tx.closed() => {
                    // The acquire was dropped: stop the server-side wait now rather than let an
                    // orphaned wait take the lock later.
                    if let Err(error) = self.cancel_backend(session.pid).await {
                        tracing::warn!(pid = session.pid, %error, "postgres: could not cancel an abandoned lock wait; it ends at its lock_timeout");
                    }
                    wait.await
                }
            }
        };
        match result {
            Ok(Ok(row)) => match row.try_get::<i64, _>(0) {
                Ok(token) => Ok(Some(token)),
                Err(e) => {
                    self.undo(session, &mut guard, key).await;
                    Err(map_err(e))
                }
            },
            Ok(Err(e)) => match sqlstate(&e).as_deref() {
                Some(LOCK_NOT_AVAILABLE) => {
                    // Seen under load: `lock_timeout` fires as the lock is granted, and the error
                    // is raised with the lock already in the session's lock table. A session
                    // lock outlives the failed statement, so unlock (owner-checked: `false` if
                    // it was not granted) before this connection is used again, or close it.
                    self.undo(session, &mut guard, key).await;
                    Ok(None)
                }
                Some(QUERY_CANCELED) if tx.is_closed() => {
                    // Our cancel can land the same way, after the grant (or while the token
                    // is taken): undo as above.
                    self.undo(session, &mut guard, key).await;
                    Ok(None)
                }
                _ if is_connection_error(&e) => {
                    self.kill(session, &mut guard, "connection failed during a lock wait");
                    Err(map_err(e))
                }
                _ => {
                    self.undo(session, &mut guard, key).await;
                    Err(map_err(e))
                }
            },
            Err(_) => {
                self.kill(session, &mut guard, "a lock wait outlived its lock_timeout");
                Err(timed_out(bound))
            }
        }
    }

    /// `pg_cancel_backend(pid)` from a short-lived connection of our own.
    async fn cancel_backend(&self, pid: i32) -> Result<()> {
        let mut conn = open_with(&self.connect, self.config.connect_timeout).await?;
        let within = self.config.command_timeout;
        timeout(
            within,
            sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&mut conn),
        )
        .await
        .map_err(|_| timed_out(within))?
        .map_err(map_err)?;
        let _ = timeout(within, conn.close()).await;
        Ok(())
    }

    /// A queued unlock (dropped guard, cancelled acquire): unlock, then clear the slot.
    async fn run_queued_unlock(&self, session: &Session, key: RawKey) {
        let mut guard = session.conn.lock().await;
        if let Some(conn) = guard.as_mut() {
            match unlock_on(conn, key, self.config.command_timeout).await {
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(pid = session.pid, %error, "postgres: background unlock failed; closing the session");
                    self.kill(session, &mut guard, "background unlock failed");
                }
            }
        }
        drop(guard);
        // A cancelled attempt's reservation counted as in flight.
        let attempt = {
            let st = self.lock_state();
            st.sessions
                .get(&session.id)
                .and_then(|e| e.slots.get(&key))
                .is_some_and(|slot| {
                    matches!(slot, Slot::Pending | Slot::Releasing { attempt: true })
                })
        };
        self.remove_slot(session.id, key, attempt);
    }

    /// The keepalive: pings a session that holds locks; a failure closes it and fires `lost`.
    async fn ping_if_holding(&self, session: &Session) {
        let holding = {
            let st = self.lock_state();
            st.sessions
                .get(&session.id)
                .is_some_and(|e| e.slots.values().any(|s| matches!(s, Slot::Held)))
        };
        if !holding {
            return;
        }
        // A busy session is being used right now; that use notices a dead connection itself.
        let Ok(mut guard) = session.conn.try_lock() else {
            return;
        };
        let Some(conn) = guard.as_mut() else { return };
        let within = self.config.command_timeout;
        match timeout(within, conn.ping()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(pid = session.pid, %error, "postgres: keepalive failed");
                self.kill(session, &mut guard, "keepalive failed");
            }
            Err(_) => self.kill(session, &mut guard, "keepalive timed out"),
        }
    }
}

/// Per connection: runs queued unlocks in order and pings while the session holds locks. Ends
/// when the session is dropped.
async fn session_task(
    client: Weak<Client>,
    session: Weak<Session>,
    mut unlocks: mpsc::UnboundedReceiver<RawKey>,
    keepalive: Duration,
) {
    // A config built in code may carry a zero keepalive, which `interval` refuses.
    let mut tick = tokio::time::interval(keepalive.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            key = unlocks.recv() => {
                let Some(key) = key else { return };
                let (Some(client), Some(session)) = (client.upgrade(), session.upgrade()) else {
                    return;
                };
                client.run_queued_unlock(&session, key).await;
            }
            _ = tick.tick() => {
                let (Some(client), Some(session)) = (client.upgrade(), session.upgrade()) else {
                    return;
                };
                if session.is_dead() {
                    return;
                }
                client.ping_if_holding(&session).await;
            }
        }
    }
}
