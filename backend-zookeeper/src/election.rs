//! Elections on the lock's queue: the leader is the node at the head of the name's queue, its
//! record the data of that node, written by the leader's own proclaim; observers follow the
//! name's node with one persistent recursive watch.
//!
//! - **Record.** `[term: 8 bytes, big-endian][value]`, the data of the leader's own ephemeral
//!   node, where the term is the node's `czxid` (the grant's fencing token), written by a
//!   proclaim. A candidate's node is created with `lead:VALUE` as its data
//!   ([`candidate_data`]), so it leads with its campaign value from the moment it heads the
//!   queue, the term its `czxid`, and the campaign's first proclaim writes nothing. A node
//!   whose data is neither (a lock's holder) is reported as no leader. (A `czxid` never starts
//!   with `l`: its first byte is the high byte of the epoch.)
//! - **Proclaim** is a `setData` on our node guarded by the version our last write left: it
//!   lands only while the node exists, which is while our session holds our place (the server
//!   deletes an ended session's nodes in the same step that ends it). A node that is gone
//!   answers `NoNode`: the term is over, `NotHeld`.
//! - **Reading** (`leader`) lists the queue after a `sync`, then reads the first node's data and
//!   stat. A node that still exists when read is still first (later nodes only queue behind
//!   it), so the record is reported only while its writer holds the name.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use dlock_api::raw::OBSERVE_RETRY;
use dlock_api::{
    FencingToken, Leader, LeaderEvent, LeaderStream, LockError, LockName, LostReason, Result,
};
use futures::{FutureExt, StreamExt};
use tokio::sync::oneshot;
use zookeeper_client::{
    AddWatchMode, Client, Error as ZkError, EventType, PersistentWatcher, SessionState,
    WatchedEvent,
};

use crate::enqueue::list_synced;
use crate::error::{Fail, timed};
use crate::lock::ZkLock;
use crate::names::{limit, queue};
use crate::session::ZkSession;

/// The bytes of the term at the head of a record.
const TERM_BYTES: usize = 8;

/// The data a leader of term `czxid` writes to its node to publish `value`.
pub(crate) fn record(czxid: i64, value: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(TERM_BYTES.saturating_add(value.len()));
    data.extend_from_slice(&czxid.to_be_bytes());
    data.extend_from_slice(value);
    data
}

/// What starts a candidate's node's data, before its campaign value.
const CANDIDATE: &[u8] = b"lead:";

/// The data a candidate's node is created with, to lead with `value`.
pub(crate) fn candidate_data(value: &[u8]) -> Vec<u8> {
    [CANDIDATE, value].concat()
}

/// The leader a node created at `czxid` published with `data` (a proclaim's record, or the
/// value its candidate created it with), if any.
fn parse(czxid: i64, data: &[u8]) -> Option<Leader> {
    let value = match data.split_at_checked(TERM_BYTES) {
        Some((term, value)) if term == czxid.to_be_bytes() => value,
        _ => data.strip_prefix(CANDIDATE)?,
    };
    let term = FencingToken::new(u64::try_from(czxid).ok()?);
    Some(Leader::new(term, value))
}

/// Writes `data` to our node `path` (created at `czxid`), guarded by `version`, which it then
/// moves on. `Ok(false)`: the node is gone or not ours, or the session is over (the term has
/// ended). A write whose answer was lost is sent again: a `BadVersion` then means the first one
/// landed, which a look at the node (ours, by its `czxid` and owner) confirms.
pub(crate) async fn write_record(
    session: &ZkSession,
    path: &str,
    czxid: i64,
    version: &AtomicI32,
    data: &[u8],
) -> Result<bool> {
    let timeout = session.command_timeout;
    for attempt in 0..4 {
        let client = match session.client().await {
            Ok(client) => client,
            Err(_) if session.has_ended() => return Ok(false),
            Err(error) => return Err(error),
        };
        let expected = version.load(Ordering::SeqCst);
        let fail = match timed(timeout, client.set_data(path, data, Some(expected))).await {
            Ok(stat) => {
                version.store(stat.version, Ordering::SeqCst);
                return Ok(true);
            }
            Err(fail) => fail,
        };
        failed_on(session, &fail).await;
        match fail {
            Fail::Zk(ZkError::NoNode) => return Ok(false),
            fail if fail.session_over() => return Ok(false),
            Fail::Zk(ZkError::BadVersion) => {
                // Only our own writes change our node: one whose answer was lost landed.
                match timed(timeout, client.check_stat(path)).await {
                    Ok(Some(stat)) if stat.czxid == czxid && stat.ephemeral_owner == session.id => {
                        version.store(stat.version, Ordering::SeqCst);
                    }
                    Ok(_) => return Ok(false),
                    Err(fail) if fail.session_over() => return Ok(false),
                    Err(fail) => return Err(fail.into()),
                }
            }
            fail if fail.outcome_unknown() && attempt < 3 => {}
            fail => return Err(fail.into()),
        }
    }
    Err(LockError::command_timeout(crate::BACKEND, timeout))
}

