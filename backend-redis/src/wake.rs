//! Pub/sub on lock channels: one subscription per name per client, shared by all its waiters and
//! by the holders that watch their lock.
//!
//! A waiter registers its owner token for grants, and before each attempt makes sure the name's
//! channel is subscribed (the first waiter of the name subscribes; after a lost connection, the
//! next one does again), so an announcement between its failed attempt and its subscription is
//! not missed. A release either grants the lock to one waiter (`granted OWNER
//! TOKEN`: only that waiter is woken, and it already holds the lock) or announces it free (every
//! local waiter of the name is woken to try). A lost connection wakes every waiter, so none sleeps
//! through an announcement it could not hear; waiters also re-check when they refresh their
//! presence and at the holder's remaining TTL.
//!
//! A leader observer (`lock/election.rs`) joins its name's channel as a waiter does, and is told
//! of every message on it (`granted`, `free`, and `leader`, which only observers read) and of a
//! lost connection, with a signal kept until it looks, so that nothing arriving while it reads is
//! lost.
//!
//! A holder that watches its lock (see `held.rs`) registers its lock key, owner and token, and
//! joins its client's own channel, `PREFIX:held-by:CLIENT`, one subscription for all its held
//! locks: `taken OWNER TOKEN LOCK_KEY`, published there by whoever took a lock over a key that
//! went without a release, loses the watching holders of that key with a lower token, at once,
//! from the push handler.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::raw::{LeaseState, Subscription, Subscriptions};
use dlock_api::{LostReason, Result};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::conn::Conn;
use crate::scripts::Announcement;

#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    channels: Arc<Subscriptions<Channel>>,
    /// This client's waiting owners, to deliver `granted` announcements to.
    grants: Mutex<HashMap<String, Arc<Grant>>>,
    /// This client's watching holders, by lock key, to lose on a `taken` announcement.
    held: Mutex<HashMap<String, Vec<Watched>>>,
}

/// One watching holder: its owner value, its token, and its guard's state.
#[derive(Debug)]
struct Watched {
    owner: Arc<str>,
    token: u64,
    state: Weak<LeaseState>,
}

#[derive(Debug, Default)]
struct Channel {
    notify: Notify,
    subscribed: AtomicBool,
    /// The name's leader observers: each is told of every message on the channel and of a
    /// lost connection, and keeps the signal until it looks (`notify_one`), so that nothing
    /// that arrives while it is busy is lost.
    observers: Mutex<Vec<Arc<Signal>>>,
}

/// What an observer is told: something happened on its channel; `missed` if its connection was
/// lost, so messages may have passed unheard.
#[derive(Debug, Default)]
struct Signal {
    notify: Notify,
    missed: AtomicBool,
}

impl Channel {
    fn tell_observers(&self, missed: bool) {
        for signal in self
            .observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if missed {
                signal.missed.store(true, Ordering::SeqCst);
            }
            signal.notify.notify_one();
        }
    }
}

/// A grant delivered to one waiter: its fencing token. Not when it arrived: that says nothing
/// of when it was made (see the waiter in `lock.rs`).
#[derive(Debug, Default)]
struct Grant {
    granted: Mutex<Option<u64>>,
    notify: Notify,
}

/// A membership of one channel's subscription; dropping it unsubscribes when no member of the
/// name is left.
#[derive(Debug)]
struct Listening {
    hub: Arc<Wakeups>,
    channel: Arc<Subscription<Channel>>,
    conn: Conn,
    timeout: Duration,
}

/// One waiter's registration; dropping it unsubscribes when no waiter of the name is left.
#[derive(Debug)]
pub(crate) struct Waiting {
    listening: Listening,
    owner: String,
    grant: Arc<Grant>,
}

