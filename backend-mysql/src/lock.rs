//! `MySqlLock`: `GET_LOCK` on session connections, fencing in the same statement, blocking waits on
//! a dedicated connection.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{Detach, Grant, LeaseState, PendingAcquire, RawLock, RenewedBy, WaitRecovery};
use dlock_api::{Capabilities, Fencing, FencingToken, LeaseKind, LockName, LockOptions, Result};
use tokio::sync::Notify;
use tokio::time::{Instant, timeout, timeout_at};

use crate::BACKEND;
use crate::config::MySqlConfig;
use crate::error::unavailable;
use crate::lease::MySqlLease;
use crate::session::{Inner, MAX_KEY_CHARS, Session, TryCheckout};
use crate::sql::{Cmd, Reply};

/// The longest a single blocking `GET_LOCK` waits on the server; longer waits are issued again, so
/// a silently dead connection is noticed within this plus the command timeout.
const WAIT_CHUNK: Duration = Duration::from_secs(30);

/// How long after its wait timeout a blocking acquire still waits for the server's own answer
/// before it gives up on the client side (and interrupts the wait).
const WAIT_SLACK: Duration = Duration::from_millis(250);

/// Locks on MySQL or MariaDB named locks (`GET_LOCK` / `RELEASE_LOCK`).
///
/// Each `MySqlLock` is one client: a small set of connections (at most `max_connections`) that
/// hold its locks. Clone it (cheap) to share; call [`MySqlLock::connect`] again for an independent
/// client. A lock is released on the connection that took it; a connection is reused only when it
/// holds nothing; dropping the last clone closes the connections, which frees their locks.
#[doc = include_str!("docs.md")]
#[derive(Clone)]
pub struct MySqlLock {
    inner: Arc<Inner>,
}

impl MySqlLock {
    /// Creates a client for the server `config` describes and checks that it answers.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for inconsistent options; [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server
    /// does not answer within the connect timeout; [`LockError::Backend`](dlock_api::LockError::Backend) if it refuses the login.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it leaves nothing behind.
    pub async fn connect(config: MySqlConfig) -> Result<Self> {
        config.check()?;
        let lock = Self {
            inner: Inner::new(config),
        };
        // Open the first connection now, so a wrong address or password fails here.
        lock.inner.add_idle().await?;
        Ok(lock)
    }

    /// Parses `url` ([`MySqlConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL (before any network call), else as
    /// [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(MySqlConfig::from_url(url)?).await
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &MySqlConfig {
        &self.inner.config
    }

    /// The `GET_LOCK` key of `name`: the configured prefix, then the name itself when it is at
    /// most 64 characters of printable ASCII without upper-case letters or `~`, else
    /// `<readable prefix>~<160-bit digest>` (see [`dlock_api::KeyMapper`]). It is also the
    /// fencing table's row key.
    pub fn key(&self, name: &LockName) -> String {
        self.inner.key(name).to_string()
    }

    /// The server connection id (`CONNECTION_ID()`) holding `name` for this client, if it does:
    /// for operators and fault tests (`KILL <id>`).
    pub fn holder_connection_id(&self, name: &LockName) -> Option<u64> {
        self.inner.holder_of(&self.inner.key(name))
    }

    /// How many server connections this client has open (sessions, waiters and idle ones).
    pub fn connection_count(&self) -> usize {
        self.inner.connection_count()
    }

    /// Creates the fencing table if it does not exist (what the first acquire does when
    /// `create_table` is on).
    ///
    /// # Errors
    /// [`LockError::Backend`](dlock_api::LockError::Backend) if the server refuses (no `CREATE` privilege);
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if it cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the statement runs to completion in the background.
    pub async fn migrate(&self) -> Result<()> {
        self.inner.control(Cmd::CreateTable).await.map(|_| ())
    }

    /// One non-blocking attempt: `Ok(None)` when busy.
    async fn try_once(&self, name: &LockName) -> Result<Option<Grant>> {
        let key = self.inner.key(name);
        // A connection reused from the idle set may have died unnoticed (server restart): a
        // connection error there is retried once on another connection. Retrying is safe because
        // a lock taken on a connection that then broke dies with that connection.
        for attempt in 0..2 {
            let (session, fresh) = match self.inner.checkout_for_try(&key).await? {
                TryCheckout::HeldHere => return Ok(None),
                TryCheckout::Session { session, fresh } => (session, fresh),
            };
            let result = Detach::new(try_on_session(
                self.inner.clone(),
                session.clone(),
                name.clone(),
                key.clone(),
            ))
            .await;
            match result {
                Err(error) if attempt == 0 && !fresh && session.is_dead() => {
                    tracing::debug!(%error, "mysql: a pooled connection was dead; retrying on another");
                }
                result => return result,
            }
        }
        Err(unavailable("no live connection after a retry"))
    }
}