/// Takes note of a request's failure on `session`: a client task gone is attached again at the
/// next request, and a session the server says is over is ended now (its guards lost, a new
/// session for the next call), as its heartbeat would at its next beat. `true` if it was over.
async fn failed_on(session: &ZkSession, fail: &Fail) -> bool {
    session.note(fail).await;
    if !fail.session_over() {
        return false;
    }
    session.end(if fail.is(&ZkError::SessionExpired) {
        LostReason::SessionExpired
    } else {
        LostReason::SessionClosed
    });
    true
}

/// The leader of the queue under `parent`, as the server says after a `sync`: the first node's
/// record if it published one; `None` for an empty queue, a holder that has not proclaimed, or
/// a semaphore's queue.
pub(crate) async fn read_leader(
    client: &Client,
    parent: &str,
    timeout: std::time::Duration,
) -> std::result::Result<Option<Leader>, Fail> {
    let mut rounds: u32 = 0;
    loop {
        rounds = rounds.saturating_add(1);
        let Some(children) = list_synced(client, parent, timeout).await? else {
            return Ok(None);
        };
        let queue = queue(&children);
        let Some((_, first)) = queue.first() else {
            return Ok(None);
        };
        if limit(first) != 1 {
            return Ok(None);
        }
        let path = format!("{parent}/{first}");
        match timed(timeout, client.get_data(&path)).await {
            Ok((data, stat)) => return Ok(parse(stat.czxid, &data)),
            // Gone since the listing: the next node may hold now. A few times under churn.
            Err(Fail::Zk(ZkError::NoNode)) if rounds < 8 => {}
            Err(fail) => return Err(fail),
        }
    }
}

impl ZkLock {
    /// [`RawLock::leader`](dlock_api::raw::RawLock::leader).
    /// A session found over (expired before its heartbeat heard) is ended, and the read made
    /// once more on a new one.
    pub(crate) async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let parent = self.inner.config.name_path(name);
        let mut again = true;
        loop {
            let session = self.inner.session().await?;
            let client = session.client().await?;
            match read_leader(&client, &parent, session.command_timeout).await {
                Ok(leader) => return Ok(leader),
                Err(fail) => {
                    let over = failed_on(&session, &fail).await;
                    if !(over && std::mem::take(&mut again)) {
                        return Err(fail.into());
                    }
                }
            }
        }
    }

    /// [`RawLock::observe_leader`](dlock_api::raw::RawLock::observe_leader).
    pub(crate) fn observe(&self, name: &LockName) -> LeaderStream {
        let observer = Observer {
            lock: self.clone(),
            parent: self.inner.config.name_path(name),
            watch: None,
            read: true,
            reported: false,
            missed: false,
            failing: false,
            pause: false,
        };
        futures::stream::unfold(observer, |mut observer| async move {
            let item = observer.next().await;
            Some((item, observer))
        })
        .boxed()
    }
}

/// A persistent watch, the session it was set on, and a signal that the runtime carrying its
/// events stopped (the client's tasks, and with them the watch, are then gone: the session is
/// attached again from the runtime that polls).
struct Watch {
    session: Arc<ZkSession>,
    watcher: PersistentWatcher,
    stopped: oneshot::Receiver<()>,
}

/// One observer of a name: a persistent recursive watch on the name's node (so the creation,
/// deletion and data change of every node in its queue wake it), and a read of the leader after
/// each wake-up.
struct Observer {
    lock: ZkLock,
    parent: String,
    watch: Option<Watch>,
    /// A read is due.
    read: bool,
    /// A state was reported (so a later gap is worth a `Missed`).
    reported: bool,
    /// Changes may have passed unseen since the last state reported.
    missed: bool,
    /// The current failure was reported already.
    failing: bool,
    /// Wait `OBSERVE_RETRY` before the next attempt.
    pause: bool,
}

