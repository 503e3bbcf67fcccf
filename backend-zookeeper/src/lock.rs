//! `ZkLock`: the client, its session, and the queue recipe for `limit` places (a lock has one):
//! join the queue (see [`crate::enqueue`]), watch the `limit` nodes just before ours, re-list
//! before deciding.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{
    Claim, Grant, PendingAcquire, RawLock, RenewedBy, SessionStatus, WaitRecovery, permits_mismatch,
};
use dlock_api::{
    Capabilities, Fencing, FencingToken, Inspection, Leader, LeaderStream, LockError, LockName,
    LockOptions, LostReason, Result,
};
use tokio::time::Instant;
use zookeeper_client::Error as ZkError;

use crate::BACKEND;
use crate::config::ZkConfig;
use crate::enqueue::{Ahead, Node, join_queue, list_synced};
use crate::error::timed;
use crate::lease::{ZkLease, delete_node};
use crate::names::{Place, holders, place, queue};
use crate::session::ZkSession;

/// The most permits a semaphore takes. Every decision lists the name's whole queue (holders and
/// waiters), a waiter watches the `permits` nodes just before its own, and a node's deletion
/// wakes the up to `permits` waiters just behind it, each of which lists again: a release costs
/// up to `permits` listings of at least `permits` names. 128 keeps that under a megabyte of
/// answers per release, far above the pools a semaphore guards in practice.
const MAX_PERMITS: u32 = 128;

/// A distributed lock on ZooKeeper: one ephemeral sequential node per acquire under the name's
/// node, queued by sequence, each waiter watching only the node just before its own (a
/// semaphore's waiter, the `permits` nodes just before it). Cheap to clone; clones share the
/// session.
///
/// Created by [`connect`](Self::connect) or [`connect_url`](Self::connect_url). Every guard of
/// a client rides its one session; when the session expires a new one is opened for later
/// acquires. The session is closed (freeing any lock still held) once the last clone and the
/// last guard are gone.
#[derive(Clone)]
pub struct ZkLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    current: Mutex<Option<Arc<ZkSession>>>,
    /// One session opened at a time.
    opening: tokio::sync::Mutex<()>,
    /// The guards this client holds, which `close` releases.
    holdings: dlock_api::raw::Holdings,
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("config", &self.inner.config)
            .field("session", &self.session_id().map(|id| format!("{id:#x}")))
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "zookeeper({})", self.inner.config)
    }
}

/// How a wait on one session ended.
enum Waited {
    Granted(Grant),
    TimedOut,
    /// The session ended, or our node went: queue again (on a new session if need be).
    Requeue,
}

impl Inner {
    fn current(&self) -> Option<Arc<ZkSession>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The client's session: the current one while it lasts (attached again from this runtime
    /// if the one it was attached on stopped), else a new one.
    pub(crate) async fn session(&self) -> Result<Arc<ZkSession>> {
        if let Some(session) = self.current().filter(|s| s.is_usable()) {
            return Ok(session);
        }
        let _one = self.opening.lock().await;
        if let Some(session) = self.current().filter(|s| !s.has_ended()) {
            match session.client().await {
                Ok(_) => return Ok(session),
                // Not attached, but the session may still come back: the caller tries again.
                Err(error) if !session.has_ended() => return Err(error),
                Err(_) => {}
            }
        }
        let session = ZkSession::open(&self.config).await?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(session.clone());
        Ok(session)
    }
}

impl ZkLock {
    /// Connects with `config`: opens the client's first session, proving the ensemble answers.
    ///
    /// # Errors
    /// [`LockError::Config`] for options the client library refuses (a TLS file it cannot
    /// read); [`LockError::Unavailable`] when no server gives a session within the connect
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held before it returns (a session opened as it is dropped
    /// closes).
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        let inner = Arc::new(Inner {
            config,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            holdings: dlock_api::raw::Holdings::default(),
        });
        inner.session().await?;
        Ok(Self { inner })
    }

