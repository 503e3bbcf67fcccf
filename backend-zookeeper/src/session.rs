//! `ZkSession`: one ZooKeeper session, shared by every guard of a client, with dlock's own
//! heartbeat.
//!
//! The client library keeps the session's connection alive but tells little: it exposes no
//! heartbeat times, reports `Disconnected` only after 2/5 of the session timeout without data,
//! and declares the session expired itself only at 7/5 of it, long after the server may have
//! expired it. So this module keeps its own account:
//!
//! - every third of the negotiated timeout it sends an `exists` on the prefix node, under a
//!   timeout, and dates the session's validity from each acknowledged **send**:
//!   `sent + negotiated timeout - margin`. The server counts the session timeout from the last
//!   packet it *received*, which is after the send, so this deadline is never later than the
//!   server's;
//! - a heartbeat that is late or fails, or the library reporting `Disconnected`, **suspends** the
//!   [`Session`] (every guard reports `Suspended` until that deadline);
//! - an acknowledged heartbeat after a suspension **resumes** it, but only once every held node
//!   has been read back and found to exist, with this session as its ephemeral owner and the
//!   czxid it was granted with; a node that fails the check loses its guard;
//! - the deadline passing, or the library reporting the session expired or closed, **ends** the
//!   session: every guard is lost with [`LostReason::SessionExpired`] (or `SessionClosed`), and
//!   the client is dropped. If its connection comes back before the server expired it, the
//!   library then closes the session, which deletes every node of it: a guard reported lost
//!   never keeps its node.
//!
//! The library never opens a new session after an expiry, so the lock builds a new
//! `ZkSession` for later acquires.
//!
//! The library's connection, like the heartbeat and each held node's watch, is a task of the
//! runtime the client attached on; a client kept longer (in a `static`) finds them gone with
//! that runtime. It then attaches to the same session again from the runtime that calls (see
//! [`reattach`]), so that the session's nodes, and the guards held on them, live on.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, RuntimeLife, Session, SessionStatus};
use dlock_api::{LockError, LostReason, Result};
use tokio::time::{Instant, sleep_until};
use zookeeper_client::{Client, SessionState, StateWatcher};

use crate::config::ZkConfig;
use crate::error::{Fail, timed};
use crate::{BACKEND, connect};

mod reattach;

/// The margin taken off the session timeout for the two clocks' rates: 1 % and 10 ms.
fn margin(timeout: Duration) -> Duration {
    timeout
        .checked_div(100)
        .unwrap_or_default()
        .saturating_add(Duration::from_millis(10))
}

fn ended() -> LockError {
    LockError::unavailable_because(BACKEND, "the zookeeper session has ended")
}

/// One held node, for the check after a reconnect and the watch on it.
#[derive(Debug)]
struct Held {
    path: String,
    czxid: i64,
    state: Weak<LeaseState>,
    /// The runtime its watch was started on, once it was.
    watched_on: Option<RuntimeLife>,
}

/// The library's client of the session, and the runtime its tasks run on.
#[derive(Debug)]
struct Attached {
    client: Client,
    life: Option<RuntimeLife>,
}

impl Attached {
    fn new(client: Client) -> Self {
        Self {
            client,
            life: RuntimeLife::current(),
        }
    }

    /// Whether its runtime stopped: requests sent through it are never read.
    fn is_stale(&self) -> bool {
        self.life.as_ref().is_some_and(RuntimeLife::has_stopped)
    }
}

/// A ZooKeeper session and the [`Session`] its guards share.
#[derive(Debug)]
pub(crate) struct ZkSession {
    /// The session id (the ephemeral owner of every node it creates).
    pub(crate) id: i64,
    /// The client; `None` once the session ended (dropping it closes the session).
    attached: Mutex<Option<Attached>>,
    /// One attach again at a time.
    reattaching: tokio::sync::Mutex<()>,
    /// To attach again with the same hosts, credentials and TLS.
    config: ZkConfig,
    me: Weak<ZkSession>,
    pub(crate) session: Arc<Session>,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    /// Bound on each request.
    pub(crate) command_timeout: Duration,
    valid_until: Mutex<Instant>,
    held: Mutex<Vec<Held>>,
    /// The markers of this session's acquires in progress (queued, not yet a guard's): their
    /// nodes are not left over, whatever an attach again finds.
    queued: Arc<Mutex<Vec<String>>>,
    /// The node the heartbeat asks about (the prefix).
    beat_path: String,
    /// Starts the watch on each held node a moment after its grant.
    pub(crate) timer: dlock_api::raw::GuardTimer,
}