/// A non-blocking acquire of `key` on `session` (where it is reserved). Runs in its own task: it
/// always finishes, and if the caller is gone the returned guard's drop releases the lock.
async fn try_on_session(
    inner: Arc<Inner>,
    session: Arc<Session>,
    name: LockName,
    key: Arc<str>,
) -> Result<Option<Grant>> {
    let cmd = Cmd::Acquire {
        key: key.clone(),
        wait: Duration::ZERO,
        create_table: inner.config.create_table,
    };
    let limit = inner.config.command_timeout;
    let mut conn = session.conn.lock().await;
    let reply = inner.exec_locked(&session, &mut conn, &cmd, limit).await;
    match reply {
        Ok(Reply::Acquired(Some(token))) => {
            drop(conn);
            let state = Arc::new(LeaseState::on_session(None, session.guards.clone()));
            if !inner.finish_try(&session, &key, Some(state.clone())) {
                return Err(unavailable("the connection closed right after the grant"));
            }
            Ok(Some(guard(&inner, session, name, key, state, token)))
        }
        Ok(_) => {
            drop(conn);
            inner.finish_try(&session, &key, None);
            Ok(None)
        }
        Err(error) => {
            // The statement failed after `GET_LOCK` may have run (a row-lock timeout on the
            // counter, say): undo it. Safe, because this connection did not hold the key before.
            undo(&inner, &session, &key, &mut conn).await;
            drop(conn);
            inner.finish_try(&session, &key, None);
            Err(error)
        }
    }
}

fn guard(
    inner: &Arc<Inner>,
    session: Arc<Session>,
    name: LockName,
    key: Arc<str>,
    state: Arc<LeaseState>,
    token: u64,
) -> Grant {
    let lease = Arc::new(MySqlLease::new(
        inner.clone(),
        session,
        name.clone(),
        key,
        state.clone(),
    ));
    // The connection is the lease: it lives while the session does, nothing to renew.
    Grant::new(
        name,
        FencingToken::new(token),
        lease,
        state,
        RenewedBy::Session,
    )
}

/// The cancel protocol of one blocking `GET_LOCK`.
///
/// The caller's `PendingAcquire` calls [`Attempt::cancel`] when the acquire future is dropped (or
/// gives up at its wait timeout). If the statement is running, a canceller interrupts it with
/// `KILL QUERY` from another connection, repeating until the statement is over; the attempt's
/// task waits for the canceller to finish before it sends anything else on the connection, so a
/// late `KILL QUERY` can never hit a later statement (such as the `RELEASE_LOCK` that undoes a
/// grant that raced the cancel).
#[derive(Default)]
struct Attempt {
    phase: Mutex<Phase>,
    statement_done: Notify,
    kill_done: Notify,
}

#[derive(Default)]
struct Phase {
    running: bool,
    done: bool,
    cancelled: bool,
    killing: bool,
    kill_finished: bool,
}

impl Attempt {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the statement as started; false if cancelled before.
    fn start(&self) -> bool {
        let mut phase = self.phase();
        phase.running = !phase.cancelled;
        phase.running
    }

    /// Marks the statement as over; returns (cancelled, a canceller is killing).
    fn finish(&self) -> (bool, bool) {
        let mut phase = self.phase();
        phase.running = false;
        phase.done = true;
        let result = (phase.cancelled, phase.killing && !phase.kill_finished);
        drop(phase);
        self.statement_done.notify_waiters();
        result
    }

    fn cancelled(&self) -> bool {
        self.phase().cancelled
    }