    /// Parses `url` ([`ZkConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// As [`ZkConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held before it returns.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(ZkConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The id of the session this client's guards ride now, if one is open.
    pub fn session_id(&self) -> Option<i64> {
        self.inner.current().filter(|s| s.is_usable()).map(|s| s.id)
    }

    /// Where the client's current session stands: active, suspended (its connection is lost
    /// and it may come back until an instant) or ended; `None` before the first session or
    /// once it ended without a new one.
    pub fn session_status(&self) -> Option<SessionStatus> {
        self.inner.current().map(|s| s.session.status())
    }

    /// Ends the client's current session on the server at once, as an expiry would: connects
    /// a second client on the same session (through `hosts`, a connect string such as
    /// `127.0.0.1:2181`, or the configured hosts) and closes it, then confirms that the server
    /// refuses the session. Every guard of the session is then lost (`SessionExpired`) as soon
    /// as the client hears of it. For fault drills and tests: it is what the server does to a
    /// session that stays silent past its timeout.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when no session is open or the server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the session may or may not have been ended.
    pub async fn expire_session(&self, hosts: Option<&str>) -> Result<()> {
        let session = self
            .inner
            .current()
            .ok_or_else(|| LockError::unavailable_because(BACKEND, "no session is open"))?;
        let info = session.client().await?.session().clone();
        drop(session);
        let hosts = hosts.map_or_else(|| self.inner.config.connect_string(), str::to_owned);
        let config = &self.inner.config;
        let give_up = after(Instant::now(), config.connect_timeout.saturating_mul(3));
        loop {
            let connector = crate::connect::connector(config)?.with_session(info.clone());
            let attach = crate::connect::dial(connector, config, &hosts);
            match tokio::time::timeout(config.connect_timeout, attach).await {
                // The server refuses the session: it is over.
                Ok(Err(ZkError::SessionExpired)) => return Ok(()),
                // Reattached: dropping this client closes the session. Look again.
                Ok(Ok(client)) => drop(client),
                Ok(Err(error)) if Instant::now() >= give_up => {
                    return Err(crate::error::map_err(error));
                }
                Err(_) if Instant::now() >= give_up => {
                    return Err(LockError::command_timeout(BACKEND, config.connect_timeout));
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn grant(&self, name: &LockName, session: Arc<ZkSession>, node: Node) -> Grant {
        let token = FencingToken::new(u64::try_from(node.czxid).unwrap_or(0));
        let state = session.new_guard_state(&node.path, node.czxid);
        let lease = Arc::new(ZkLease::start(session, name, node, state.clone()));
        Grant::new(name.clone(), token, lease, state, RenewedBy::Session)
    }

    /// Waits in the queue for `claim` on one session; the queue is joined by `answer_by` or not
    /// at all.
    async fn wait_on(
        &self,
        session: &Arc<ZkSession>,
        (name, claim): (&LockName, Claim),
        deadline: Option<Instant>,
        answer_by: Option<Instant>,
        recovery: &mut WaitRecovery,
        options: &LockOptions,
    ) -> Result<Waited> {
        let parent = self.inner.config.name_path(name);
        let joined = join_queue(
            self.inner.config.acl,
            session,
            &parent,
            (claim, leads_with(claim, options)),
        );
        let (node, ahead, pending) = answer_by_or_unavailable(answer_by, joined).await?;
        recovery.reached_server();
        let mut listed = match ahead {
            Ahead::Nobody => {
                let grant = self.grant(name, session.clone(), node);
                pending.disarm();
                return Ok(Waited::Granted(grant));
            }
            Ahead::Listed(children) => Some(children),
            Ahead::Unknown => None,
        };
        let client = match session.client().await {
            Ok(client) => client,
            Err(_) => {
                drop(pending);
                return Ok(Waited::Requeue);
            }
        };
        let timeout = session.command_timeout;
        let fallback = session.timeout.max(Duration::from_secs(2));
        loop {
            let children = match listed.take() {
                Some(children) => children,
                None => match timed(timeout, client.list_children(&parent)).await {
                    Ok(children) => {
                        recovery.reached_server();
                        children
                    }
                    Err(fail) if fail.session_over() => {
                        drop(pending);
                        return Ok(Waited::Requeue);
                    }
                    Err(fail) => {
                        recovery
                            .pause_or_give_up(fail.into(), options.retry(), deadline)
                            .await?;
                        continue;
                    }
                },
            };
            let queue = queue(&children);
            let ahead = match place(&queue, node.child_name(), claim) {
                // Our node went (its session ended, or someone deleted it): queue again.
                Place::Gone => {
                    drop(pending);
                    return Ok(Waited::Requeue);
                }
                Place::Holds => {
                    let grant = self.grant(name, session.clone(), node);
                    pending.disarm();
                    return Ok(Waited::Granted(grant));
                }
                Place::Mismatch(in_use) => {
                    leave(session, &node, pending).await;
                    return Err(permits_mismatch(name, claim.limit, in_use));
                }
                Place::Waits(ahead) => ahead,
            };
            // Watch the nodes just before ours (exists-watches, set even if they are gone):
            // the first of them to go may let us in.
            let looks = futures::future::join_all(ahead.iter().map(|(_, before)| {
                let (client, before) = (&client, format!("{parent}/{before}"));
                async move { timed(timeout, client.check_and_watch_stat(&before)).await }
            }))
            .await;
            let mut watchers = Vec::with_capacity(looks.len());
            let mut failed = None;
            for looked in looks {
                match looked {
                    Ok((Some(_), watcher)) => watchers.push(Box::pin(watcher.changed())),
                    // Gone already: re-list before deciding (it may have left an earlier node).
                    Ok((None, _)) => failed = failed.or(Some(None)),
                    Err(fail) => failed = Some(Some(fail)),
                }
            }
            match failed {
                None => {}
                Some(None) => continue,
                Some(Some(fail)) if fail.session_over() => {
                    drop(pending);
                    return Ok(Waited::Requeue);
                }
                Some(Some(fail)) => {
                    recovery
                        .pause_or_give_up(fail.into(), options.retry(), deadline)
                        .await?;
                    continue;
                }
            }
            let look_again = after(Instant::now(), fallback);
            let wake = deadline.map_or(look_again, |d| d.min(look_again));
            tokio::select! {
                // A node before ours changed or went (or the session ended): re-list.
                _ = futures::future::select_all(watchers) => {}
                // A node watch never reports a lost connection: the session's own account does.
                _ = session.session.ended() => {
                    drop(pending);
                    return Ok(Waited::Requeue);
                }
                () = tokio::time::sleep_until(wake) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        // Out of time: take our node out of the queue before answering.
                        leave(session, &node, pending).await;
                        return Ok(Waited::TimedOut);
                    }
                }
            }
        }
    }
}

#[dlock_api::raw::async_trait]
impl RawLock for ZkLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &dlock_api::raw::Holdings {
        &self.inner.holdings
    }

    /// Closes the session now (its nodes go with it) rather than leaving it to expire.
    async fn shutdown(&self, deadline: Instant) {
        let session = self
            .inner
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(session) = session {
            session
                .close(deadline.saturating_duration_since(Instant::now()))
                .await;
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Strict,
            fifo: true,
            survives_failover: true,
            inspect: true,
            takeover_signal: true,
            max_permits: MAX_PERMITS,
            one_limit_per_name: true,
            elections: true,
            reader_writer: true,
            ..Capabilities::SESSION_LEASE
        }
    }

    /// The queue under the name's node, after a `sync` (sent with the listing, so the server
    /// answering has seen every write before it): the lowest sequence holds, the rest wait. The
    /// holder's node's stat gives the token (its `czxid`, as its guard reports it) and the
    /// holder (its ephemeral owner, the session id). No remaining lease: the lease is the
    /// session. A holder gone between the listing and the stat sends it round again.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let session = self.inner.session().await?;
        let client = session.client().await?;
        let timeout = session.command_timeout;
        let parent = self.inner.config.name_path(name);
        let mut rounds: u32 = 0;
        loop {
            rounds = rounds.saturating_add(1);
            // No node: nobody has queued (or the server removed the empty container).
            let Some(children) = list_synced(&client, &parent, timeout).await? else {
                return Ok(Inspection::free(Some(0)).with_readers(0, 0));
            };
            let queue = queue(&children);
            let Some((_, first)) = queue.first() else {
                return Ok(Inspection::free(Some(0)).with_readers(0, 0));
            };
            let path = format!("{parent}/{first}");
            match timed(timeout, client.check_stat(&path)).await? {
                Some(stat) => {
                    let token = u64::try_from(stat.czxid).ok().map(FencingToken::new);
                    let (readers, waiting_readers) = crate::names::readers(&queue);
                    return Ok(Inspection::held(token)
                        .with_waiters(queue.len().saturating_sub(holders(&queue)))
                        .with_readers(readers, waiting_readers)
                        .with_holder(format!("session {:#x}", stat.ephemeral_owner)));
                }
                // Released since the listing: look again, a few times under churn.
                None if rounds < 5 => {}
                None => {
                    return Err(LockError::unavailable_because(
                        BACKEND,
                        "the queue kept changing under inspection",
                    ));
                }
            }
        }
    }

    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        self.try_place(name, Claim::new(limit, options), options)
            .await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.wait_place(name, Claim::new(limit, options), options, deadline)
            .await
    }

    /// The nodes at the head of the queue that hold, after a `sync`: those queued with the first
    /// one's limit, up to it. A node counts from the moment the server's queue puts it under its
    /// limit, before its client has heard, until it is deleted.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        let session = self.inner.session().await?;
        let client = session.client().await?;
        let parent = self.inner.config.name_path(name);
        let listed = list_synced(&client, &parent, session.command_timeout).await?;
        let held = listed.map_or(0, |children| holders(&queue(&children)));
        Ok(u32::try_from(held).unwrap_or(u32::MAX))
    }

    /// The first node of the queue, after a `sync`, if it published a record: its `czxid` is
    /// the term, the rest of its data the value (see [Elections](crate#elections)).
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        self.read_leader(name).await
    }

    /// A persistent recursive watch on the name's node, and a read of the leader after each
    /// event (see [Elections](crate#elections)).
    async fn observe_leader(&self, name: &LockName) -> Result<LeaderStream> {
        Ok(self.observe(name))
    }
}