impl ZkSession {
    /// Opens a session (within the connect timeout) and starts its heartbeat.
    pub(crate) async fn open(config: &ZkConfig) -> Result<Arc<Self>> {
        let sent = Instant::now();
        let client = connect::client(config).await?;
        let timeout = client.session_timeout();
        let session = Arc::new_cyclic(|me| Self {
            id: client.session_id().0,
            session: Arc::new(Session::new()),
            timeout,
            command_timeout: config.command_timeout,
            valid_until: Mutex::new(after(sent, timeout.saturating_sub(margin(timeout)))),
            held: Mutex::new(Vec::new()),
            queued: Arc::default(),
            beat_path: config.prefix.clone(),
            attached: Mutex::new(Some(Attached::new(client.clone()))),
            reattaching: tokio::sync::Mutex::new(()),
            config: config.clone(),
            me: me.clone(),
            timer: dlock_api::raw::GuardTimer::new(),
        });
        tracing::debug!(
            session = format_args!("{:#x}", session.id),
            ?timeout,
            "zookeeper session opened"
        );
        tokio::spawn(heartbeat(Arc::downgrade(&session), client.state_watcher()));
        Ok(session)
    }

    /// The client, while the session lasts; attached again first if its runtime stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: an attach, once begun, finishes in the background.
    pub(crate) async fn client(&self) -> Result<Client> {
        match self.live_client() {
            Ok(Some(client)) => Ok(client),
            Ok(None) => self.reattach().await,
            Err(error) => Err(error),
        }
    }