impl Observer {
    async fn next(&mut self) -> Result<LeaderEvent> {
        loop {
            if std::mem::take(&mut self.pause) {
                tokio::time::sleep(OBSERVE_RETRY).await;
            }
            if self.watch.is_none() {
                if let Err(error) = self.set_watch().await {
                    if let Some(error) = self.failed(error) {
                        return Err(error);
                    }
                    continue;
                }
            }
            if self.read {
                if std::mem::take(&mut self.missed) {
                    return Ok(LeaderEvent::Missed);
                }
                let Some(watch) = &self.watch else {
                    continue;
                };
                let session = watch.session.clone();
                let read = async {
                    let client = session.client().await?;
                    let read = read_leader(&client, &self.parent, session.command_timeout).await;
                    if let Err(fail) = &read {
                        failed_on(&session, fail).await;
                    }
                    Ok::<_, LockError>(read?)
                };
                match read.await {
                    Ok(leader) => {
                        self.read = false;
                        self.reported = true;
                        self.failing = false;
                        return Ok(leader.map_or(LeaderEvent::Vacant, LeaderEvent::Leads));
                    }
                    Err(error) => {
                        // The watch may have missed what happened meanwhile: set it again.
                        self.watch = None;
                        if let Some(error) = self.failed(error) {
                            return Err(error);
                        }
                        continue;
                    }
                }
            }
            self.wait().await;
        }
    }

    /// Sets the watch on the client's current session (a new one if the last ended).
    async fn set_watch(&mut self) -> Result<()> {
        let session = self.lock.inner.session().await?;
        let client = session.client().await?;
        let watched = timed(
            session.command_timeout,
            client.watch(&self.parent, AddWatchMode::PersistentRecursive),
        )
        .await;
        let watcher = match watched {
            Ok(watcher) => watcher,
            Err(fail) => {
                failed_on(&session, &fail).await;
                return Err(fail.into());
            }
        };
        let (stop, stopped) = oneshot::channel();
        match session.client_life() {
            Some(life) => life.on_stop(move || {
                let _ = stop.send(());
            }),
            None => std::mem::forget(stop),
        }
        // Whatever happened before the watch was set is read now.
        self.read = true;
        self.missed = self.reported;
        self.watch = Some(Watch {
            session,
            watcher,
            stopped,
        });
        Ok(())
    }

    /// Waits for the watch to report a change, or the session to end or lose its connection;
    /// then takes every event already there too, so a burst of changes costs one read.
    async fn wait(&mut self) {
        let Some(Watch {
            session,
            watcher,
            stopped,
        }) = &mut self.watch
        else {
            return;
        };
        let raw = session.session.clone();
        // The library's receiver panics once its client's task is gone (its runtime stopped),
        // which can come before the runtime's stop is signalled: that ends the watch too.
        let changed = std::panic::AssertUnwindSafe(watcher.changed()).catch_unwind();
        let event = tokio::select! {
            event = changed => event.ok(),
            _ = raw.ended() => None,
            Ok(()) = stopped => None,
        };
        if !self.take(event) {
            return;
        }
        while let Some(Watch { watcher, .. }) = &mut self.watch {
            let Some(event) = std::panic::AssertUnwindSafe(watcher.changed())
                .catch_unwind()
                .now_or_never()
            else {
                return;
            };
            if !self.take(event.ok()) {
                return;
            }
        }
    }

    /// Takes one event of the watch (`None`: the watch is gone); `false` once the watch ended.
    fn take(&mut self, event: Option<WatchedEvent>) -> bool {
        match event {
            Some(event) if event.event_type != EventType::Session => self.read = true,
            Some(event) if event.session_state.is_terminated() => {
                self.ended();
                return false;
            }
            Some(event)
                if matches!(
                    event.session_state,
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly
                ) =>
            {
                // Back after a lost connection: changes made meanwhile raise no event
                // (ZOOKEEPER-4698), and the watch itself is not on the server any more:
                // zookeeper-client 0.11 sets only one-shot watches again on a reconnect (its
                // `SetWatches` leaves out the persistent ones). Set it again, then read.
                self.ended();
                return false;
            }
            // Disconnected: wait for the session to come back or end.
            Some(_) => {}
            None => {
                self.ended();
                return false;
            }
        }
        true
    }

    /// The watch is gone (its session ended, its connection was replaced, its runtime
    /// stopped): a new watch, on a new session if need be, and `Missed` before the next state.
    fn ended(&mut self) {
        self.watch = None;
        self.read = true;
        self.missed = self.reported;
    }

    /// A failed attempt: the error, if this failure was not reported yet; the next attempt
    /// waits `OBSERVE_RETRY`.
    fn failed(&mut self, error: LockError) -> Option<LockError> {
        self.pause = true;
        self.read = true;
        self.missed = self.reported;
        if std::mem::replace(&mut self.failing, true) {
            return None;
        }
        Some(error)
    }
}