    fn cancel(self: &Arc<Self>, inner: &Arc<Inner>, server_id: u64) {
        let mut phase = self.phase();
        phase.cancelled = true;
        if !phase.running {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        phase.killing = true;
        drop(phase);
        let (attempt, inner) = (self.clone(), inner.clone());
        runtime.spawn(async move {
            for round in 1..=10u32 {
                let done = attempt.statement_done.notified();
                tokio::pin!(done);
                done.as_mut().enable();
                if attempt.phase().done {
                    break;
                }
                if let Err(error) = inner.control(Cmd::KillQuery(server_id)).await {
                    tracing::debug!(%error, "mysql: KILL QUERY of a cancelled wait failed");
                }
                let _ = timeout(Duration::from_millis(20) * round, done).await;
            }
            attempt.phase().kill_finished = true;
            attempt.kill_done.notify_waiters();
        });
    }

    /// Waits (bounded) until the canceller stopped sending `KILL QUERY`; false if it did not.
    async fn wait_kill_finished(&self, bound: Duration) -> bool {
        let finished = self.kill_done.notified();
        tokio::pin!(finished);
        finished.as_mut().enable();
        if self.phase().kill_finished {
            return true;
        }
        timeout(bound, finished).await.is_ok()
    }
}

/// A blocking `GET_LOCK(key, wait)` on a dedicated `session`, in its own task.
async fn wait_on_session(
    inner: Arc<Inner>,
    session: Arc<Session>,
    name: LockName,
    key: Arc<str>,
    wait: Duration,
    attempt: Arc<Attempt>,
) -> Result<Option<Grant>> {
    let command_timeout = inner.config.command_timeout;
    let mut conn = session.conn.lock().await;
    if !attempt.start() {
        drop(conn);
        inner.finish_dedicated(&session, None);
        return Ok(None);
    }
    let cmd = Cmd::Acquire {
        key: key.clone(),
        wait,
        create_table: inner.config.create_table,
    };
    let reply = inner
        .exec_locked(
            &session,
            &mut conn,
            &cmd,
            wait.saturating_add(command_timeout),
        )
        .await;
    let (cancelled, killing) = attempt.finish();
    if killing
        && !attempt
            .wait_kill_finished(command_timeout.saturating_mul(3))
            .await
    {
        // A `KILL QUERY` may still arrive: this connection cannot be trusted with another
        // statement. Closing it frees whatever it holds.
        *conn = None;
        inner.session_died(&session, "a cancelled wait could not be interrupted");
    }
    match reply {
        Ok(Reply::Acquired(Some(token))) if !cancelled && !session.is_dead() => {
            drop(conn);
            let state = Arc::new(LeaseState::on_session(None, session.guards.clone()));
            if !inner.finish_dedicated(&session, Some((key.clone(), state.clone()))) {
                return Err(unavailable("the connection closed right after the grant"));
            }
            Ok(Some(guard(&inner, session, name, key, state, token)))
        }
        Ok(Reply::Acquired(Some(_))) => {
            // Granted, but nobody wants it any more.
            undo(&inner, &session, &key, &mut conn).await;
            drop(conn);
            inner.finish_dedicated(&session, None);
            Ok(None)
        }
        Ok(_) => {
            drop(conn);
            inner.finish_dedicated(&session, None);
            Ok(None)
        }
        Err(error) => {
            // `GET_LOCK` may have been granted before the statement failed: undo it (safe: this
            // connection held nothing).
            undo(&inner, &session, &key, &mut conn).await;
            drop(conn);
            inner.finish_dedicated(&session, None);
            Err(error)
        }
    }
}

/// `RELEASE_LOCK(key)` on a connection that held nothing before this attempt, undoing a grant
/// nobody will use; if that fails, the connection is closed (which frees the lock).
async fn undo(
    inner: &Inner,
    session: &Session,
    key: &Arc<str>,
    conn: &mut Option<sqlx::mysql::MySqlConnection>,
) {
    if session.is_dead() {
        return;
    }
    let cmd = Cmd::Release { key: key.clone() };
    let limit = inner.config.command_timeout;
    if inner.exec_locked(session, conn, &cmd, limit).await.is_err() {
        *conn = None;
        inner.session_died(session, "could not undo an unwanted grant");
    }
}

dlock_api::impl_distributed_lock!(MySqlLock);

#[async_trait]
impl RawLock for MySqlLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: if self.inner.config.fencing {
                Fencing::Strict
            } else {
                Fencing::None
            },
            lease: LeaseKind::Session,
            extend: false,
            fifo: false,
            wake_on_release: true,
            lost_signal: true,
            survives_failover: false,
            reentrant: false,
            max_name_bytes: Some(MAX_KEY_CHARS - self.inner.config.prefix.len()),
            max_ttl: None,
        }
    }

    async fn try_grant(&self, name: &LockName, _options: &LockOptions) -> Result<Option<Grant>> {
        self.try_once(name).await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        // Uncontended: one statement on a shared session.
        if let Some(grant) = self.try_once(name).await? {
            return Ok(Some(grant));
        }
        // Contended: this client's waiters for the name queue here, and one at a time waits on
        // the server (each server-side wait takes a connection).
        let Some(_turn) = self.inner.waiters.turn(name, deadline).await else {
            return Ok(None);
        };
        let key = self.inner.key(name);
        // A wait whose connection is killed waits again on a new one (only a server that stays
        // unreachable for the connect timeout ends it).
        let mut recovery = WaitRecovery::new(self.inner.config.connect_timeout);
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let session = match self.inner.checkout_dedicated(deadline).await {
                Ok(Some(session)) => session,
                Ok(None) => return Ok(None),
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                    continue;
                }
            };
            let wait = deadline
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(WAIT_CHUNK)
                .min(WAIT_CHUNK);
            let attempt = Arc::new(Attempt::default());
            let pending = {
                let (attempt, inner, id) =
                    (attempt.clone(), self.inner.clone(), session.server_id());
                PendingAcquire::arm(move || attempt.cancel(&inner, id))
            };
            let task = Detach::new(wait_on_session(
                self.inner.clone(),
                session,
                name.clone(),
                key.clone(),
                wait,
                attempt.clone(),
            ));
            let result = match deadline {
                // MariaDB ends the wait on time; other servers may round to seconds. Either way
                // the client gives up shortly after the deadline and interrupts the server's wait.
                Some(deadline) => match timeout_at(after(deadline, WAIT_SLACK), task).await {
                    Ok(result) => result,
                    Err(_) => {
                        drop(pending);
                        return Ok(None);
                    }
                },
                None => task.await,
            };
            match result {
                Ok(Some(grant)) => {
                    pending.disarm();
                    return Ok(Some(grant));
                }
                Ok(None) if attempt.cancelled() => {
                    pending.disarm();
                    return Ok(None);
                }
                Ok(None) => {
                    pending.disarm();
                    recovery.reached_server();
                }
                Err(error) => {
                    pending.disarm();
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                }
            }
        }
    }
}

impl fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql({})", self.inner.config)
    }
}
