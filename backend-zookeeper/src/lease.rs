//! `ZkLease`: one held node. Release deletes it, guarded by its version; a dropped guard's node
//! is deleted in the background. A watch on the node, set [`WATCH_HELD_AFTER`] after the grant,
//! loses the guard as soon as anyone else deletes it.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{Detach, LeaseState, RawLease, Scheduled, Session, SessionStatus};
use dlock_api::{FencingToken, LockError, LockName, LostReason, Result};
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, EventType};

use crate::BACKEND;
use crate::error::{Fail, timed};
use crate::session::ZkSession;

/// Deletes the node `path` if it still has `version` (ours: nobody else writes to it).
/// `Ok(true)`: deleted; `Ok(false)`: it was not there any more, or the session is over (its
/// ephemeral nodes go with it). A delete whose answer is lost is sent again; `NoNode` then
/// means the first one landed.
pub(crate) async fn delete_node(session: &ZkSession, path: &str, version: i32) -> Result<bool> {
    let mut resent = false;
    for attempt in 0..3 {
        // Asked each time: a send that found the client's task gone attaches again.
        let client = match session.client().await {
            Ok(client) => client,
            Err(_) if session.has_ended() => return Ok(false),
            Err(error) => return Err(error),
        };
        let deleted = timed(session.command_timeout, client.delete(path, Some(version))).await;
        if let Err(fail) = &deleted {
            session.note(fail).await;
        }
        match deleted {
            Ok(()) => return Ok(true),
            Err(Fail::Zk(ZkError::NoNode)) => return Ok(resent),
            Err(Fail::Zk(ZkError::BadVersion)) => return Ok(false),
            Err(fail) if fail.session_over() => return Ok(false),
            Err(fail) if fail.outcome_unknown() && attempt < 2 => resent = true,
            Err(fail) => return Err(fail.into()),
        }
    }
    Err(LockError::command_timeout(BACKEND, session.command_timeout))
}

/// How long after its grant a held node gets its watch. A lock released sooner (most are) costs
/// no `exists` round trip and no task; a node deleted by someone else before then is found gone
/// by the first look, so its guard is lost at most this much later than with a watch from the
/// start.
pub(crate) const WATCH_HELD_AFTER: Duration = Duration::from_millis(250);

/// A held node.
#[derive(Debug)]
pub(crate) struct ZkLease {
    session: Arc<ZkSession>,
    name: LockName,
    path: String,
    czxid: i64,
    /// The node's version: 0 when created, one more with each proclaim. Release deletes the
    /// node guarded by it.
    version: Arc<AtomicI32>,
    /// One write to the node at a time (a proclaim, the release), so each is sent with the
    /// version the one before left; a proclaim whose caller went away finishes first.
    writing: Arc<tokio::sync::Mutex<()>>,
    /// Closed before our own delete is sent, so the node's watch never takes our delete for
    /// someone else's (a grant dropped on its way is released without a guard to close it).
    state: Arc<LeaseState>,
    released: AtomicBool,
    /// The campaign value the node was created with, until the first proclaim, which then
    /// need not write it (`election.rs`, *Record*).
    created_leading_with: dlock_api::raw::RecordAtGrant,
    /// The watch's start, until it comes due (dropped with the lease).
    _watch: Option<Scheduled>,
}

impl ZkLease {
    /// The lease of a node just granted; starts the watch on it.
    pub(crate) fn start(
        session: Arc<ZkSession>,
        name: &LockName,
        node: crate::enqueue::Node,
        state: Arc<LeaseState>,
    ) -> Self {
        let crate::enqueue::Node {
            path,
            czxid,
            version,
            leads_with,
        } = node;
        let created_leading_with = dlock_api::raw::RecordAtGrant::default();
        if let Some(value) = leads_with {
            created_leading_with.wrote(czxid.unsigned_abs(), value);
        }
        let watch = {
            let (weak, raw, state, path) = (
                Arc::downgrade(&session),
                session.session.clone(),
                state.clone(),
                path.clone(),
            );
            move || start_watch(&weak, &raw, &state, &path, czxid)
        };
        let scheduled = session
            .timer
            .schedule(after(Instant::now(), WATCH_HELD_AFTER), watch);
        Self {
            session,
            name: name.clone(),
            path,
            czxid,
            version: Arc::new(AtomicI32::new(version)),
            writing: Arc::default(),
            state,
            released: AtomicBool::new(false),
            created_leading_with,
            _watch: scheduled,
        }
    }
}

