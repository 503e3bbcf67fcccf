//! A client's connections ("sessions"), which of them holds which keys, and their keepalive.
//!
//! Rules this module keeps (the whole safety argument of the backend):
//! 1. A key is never locked on a connection that already holds it or is acquiring it (that would
//!    stack: the server counts `GET_LOCK`s per connection, so a second guard would get in and one
//!    `RELEASE_LOCK` would leave the lock held). The registry records every key a connection holds
//!    or is acquiring, and a connection is chosen only if its set lacks the key.
//! 2. A lock is released on the connection that took it: a lease holds its `Arc<Session>`.
//! 3. A blocking `GET_LOCK(key, wait)` runs only on a connection that holds nothing (it would stall
//!    the other guards' releases otherwise, and cannot be part of a user-lock deadlock); after the
//!    grant that connection is a session like any other.
//! 4. A connection goes back to the idle set only when its last key is released; nothing is ever
//!    reset or handed to another pool.
//! 5. Every command runs to completion in a spawned task, so a dropped caller never leaves a
//!    connection mid-protocol; a command that times out closes its connection.
//! 6. A connection that dies fires `lost(SessionClosed)` on every guard it held.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{Detach, LeaseState, LocalQueue, Session as GuardSession};
use dlock_api::{KeyMapper, LockName, LostReason, Result};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlSslMode};
use sqlx::{ConnectOptions, Connection, Executor, Row};
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::MySqlConfig;
use crate::error::{is_connection_error, map_err, timed_out, unavailable};
use crate::sql::{Cmd, Reply, Sql, exec};

/// One server connection of a client.
pub(crate) struct Session {
    /// Local id, for the registry.
    id: u64,
    /// `CONNECTION_ID()` on the server, for `KILL`.
    server_id: u64,
    /// `None` once closed.
    pub(crate) conn: tokio::sync::Mutex<Option<MySqlConnection>>,
    dead: AtomicBool,
    /// The fate every guard on this connection shares: ended (lost) when the connection dies.
    pub(crate) guards: Arc<GuardSession>,
}

impl Session {
    /// The server's id of this connection (`CONNECTION_ID()`).
    pub(crate) fn server_id(&self) -> u64 {
        self.server_id
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("server_id", &self.server_id)
            .field("dead", &self.is_dead())
            .finish()
    }
}

/// What the registry knows about one connection.
struct Entry {
    session: Arc<Session>,
    /// Keys held (`Some(state)`) or being acquired (`None`) on this connection.
    keys: HashMap<Arc<str>, Option<Arc<LeaseState>>>,
    /// Non-blocking acquires queued or running on it.
    inflight: usize,
    /// Dedicated to one blocking `GET_LOCK`.
    blocking: bool,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: Vec<Entry>,
    /// Connections being opened (counted against the limit).
    opening: usize,
    /// Of those, ones opened for a blocking wait.
    opening_blocking: usize,
}

impl Registry {
    fn total(&self) -> usize {
        self.entries.len() + self.opening
    }

    fn blocking(&self) -> usize {
        self.entries.iter().filter(|e| e.blocking).count() + self.opening_blocking
    }

    fn entry(&mut self, session: &Session) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.session.id == session.id)
    }
}

/// Where a non-blocking acquire runs.
pub(crate) enum TryCheckout {
    /// This client already holds or is acquiring the key: the answer is "busy".
    HeldHere,
    /// Run on this session (the key is reserved on it).
    Session { session: Arc<Session>, fresh: bool },
}