impl ZkLock {
    /// One attempt at `claim` on `name` (one of its limit of places, or a reader's): join the
    /// queue, and leave it again unless the node holds.
    async fn try_place(
        &self,
        name: &LockName,
        claim: Claim,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        let session = self.inner.session().await?;
        let parent = self.inner.config.name_path(name);
        let leads_with = leads_with(claim, options);
        let (node, ahead, pending) = join_queue(
            self.inner.config.acl,
            &session,
            &parent,
            (claim, leads_with),
        )
        .await?;
        let children = match ahead {
            Ahead::Nobody => {
                let grant = self.grant(name, session, node);
                pending.disarm();
                return Ok(Some(grant));
            }
            Ahead::Listed(children) => children,
            Ahead::Unknown => match list_queue(&session, &parent).await {
                Ok(children) => children,
                Err(error) => {
                    drop(pending);
                    return Err(error);
                }
            },
        };
        let refused = match place(&queue(&children), node.child_name(), claim) {
            Place::Holds => {
                let grant = self.grant(name, session, node);
                pending.disarm();
                return Ok(Some(grant));
            }
            Place::Gone | Place::Waits(_) => None,
            Place::Mismatch(in_use) => Some(permits_mismatch(name, claim.limit, in_use)),
        };
        // Busy or refused: take our node out again before answering.
        leave(&session, &node, pending).await;
        refused.map_or(Ok(None), Err)
    }