/// Starts the watch on the held node `path` on this runtime, unless it runs already on one that
/// still does.
pub(crate) fn start_watch(
    session: &Weak<ZkSession>,
    raw: &Arc<Session>,
    state: &Arc<LeaseState>,
    path: &str,
    czxid: i64,
) {
    let claimed = session.upgrade().is_some_and(|s| s.claim_watch(path));
    if claimed && !state.is_closed() {
        let (session, raw, state) = (session.clone(), raw.clone(), state.clone());
        tokio::spawn(watch_own_node(session, raw, state, path.to_owned(), czxid));
    }
}

/// How one look at our node ended.
enum Look {
    /// Ours, with a watch set on it.
    Watching(zookeeper_client::OneshotWatcher),
    /// Gone, or another node under the same path.
    NotOurs,
    /// No answer: look again.
    Retry,
    /// The session is over: its end loses the guard.
    Over,
}

async fn look(session: &Weak<ZkSession>, path: &str, czxid: i64) -> Look {
    let Some(session) = session.upgrade() else {
        return Look::Over;
    };
    let client = match session.client().await {
        Ok(client) => client,
        Err(_) if session.has_ended() => return Look::Over,
        Err(_) => return Look::Retry,
    };
    match timed(session.command_timeout, client.check_and_watch_stat(path)).await {
        Ok((Some(stat), watcher)) if stat.ephemeral_owner == session.id && stat.czxid == czxid => {
            Look::Watching(watcher)
        }
        Ok(_) => Look::NotOurs,
        Err(fail) if fail.session_over() => Look::Over,
        Err(fail) => {
            session.note(&fail).await;
            Look::Retry
        }
    }
}