/// The shared state of one client.
pub(crate) struct Inner {
    pub(crate) config: MySqlConfig,
    pub(crate) sql: Sql,
    keys: KeyMapper,
    connect: MySqlConnectOptions,
    init: String,
    registry: Mutex<Registry>,
    /// This client's waiters per name: one at a time waits at the server.
    pub(crate) waiters: LocalQueue,
    /// Something in the registry changed: a connection freed up, a key was released.
    changed: tokio::sync::Notify,
    next_local: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Keys may use printable ASCII without spaces (trailing spaces may compare equal under PAD SPACE
/// rules); anything else goes into the digest.
fn key_char(c: char) -> bool {
    c.is_ascii_graphic()
}

/// The server's limit on lock names, in characters.
pub(crate) const MAX_KEY_CHARS: usize = 64;

impl Inner {
    pub(crate) fn new(config: MySqlConfig) -> Arc<Self> {
        let mut connect = MySqlConnectOptions::new()
            .host(&config.host)
            .port(config.port)
            .username(&config.username)
            .ssl_mode(MySqlSslMode::Disabled)
            .statement_cache_capacity(16)
            .disable_statement_logging();
        if let Some(password) = &config.password {
            connect = connect.password(password.expose());
        }
        if let Some(database) = &config.database {
            connect = connect.database(database);
        }
        let keys = KeyMapper::new(MAX_KEY_CHARS - config.prefix.len())
            .case_insensitive()
            .with_allowed(key_char);
        let inner = Arc::new(Self {
            sql: Sql::new(&config),
            init: Sql::init(&config),
            keys,
            connect,
            registry: Mutex::new(Registry::default()),
            waiters: LocalQueue::new(),
            changed: tokio::sync::Notify::new(),
            next_local: AtomicU64::new(0),
            config,
        });
        spawn_keepalive(&inner);
        inner
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `GET_LOCK` key of `name`: the prefix, then the name or its digest form.
    pub(crate) fn key(&self, name: &LockName) -> Arc<str> {
        format!("{}{}", self.config.prefix, self.keys.map(name)).into()
    }

    /// Opens a connection, counted against the limit by the caller (`opening`).
    async fn open(&self) -> Result<Arc<Session>> {
        let connect = async {
            let mut conn = MySqlConnection::connect_with(&self.connect).await?;
            conn.execute(sqlx::raw_sql(&self.init)).await?;
            let row = sqlx::query("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                .fetch_one(&mut conn)
                .await?;
            let server_id = row.try_get::<i64, _>(0)? as u64;
            Ok::<_, sqlx::Error>((conn, server_id))
        };
        let (conn, server_id) = timeout(self.config.connect_timeout, connect)
            .await
            .map_err(|_| timed_out(self.config.connect_timeout))?
            .map_err(map_err)?;
        Ok(Arc::new(Session {
            id: self.next_local.fetch_add(1, Ordering::Relaxed),
            server_id,
            conn: tokio::sync::Mutex::new(Some(conn)),
            dead: AtomicBool::new(false),
            guards: Arc::default(),
        }))
    }

    /// Opens a connection and registers it with `key` reserved (non-blocking) or as blocking.
    async fn open_registered(&self, key: Option<&Arc<str>>) -> Result<Arc<Session>> {
        let opened = self.open().await;
        let mut reg = self.registry();
        reg.opening -= 1;
        if key.is_none() {
            reg.opening_blocking -= 1;
        }
        let session = match opened {
            Ok(session) => session,
            Err(e) => {
                drop(reg);
                self.changed.notify_waiters();
                return Err(e);
            }
        };
        reg.next_id += 1;
        let mut keys = HashMap::new();
        if let Some(key) = key {
            keys.insert(key.clone(), None);
        }
        reg.entries.push(Entry {
            session: session.clone(),
            keys,
            inflight: 1,
            blocking: key.is_none(),
        });
        Ok(session)
    }

    /// Opens one idle connection (at connect time, so a wrong address or password fails there).
    pub(crate) async fn add_idle(&self) -> Result<()> {
        let session = self.open().await?;
        let mut reg = self.registry();
        reg.next_id += 1;
        reg.entries.push(Entry {
            session,
            keys: HashMap::new(),
            inflight: 0,
            blocking: false,
        });
        Ok(())
    }

    /// Picks the connection a non-blocking acquire of `key` runs on, and reserves `key` there.
    pub(crate) async fn checkout_for_try(&self, key: &Arc<str>) -> Result<TryCheckout> {
        let limit = after(Instant::now(), self.config.command_timeout);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let open_new = {
                let mut reg = self.registry();
                if reg.entries.iter().any(|e| e.keys.contains_key(key)) {
                    return Ok(TryCheckout::HeldHere);
                }
                let at_limit = reg.total() >= self.config.max_connections;
                let best = reg
                    .entries
                    .iter_mut()
                    .filter(|e| !e.blocking && !e.session.is_dead())
                    .min_by_key(|e| (e.inflight, e.keys.is_empty()));
                match best {
                    Some(entry) if entry.inflight == 0 || at_limit => {
                        entry.keys.insert(key.clone(), None);
                        entry.inflight += 1;
                        return Ok(TryCheckout::Session {
                            session: entry.session.clone(),
                            fresh: false,
                        });
                    }
                    _ if !at_limit => {
                        reg.opening += 1;
                        true
                    }
                    _ => false,
                }
            };
            if open_new {
                let session = self.open_registered(Some(key)).await?;
                return Ok(TryCheckout::Session {
                    session,
                    fresh: true,
                });
            }
            if timeout_at(limit, changed).await.is_err() {
                return Err(unavailable(format!(
                    "all {} connections are waiting on locks (raise `max_connections`)",
                    self.config.max_connections
                )));
            }
        }
    }

    /// A non-blocking acquire on `session` ended: keep `key` as held (`Some(state)`) or drop the
    /// reservation. Returns false if the session died meanwhile (its locks are gone).
    pub(crate) fn finish_try(
        &self,
        session: &Session,
        key: &Arc<str>,
        held: Option<Arc<LeaseState>>,
    ) -> bool {
        let mut reg = self.registry();
        let alive = match reg.entry(session) {
            Some(entry) => {
                entry.inflight -= 1;
                match held {
                    Some(state) => {
                        entry.keys.insert(key.clone(), Some(state));
                    }
                    None => {
                        entry.keys.remove(key);
                    }
                }
                true
            }
            None => false,
        };
        drop(reg);
        self.changed.notify_waiters();
        alive
    }

    /// A connection that holds nothing, dedicated to one blocking `GET_LOCK`; waits for one until
    /// `deadline`. At most `max_connections - 1` connections wait at once, so non-blocking
    /// acquires and releases always have a connection.
    pub(crate) async fn checkout_dedicated(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<Arc<Session>>> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let open_new = {
                let mut reg = self.registry();
                let may_block = reg.blocking() < self.config.max_connections - 1;
                let may_open = reg.total() < self.config.max_connections;
                let free = reg.entries.iter_mut().find(|e| {
                    !e.blocking && e.inflight == 0 && e.keys.is_empty() && !e.session.is_dead()
                });
                match free {
                    Some(entry) if may_block => {
                        entry.blocking = true;
                        entry.inflight += 1;
                        return Ok(Some(entry.session.clone()));
                    }
                    _ if may_block && may_open => {
                        reg.opening += 1;
                        reg.opening_blocking += 1;
                        true
                    }
                    _ => false,
                }
            };
            if open_new {
                return self.open_registered(None).await.map(Some);
            }
            match deadline {
                Some(deadline) => {
                    if timeout_at(deadline, changed).await.is_err() {
                        return Ok(None);
                    }
                }
                None => changed.await,
            }
        }
    }

    /// A blocking acquire on a dedicated session ended; `held` is the granted key.
    pub(crate) fn finish_dedicated(
        &self,
        session: &Session,
        held: Option<(Arc<str>, Arc<LeaseState>)>,
    ) -> bool {
        let mut reg = self.registry();
        let alive = match reg.entry(session) {
            Some(entry) => {
                entry.inflight -= 1;
                entry.blocking = false;
                if let Some((key, state)) = held {
                    entry.keys.insert(key, Some(state));
                }
                true
            }
            None => false,
        };
        drop(reg);
        self.changed.notify_waiters();
        alive
    }

    /// `key` was released (or found gone) on `session`: forget it there.
    pub(crate) fn forget_key(&self, session: &Session, key: &Arc<str>) {
        let mut reg = self.registry();
        if let Some(entry) = reg.entry(session) {
            entry.keys.remove(key);
        }
        drop(reg);
        self.changed.notify_waiters();
    }

    /// `session`'s connection is gone: every guard it held is lost.
    pub(crate) fn session_died(&self, session: &Session, why: &str) {
        if session.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut reg = self.registry();
        let position = reg.entries.iter().position(|e| e.session.id == session.id);
        let entry = position.map(|i| reg.entries.swap_remove(i));
        drop(reg);
        let held = entry.map_or(0, |e| e.keys.values().flatten().count());
        if held > 0 {
            tracing::warn!(
                connection = session.server_id,
                locks = held,
                why,
                "mysql: a session connection closed; its locks are lost"
            );
        }
        // One end for every guard on the connection.
        session.guards.end(LostReason::SessionClosed);
        self.changed.notify_waiters();
    }

    /// Runs `cmd` on `session` within `limit`, to completion even if the caller is dropped (see
    /// [`Detach`]), so a cancelled caller never leaves a connection mid-protocol. A connection error or a timeout closes the connection.
    pub(crate) async fn call(
        self: &Arc<Self>,
        session: &Arc<Session>,
        cmd: Cmd,
        limit: Duration,
    ) -> Result<Reply> {
        let (inner, session) = (self.clone(), session.clone());
        Detach::new(async move {
            let mut conn = session.conn.lock().await;
            inner.exec_locked(&session, &mut conn, &cmd, limit).await
        })
        .await
    }

    /// Runs `cmd` on the locked connection of `session`.
    pub(crate) async fn exec_locked(
        &self,
        session: &Session,
        conn: &mut Option<MySqlConnection>,
        cmd: &Cmd,
        limit: Duration,
    ) -> Result<Reply> {
        let Some(c) = conn.as_mut() else {
            return Err(unavailable("the connection is closed"));
        };
        match timeout(limit, exec(c, &self.sql, cmd)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) if is_connection_error(&e) => {
                *conn = None;
                self.session_died(session, "connection error");
                Err(map_err(e))
            }
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => {
                // Cut off mid-command: the connection's state is unknown, close it.
                *conn = None;
                self.session_died(session, "command timed out");
                Err(timed_out(limit))
            }
        }
    }

    /// Runs a short command on any live, non-blocking session (or a fresh connection).
    pub(crate) async fn control(self: &Arc<Self>, cmd: Cmd) -> Result<Reply> {
        let existing = {
            let reg = self.registry();
            reg.entries
                .iter()
                .filter(|e| !e.blocking && !e.session.is_dead())
                .min_by_key(|e| e.inflight)
                .map(|e| e.session.clone())
        };
        match existing {
            Some(session) => self.call(&session, cmd, self.config.command_timeout).await,
            None => {
                // A short-lived extra connection, outside the registry.
                let session = self.open().await?;
                let reply = self.call(&session, cmd, self.config.command_timeout).await;
                if let Some(conn) = session.conn.lock().await.take() {
                    let _ = timeout(self.config.command_timeout, conn.close()).await;
                }
                reply
            }
        }
    }

    /// Number of open connections, for tests and diagnostics.
    pub(crate) fn connection_count(&self) -> usize {
        self.registry().total()
    }

    /// Server ids of the connections holding `key`.
    pub(crate) fn holder_of(&self, key: &str) -> Option<u64> {
        let reg = self.registry();
        reg.entries
            .iter()
            .find(|e| matches!(e.keys.get(key), Some(Some(_))))
            .map(|e| e.session.server_id)
    }

    fn sessions(&self) -> Vec<Arc<Session>> {
        self.registry()
            .entries
            .iter()
            .filter(|e| !e.blocking)
            .map(|e| e.session.clone())
            .collect()
    }
}

/// Pings every idle or lock-holding connection each `keepalive`, so a killed or broken session is
/// noticed (and its guards' `lost` fired) within `keepalive + command_timeout`, and the server's
/// `wait_timeout` never drops a live session.
fn spawn_keepalive(inner: &Arc<Inner>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("mysql: no tokio runtime: sessions will not be kept alive");
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let every = inner.config.keepalive;
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(inner) = weak.upgrade() else { return };
            for session in inner.sessions() {
                let inner = inner.clone();
                tokio::spawn(async move {
                    // A busy connection is being used, which checks it; skip it this round.
                    let Ok(mut conn) = session.conn.try_lock() else {
                        return;
                    };
                    let limit = inner.config.command_timeout;
                    let _ = inner
                        .exec_locked(&session, &mut conn, &Cmd::Ping, limit)
                        .await;
                });
            }
        }
    });
}