    /// Waits for `claim` on `name` until `deadline`, on a new session when one ends.
    async fn wait_place(
        &self,
        name: &LockName,
        claim: Claim,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let config = &self.inner.config;
        let mut recovery = WaitRecovery::new(config.connect_timeout.max(config.session_timeout));
        let mut tried = false;
        loop {
            // Always one attempt, even with no time to wait; then only within the deadline.
            if tried && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            // The first attempt gets a round trip even when no time is left to wait.
            let answer_by = deadline.map(|d| match tried {
                true => d,
                false => d.max(after(Instant::now(), config.command_timeout)),
            });
            tried = true;
            let attempt = async {
                let session = answer_by_or_unavailable(answer_by, self.inner.session()).await?;
                let at = (name, claim);
                self.wait_on(&session, at, deadline, answer_by, &mut recovery, options)
                    .await
            };
            // A wait that reaches its deadline takes its node out in one more request; past
            // that, nothing the server says could still be a grant within the wait.
            let waited = match deadline {
                Some(deadline) => {
                    let cut_at = after(deadline, config.command_timeout);
                    tokio::time::timeout_at(cut_at, attempt)
                        .await
                        .unwrap_or_else(|_| Err(no_answer_within_the_wait()))
                }
                None => attempt.await,
            };
            match waited {
                Ok(Waited::Granted(grant)) => return Ok(Some(grant)),
                Ok(Waited::TimedOut) => return Ok(None),
                // A candidate whose node went never stands again unasked (etcd-io/etcd #19597):
                // its campaign fails and its caller decides; a lock's waiter queues again.
                Ok(Waited::Requeue) if options.is_campaign() => {
                    return Err(LockError::Lost {
                        name: name.to_string(),
                        reason: LostReason::SessionExpired,
                    });
                }
                Ok(Waited::Requeue) => {}
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?
                }
            }
        }
    }
}