/// One holder's watch of its lock's channel; dropping it ends the watch.
#[derive(Debug)]
pub(crate) struct Watching {
    listening: Listening,
    lock: String,
    owner: Arc<str>,
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

impl Wakeups {
    /// The push handler for the connection: it holds the hub weakly, so the hub dies with its client.
    pub(crate) fn handler(hub: &Arc<Self>) -> crate::driven::PushHandler {
        let hub: Weak<Self> = Arc::downgrade(hub);
        Arc::new(move |info: PushInfo| {
            if let Some(hub) = hub.upgrade() {
                hub.on_push(info);
            }
        })
    }

    fn on_push(&self, info: PushInfo) {
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                let channel = info.data.first().and_then(text);
                match info
                    .data
                    .get(1)
                    .and_then(text)
                    .and_then(Announcement::parse)
                {
                    Some(Announcement::Granted { owner, token }) => {
                        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(grant) = grants.get(owner) {
                            *grant.granted.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
                            grant.notify.notify_one();
                        }
                    }
                    Some(Announcement::Taken { owner, token, lock }) => {
                        self.lose_watched(lock, owner, token);
                    }
                    // Only observers read the leader.
                    Some(Announcement::Leader) => {}
                    // `free`, or a message this version does not know: every waiter checks.
                    _ => {
                        if let Some(channel) = channel {
                            self.channels
                                .with(channel, |channel| channel.notify.notify_waiters());
                        }
                    }
                }
                // Every message on a name's channel (a grant, `free`, `leader`) may change its
                // leader.
                if let Some(channel) = channel {
                    self.channels
                        .with(channel, |channel| channel.tell_observers(false));
                }
            }
            PushKind::Disconnection => self.channels.for_each(|channel| {
                channel.subscribed.store(false, Ordering::SeqCst);
                channel.notify.notify_waiters();
                channel.tell_observers(true);
            }),
            _ => {}
        }
    }

    /// Loses every watching holder of the lock key `lock` that `taker` has taken it from:
    /// another owner, whose token is above the holder's (an announcement that comes late, for a
    /// grant made before the holder's own, loses nothing). A released guard's state is closed:
    /// it has nothing left to lose.
    fn lose_watched(&self, lock: &str, taker: &str, token: u64) {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for watched in held.get(lock).into_iter().flatten() {
            if &*watched.owner != taker && watched.token < token {
                if let Some(state) = watched.state.upgrade().filter(|s| !s.is_closed()) {
                    state.mark_lost(LostReason::TakenOver);
                }
            }
        }
    }

    fn listen(self: &Arc<Self>, conn: &Conn, channel: &str, timeout: Duration) -> Listening {
        Listening {
            hub: self.clone(),
            channel: self.channels.join(channel, Channel::default),
            conn: conn.clone(),
            timeout,
        }
    }

    /// Registers the holder `owner` of the lock key `lock` with `token` as a listener on its
    /// client's `channel`: a `taken` announcement of the key by another owner with a higher token
    /// loses `state`. Subscribe with [`Watching::ensure_subscribed`] before marking the lock
    /// watched.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn watch(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        lock: &str,
        owner: &Arc<str>,
        token: u64,
        state: &Arc<LeaseState>,
        timeout: Duration,
    ) -> Watching {
        let listening = self.listen(conn, channel, timeout);
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(lock.to_owned())
            .or_default()
            .push(Watched {
                owner: owner.clone(),
                token,
                state: Arc::downgrade(state),
            });
        Watching {
            listening,
            lock: lock.to_owned(),
            owner: owner.clone(),
        }
    }

    /// Registers a leader observer of `channel`, subscribing if needed; returns once the
    /// subscription is live.
    pub(crate) async fn observe(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        timeout: Duration,
    ) -> Result<Observing> {
        let listening = self.listen(conn, channel, timeout);
        let signal = Arc::new(Signal::default());
        listening
            .channel
            .observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(signal.clone());
        let observing = Observing { listening, signal };
        observing.ensure_subscribed().await?;
        Ok(observing)
    }

    /// Registers `owner` as a waiter on `channel`. It is not subscribed yet: the waiter calls
    /// [`Waiting::ensure_subscribed`] before each attempt, where a connection killed under the
    /// subscribe is ridden out with the rest of the wait.
    pub(crate) fn register(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        owner: &str,
        timeout: Duration,
    ) -> Waiting {
        let listening = self.listen(conn, channel, timeout);
        let grant = Arc::new(Grant::default());
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner.to_owned(), grant.clone());
        Waiting {
            listening,
            owner: owner.to_owned(),
            grant,
        }
    }
}