/// Whether the session still lives, asked over it (retried while the connection is down, until
/// the session's own account says it ended).
async fn session_lives(session: &Weak<ZkSession>, raw: &Session) -> bool {
    loop {
        let asked = {
            let Some(session) = session.upgrade() else {
                return false;
            };
            match session.client().await {
                Ok(client) => timed(session.command_timeout, client.check_stat("/")).await,
                Err(_) if session.has_ended() => return false,
                Err(_) => Err(Fail::TimedOut(session.command_timeout)),
            }
        };
        match asked {
            Ok(_) => return true,
            Err(fail) if fail.session_over() => return false,
            Err(_) => {}
        }
        tokio::select! {
            _ = raw.ended() => return false,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Loses the guard when its node goes while the session lives (an operator's or another
/// client's delete), which the session's own account never sees: without the watch the guard
/// would look held until the next reconnect. Any other event on the node sets the watch again.
/// An answer about the node, and a watch event, come over our session's connection, so they
/// prove the server still has the session: the loss is the node's (`TakenOver`), not the
/// session's.
async fn watch_own_node(
    session: Weak<ZkSession>,
    raw: Arc<Session>,
    state: Arc<LeaseState>,
    path: String,
    czxid: i64,
) {
    loop {
        // Holding neither the client nor the session while waiting: the session closes when
        // its last guard and client go, not when this task does.
        let looked = tokio::select! {
            biased;
            _ = state.closed() => return,
            _ = state.lost_token().cancelled() => return,
            _ = raw.ended() => return,
            looked = look(&session, &path, czxid) => looked,
        };
        let watcher = match looked {
            Look::Watching(watcher) => watcher,
            Look::NotOurs => break,
            Look::Over => return,
            Look::Retry => {
                // Disconnected (the library queues requests meanwhile): the heartbeat reports
                // the suspension, and its check after the reconnect covers the node too.
                tokio::select! {
                    _ = state.closed() => return,
                    _ = state.lost_token().cancelled() => return,
                    _ = raw.ended() => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                }
            }
        };
        let event = tokio::select! {
            biased;
            _ = state.closed() => return,
            _ = state.lost_token().cancelled() => return,
            _ = raw.ended() => return,
            event = watcher.changed() => event,
        };
        match (event.event_type, event.session_state) {
            (EventType::NodeDeleted, _) => break,
            (EventType::Session, session_state) if session_state.is_terminated() => return,
            // The data changed, or a session event short of the end: look again, which sets
            // the watch again.
            _ => {}
        }
    }
    if state.is_closed() || state.lost_reason().is_some() {
        return;
    }
    // The server removes an ended session's nodes too, and that deletion can reach us before
    // the session's end does: only a session shown alive by a round trip over it makes the
    // loss the node's. Otherwise the session's own account loses the guard, with its reason.
    if !session_lives(&session, &raw).await {
        let _ = state.status();
        return;
    }
    // The session's own end, if it came meanwhile, is the better reason: it marks first.
    if matches!(raw.status(), SessionStatus::Ended(_)) {
        let _ = state.status();
        return;
    }
    if state.mark_lost(LostReason::TakenOver) {
        tracing::warn!(node = %path, "a held zookeeper node was deleted by someone else; its guard is lost");
    }
    if let Some(session) = session.upgrade() {
        session.forget(&path);
    }
}

#[dlock_api::raw::async_trait]
impl RawLease for ZkLease {
    async fn release(&self) -> Result<()> {
        self.released.store(true, Ordering::SeqCst);
        self.state.close();
        // Forgotten only once deleted: an attach again meanwhile (from another runtime) deletes
        // every node of the session it does not know to be held, which would answer this delete
        // with `NoNode`, as if the lock had been lost.
        let writing = self.writing.lock().await;
        let version = self.version.load(Ordering::SeqCst);
        let deleted = delete_node(&self.session, &self.path, version).await;
        drop(writing);
        self.session.forget(&self.path);
        match deleted {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockError::NotHeld {
                name: self.name.to_string(),
            }),
            Err(error) => Err(error),
        }
    }

    /// Refused before any network call: the session is the lease, renewed by its heartbeat.
    async fn extend(&self, _ttl: Duration) -> Result<Instant> {
        Err(LockError::Unsupported {
            backend: BACKEND,
            operation: "extend (the session is the lease)",
        })
    }

    /// Writes the leader record (`term`, `value`) as the data of our own node, with a
    /// version-checked `setData`: it lands only while the node exists, and the node exists only
    /// while this session holds its place (see [Elections](crate#elections)).
    async fn proclaim(&self, term: FencingToken, value: &[u8]) -> Result<()> {
        let child = self.path.rsplit('/').next().unwrap_or_default();
        if crate::names::limit(child) != 1 {
            return Err(LockError::Unsupported {
                backend: BACKEND,
                operation: "elections on a semaphore's permit",
            });
        }
        if u64::try_from(self.czxid).ok() != Some(term.get()) {
            return Err(LockError::NotHeld {
                name: self.name.to_string(),
            });
        }
        if self.created_leading_with.answers(term, value) {
            // The node's data leads with this value since its create, under this term.
            return Ok(());
        }
        let data = crate::election::record(self.czxid, value);
        let writing = self.writing.clone().lock_owned().await;
        let (session, path, czxid) = (self.session.clone(), self.path.clone(), self.czxid);
        let (version, name) = (self.version.clone(), self.name.clone());
        // Runs to its end if the caller goes away, so the version it leaves is known to the
        // release after it.
        Detach::new(async move {
            let _writing = writing;
            let written =
                crate::election::write_record(&session, &path, czxid, &version, &data).await?;
            if written {
                Ok(())
            } else {
                Err(LockError::NotHeld {
                    name: name.to_string(),
                })
            }
        })
        .await
    }
}

impl Drop for ZkLease {
    /// A guard forgotten rather than released: its node is deleted in the background, so the
    /// lock is free at once (other guards of the session are untouched).
    fn drop(&mut self) {
        self.state.close();
        self.session.forget(&self.path);
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        let (session, path) = (self.session.clone(), self.path.clone());
        let (version, writing) = (self.version.clone(), self.writing.clone());
        dlock_api::raw::spawn_cleanup(async move {
            // After a proclaim still on its way, with the version it left.
            let _writing = writing.lock().await;
            let version = version.load(Ordering::SeqCst);
            let _ = delete_node(&session, &path, version).await;
        });
    }
}
