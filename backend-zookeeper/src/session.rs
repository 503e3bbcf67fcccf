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

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, Session, SessionStatus};
use dlock_api::{LockError, LostReason, Result};
use tokio::time::{Instant, sleep_until};
use zookeeper_client::{Client, SessionState, StateWatcher};

use crate::config::ZkConfig;
use crate::error::{Fail, timed};
use crate::{BACKEND, connect};

/// The margin taken off the session timeout for the two clocks' rates: 1 % and 10 ms.
fn margin(timeout: Duration) -> Duration {
    timeout / 100 + Duration::from_millis(10)
}

/// One held node, for the check after a reconnect.
#[derive(Debug)]
struct Held {
    path: String,
    czxid: i64,
    state: Weak<LeaseState>,
}

/// A ZooKeeper session and the [`Session`] its guards share.
#[derive(Debug)]
pub(crate) struct ZkSession {
    /// The session id (the ephemeral owner of every node it creates).
    pub(crate) id: i64,
    /// The client; `None` once the session ended (dropping it closes the session).
    client: Mutex<Option<Client>>,
    pub(crate) session: Arc<Session>,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    /// Bound on each request.
    pub(crate) command_timeout: Duration,
    valid_until: Mutex<Instant>,
    held: Mutex<Vec<Held>>,
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
        let session = Arc::new(Self {
            id: client.session_id().0,
            session: Arc::new(Session::new()),
            timeout,
            command_timeout: config.command_timeout,
            valid_until: Mutex::new(after(sent, timeout.saturating_sub(margin(timeout)))),
            held: Mutex::new(Vec::new()),
            beat_path: config.prefix.clone(),
            client: Mutex::new(Some(client.clone())),
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

    /// The client, while the session lasts.
    pub(crate) fn client(&self) -> Result<Client> {
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                LockError::unavailable_because(BACKEND, "the zookeeper session has ended")
            })
    }

    /// Whether new acquires may use this session.
    pub(crate) fn is_usable(&self) -> bool {
        !matches!(self.session.status(), SessionStatus::Ended(_))
            && self
                .client
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
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
        });
        state
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
        self.client.lock().unwrap_or_else(|e| e.into_inner()).take();
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

impl Drop for ZkSession {
    fn drop(&mut self) {
        // Nothing holds the session any more: it ends, and the client closes it on the server.
        self.session.end(LostReason::SessionClosed);
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
        let every = (s.timeout / 3).max(Duration::from_millis(50));
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
        let Ok(client) = session.client() else {
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
                        Err(_) => {
                            next = after(Instant::now(), (every / 3).max(Duration::from_millis(50)))
                        }
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
                next = after(Instant::now(), (every / 3).max(Duration::from_millis(50)));
            }
        }
    }
}