    /// The client if its runtime still runs, `None` if it stopped; `Err` once the session ended.
    fn live_client(&self) -> Result<Option<Client>> {
        match &*self.attached.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(attached) if attached.is_stale() => Ok(None),
            Some(attached) => Ok(Some(attached.client.clone())),
            None => Err(ended()),
        }
    }

    /// A request failed with `fail`: if it found the library's task gone (its runtime ended
    /// while the request was in flight), waits, up to a second, for that runtime to be marked
    /// stopped, so that the next [`client`](Self::client) attaches again from the runtime that
    /// calls. The task goes before the mark when the runtime drops its tasks. Nothing here
    /// marks the client stale itself: the request may have gone through a client already
    /// replaced, and dropping the live one would close the session.
    pub(crate) async fn note(&self, fail: &Fail) {
        if !fail.task_gone() {
            return;
        }
        let life = match &*self.attached.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(attached) if !attached.is_stale() => attached.life.clone(),
            _ => None,
        };
        let Some(life) = life else {
            return;
        };
        let (stopped, marked) = tokio::sync::oneshot::channel();
        life.on_stop(move || {
            let _ = stopped.send(());
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), marked).await;
    }

    /// Marks the acquire whose nodes carry `marker` as in progress until the returned value is
    /// dropped: keep it until the node is a guard's or deleted.
    pub(crate) fn queue(&self, marker: &str) -> Queued {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        queued.push(marker.to_owned());
        Queued {
            queued: self.queued.clone(),
            marker: marker.to_owned(),
        }
    }

    /// Whether `child` (a node's name) is the node of an acquire in progress.
    fn is_queued(&self, child: &str) -> bool {
        let queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        queued
            .iter()
            .any(|marker| child.starts_with(marker.as_str()))
    }

    /// The runtime whose tasks carry the client now (its connection and its watches' events).
    pub(crate) fn client_life(&self) -> Option<RuntimeLife> {
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|attached| attached.life.clone())
    }

    /// Whether new acquires may use this session as it is.
    pub(crate) fn is_usable(&self) -> bool {
        !matches!(self.session.status(), SessionStatus::Ended(_))
            && self
                .attached
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|attached| !attached.is_stale())
    }

    /// Whether the session is over for good (not merely left behind by a stopped runtime).
    pub(crate) fn has_ended(&self) -> bool {
        matches!(self.session.status(), SessionStatus::Ended(_))
            || self
                .attached
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
    }

    /// The instant the session ends unless a heartbeat is acknowledged first.
    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A guard's state for the node `path` granted with `czxid`: its validity follows the
    /// session's, its fate the session's and the node's.
    pub(crate) fn new_guard_state(&self, path: &str, czxid: i64) -> Arc<LeaseState> {
        let state = Arc::new(LeaseState::on_session(
            Some(self.valid_until()),
            self.session.clone(),
        ));
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|h| h.state.strong_count() > 0);
        held.push(Held {
            path: path.to_owned(),
            czxid,
            state: Arc::downgrade(&state),
            watched_on: None,
        });
        state
    }

    /// Whether the watch on the held node `path` should start now: only if no watch of it runs
    /// on a runtime that still does (the timer's start and an attach again may both ask).
    pub(crate) fn claim_watch(&self, path: &str) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let Some(node) = held.iter_mut().find(|h| h.path == path) else {
            return false;
        };
        if node
            .watched_on
            .as_ref()
            .is_some_and(|life| !life.has_stopped())
        {
            return false;
        }
        node.watched_on = RuntimeLife::current();
        true
    }

    /// The node `path` is no longer held (released or dropped).
    pub(crate) fn forget(&self, path: &str) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|h| h.path != path && h.state.strong_count() > 0);
    }

    /// A request sent at `sent` was answered: the server had the session then, so it lasts
    /// until `sent + timeout` on the server, and until `sent + timeout - margin` here.
    pub(crate) fn acked(&self, sent: Instant) {
        let until = after(sent, self.timeout.saturating_sub(margin(self.timeout)));
        {
            let mut valid = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
            if until <= *valid {
                return;
            }
            *valid = until;
        }
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for state in held.iter().filter_map(|h| h.state.upgrade()) {
            if !state.is_closed() {
                state.set_valid_until(Some(until));
            }
        }
    }

    fn suspend(&self) {
        if matches!(self.session.status(), SessionStatus::Active) {
            tracing::debug!(
                session = format_args!("{:#x}", self.id),
                "zookeeper heartbeat late or disconnected; guards suspended"
            );
        }
        self.session.suspend(self.valid_until());
    }

    /// Ends the session: every guard on it is lost with `reason`, and the client is dropped
    /// (the library closes the session when its last clone goes, as soon as it can reach a
    /// server: the nodes of guards reported lost go with it).
    pub(crate) fn end(&self, reason: LostReason) {
        if self.session.end(reason) {
            tracing::debug!(session = format_args!("{:#x}", self.id), %reason, "zookeeper session ended");
        }
        self.attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// Ends the session as [`end`](Self::end) does, and waits (up to `bound`) for the server
    /// to confirm it closed: for `close`, which wants its nodes gone when it returns.
    pub(crate) async fn close(&self, bound: Duration) {
        self.session.end(LostReason::ClientClosed);
        let attached = self
            .attached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(attached) = attached {
            crate::connect::close(attached.client, bound).await;
        }
    }

    /// After a suspension: reads every held node back. A node that is gone, or is not this
    /// session's, or is another node under the same path, loses its guard. `Ok` once every node
    /// was read.
    async fn verify_held(&self, client: &Client, bound: Duration) -> std::result::Result<(), Fail> {
        let held: Vec<(String, i64, Arc<LeaseState>)> = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|h| {
                h.state
                    .upgrade()
                    .filter(|s| !s.is_closed())
                    .map(|s| (h.path.clone(), h.czxid, s))
            })
            .collect();
        // Every request is sent at once (the library sends at call time), then awaited.
        let reads: Vec<_> = held
            .iter()
            .map(|(path, _, _)| client.check_stat(path))
            .collect();
        let answers = tokio::time::timeout(bound, futures::future::join_all(reads))
            .await
            .map_err(|_| Fail::TimedOut(bound))?;
        let stats = answers
            .into_iter()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(Fail::Zk)?;
        for ((path, czxid, state), stat) in held.iter().zip(stats) {
            let ours = stat.is_some_and(|s| s.ephemeral_owner == self.id && s.czxid == *czxid);
            if !ours {
                tracing::warn!(node = %path, "a held zookeeper node is gone after a reconnect; its guard is lost");
                state.mark_lost(LostReason::TakenOver);
                self.forget(path);
            }
        }
        Ok(())
    }
}