impl Waiting {
    /// A wake-up future for `free` announcements; create and `enable` it *before* re-checking.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.listening.notified()
    }

    /// Resolves when a release granted the lock to this waiter. A grant that arrives while the
    /// waiter is busy leaves a permit, so it is never missed.
    pub(crate) async fn granted_signal(&self) {
        self.grant.notify.notified().await
    }

    /// Takes the grant delivered to this waiter, if any: its fencing token.
    pub(crate) fn take_grant(&self) -> Option<u64> {
        self.grant
            .granted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Subscribes again after a lost connection (a no-op while subscribed).
    pub(crate) async fn ensure_subscribed(&self) -> Result<()> {
        self.listening.ensure_subscribed().await
    }
}

/// One leader observer's membership of its name's channel; dropping it unsubscribes when no
/// member of the name is left.
#[derive(Debug)]
pub(crate) struct Observing {
    listening: Listening,
    signal: Arc<Signal>,
}

impl Observing {
    /// Resolves at the next message on the channel or lost connection since the last call
    /// (at once if one came meanwhile).
    pub(crate) async fn changed(&self) {
        self.signal.notify.notified().await
    }

    /// Whether the connection was lost since the last call: messages may have passed unheard.
    pub(crate) fn take_missed(&self) -> bool {
        self.signal.missed.swap(false, Ordering::SeqCst)
    }

    /// Subscribes again after a lost connection (a no-op while subscribed).
    pub(crate) async fn ensure_subscribed(&self) -> Result<()> {
        self.listening.ensure_subscribed().await
    }
}

impl Drop for Observing {
    fn drop(&mut self) {
        self.listening
            .channel
            .observers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|signal| !Arc::ptr_eq(signal, &self.signal));
    }
}

impl Watching {
    /// Notified on a lost connection (and on `free` announcements of the name).
    pub(crate) fn wake(&self) -> &Notify {
        &self.listening.channel.notify
    }

    /// Subscribes the lock's channel (a no-op while subscribed).
    pub(crate) async fn ensure_subscribed(&self) -> Result<()> {
        self.listening.ensure_subscribed().await
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut held = self
            .listening
            .hub
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(watchers) = held.get_mut(&self.lock) {
            watchers.retain(|w| !Arc::ptr_eq(&w.owner, &self.owner));
            if watchers.is_empty() {
                held.remove(&self.lock);
            }
        }
    }
}

impl Listening {
    fn notified(&self) -> Notified<'_> {
        self.channel.notify.notified()
    }

    async fn ensure_subscribed(&self) -> Result<()> {
        if self.channel.subscribed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let _ordered = self.hub.channels.ordered().await;
        if !self.channel.subscribed.load(Ordering::SeqCst) {
            self.conn
                .subscribe(self.timeout, self.channel.name())
                .await?;
            self.channel.subscribed.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.listening
            .hub
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.owner);
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        let (conn, timeout) = (self.conn.clone(), self.timeout);
        self.hub
            .channels
            .leave(&self.channel, move |channel| async move {
                if !channel.subscribed.load(Ordering::SeqCst) {
                    return;
                }
                if let Err(error) = conn.unsubscribe(timeout, channel.name()).await {
                    tracing::debug!(%error, channel = %channel.name(), "redis: unsubscribe failed");
                }
            });
    }
}