/// Takes our node out of the queue before answering (busy, refused, out of time); the armed
/// cleanup tries again if the delete fails.
async fn leave(session: &ZkSession, node: &Node, pending: PendingAcquire) {
    match delete_node(session, &node.path, node.version).await {
        Ok(_) => pending.disarm(),
        Err(_) => drop(pending),
    }
}

/// `step` (opening or attaching a session, joining the queue), cut at `answer_by`: a server that
/// has not answered by the end of the wait is an outage, not a busy lock.
async fn answer_by_or_unavailable<T>(
    answer_by: Option<Instant>,
    step: impl Future<Output = Result<T>>,
) -> Result<T> {
    match answer_by {
        Some(answer_by) => tokio::time::timeout_at(answer_by, step)
            .await
            .unwrap_or_else(|_| Err(no_answer_within_the_wait())),
        None => step.await,
    }
}

fn no_answer_within_the_wait() -> LockError {
    LockError::unavailable_because(BACKEND, "no ZooKeeper server answered within the wait")
}

/// Lists the queue under `parent`; once more, attached again, if the client's task was gone.
async fn list_queue(session: &ZkSession, parent: &str) -> Result<Vec<String>> {
    let mut again = true;
    loop {
        let listed = timed(
            session.command_timeout,
            session.client().await?.list_children(parent),
        )
        .await;
        match listed {
            Ok(children) => return Ok(children),
            Err(fail) if fail.task_gone() && again => {
                session.note(&fail).await;
                again = false;
            }
            Err(fail) => return Err(fail.into()),
        }
    }
}

/// The campaign value a node for `claim` under `options` is created with: a campaign's, on a
/// lock's claim only (a permit or a reader's share never leads).
fn leads_with(claim: Claim, options: &LockOptions) -> Option<Arc<[u8]>> {
    options
        .campaign_value()
        .filter(|_| claim == Claim::LOCK)
        .map(Arc::from)
}