/// An acquire in progress on a session (see [`ZkSession::queue`]).
#[derive(Debug)]
pub(crate) struct Queued {
    queued: Arc<Mutex<Vec<String>>>,
    marker: String,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = queued.iter().position(|m| *m == self.marker) {
            queued.swap_remove(at);
        }
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        // Nothing holds the session any more: it ends, and the client closes it on the server.
        self.session.end(LostReason::SessionClosed);
        // A client whose runtime stopped closes nothing: a new one on the session does, so its
        // nodes (a release dropped with that runtime) go now rather than at its expiry.
        let attached = self.attached.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(attached) = attached.take().filter(Attached::is_stale) {
            let (config, info) = (self.config.clone(), attached.client.session().clone());
            dlock_api::raw::spawn_cleanup(async move {
                connect::close_session(&config, info).await;
            });
        }
    }
}

/// What woke the heartbeat.
enum Wake {
    Beat,
    State(SessionState),
    Ended(LostReason),
}

/// Keeps account of the session until it ends or nothing holds it any more.
async fn heartbeat(weak: Weak<ZkSession>, mut states: StateWatcher) {
    let Some((every, bound)) = weak.upgrade().map(|s| {
        let every = s
            .timeout
            .checked_div(3)
            .unwrap_or_default()
            .max(Duration::from_millis(50));
        (every, every.min(s.command_timeout))
    }) else {
        return;
    };
    let mut next = after(Instant::now(), every);
    loop {
        let Some(raw) = weak.upgrade().map(|s| s.session.clone()) else {
            return;
        };
        let wake = tokio::select! {
            () = sleep_until(next) => Wake::Beat,
            state = states.changed() => Wake::State(state),
            reason = raw.ended() => Wake::Ended(reason),
        };
        drop(raw);
        let Some(session) = weak.upgrade() else {
            return;
        };
        match wake {
            Wake::Ended(reason) => {
                session.end(reason);
                return;
            }
            Wake::State(SessionState::Disconnected) => {
                session.suspend();
                continue;
            }
            Wake::State(SessionState::SyncConnected | SessionState::ConnectedReadOnly) => {
                // Back: beat now, which resumes the session once its nodes check out.
            }
            Wake::State(SessionState::Expired) => {
                session.end(LostReason::SessionExpired);
                return;
            }
            Wake::State(_) => {
                session.end(LostReason::SessionClosed);
                return;
            }
            Wake::Beat => {}
        }
        // Never an attach again from here: the heartbeat runs on its client's runtime, and a
        // client attached again on another runtime comes with a heartbeat of its own.
        let Ok(Some(client)) = session.live_client() else {
            return;
        };
        let sent = Instant::now();
        match timed(bound, client.check_stat(&session.beat_path)).await {
            Ok(_) => {
                session.acked(sent);
                next = after(sent, every);
                if matches!(session.session.status(), SessionStatus::Suspended { .. }) {
                    match session.verify_held(&client, bound).await {
                        Ok(()) => {
                            tracing::debug!(
                                session = format_args!("{:#x}", session.id),
                                "zookeeper session back; guards resumed"
                            );
                            session.session.resume();
                        }
                        Err(_) => next = after(Instant::now(), soon_again(every)),
                    }
                }
            }
            Err(fail) if fail.session_over() => {
                let reason = if fail.is(&zookeeper_client::Error::SessionExpired) {
                    LostReason::SessionExpired
                } else {
                    LostReason::SessionClosed
                };
                session.end(reason);
                return;
            }
            Err(_) => {
                session.suspend();
                next = after(Instant::now(), soon_again(every));
            }
        }
    }
}

/// How soon a heartbeat that failed is sent again: a third of its interval, at least 50 ms.
fn soon_again(every: Duration) -> Duration {
    every
        .checked_div(3)
        .unwrap_or_default()
        .max(Duration::from_millis(50))
}
