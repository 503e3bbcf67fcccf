//! Pub/sub wake-up of waiters: one subscription per name per client, shared by all its waiters.
//!
//! A waiter registers (subscribing the name's channel if it is the first, and its owner token for
//! grants), then re-checks the lock, so an announcement between its failed attempt and its
//! subscription is not missed. A release either grants the lock to one waiter (`granted OWNER
//! TOKEN`: only that waiter is woken, and it already holds the lock) or announces it free (every
//! local waiter of the name is woken to try). A lost connection wakes every waiter, so none sleeps
//! through an announcement it could not hear; waiters also re-check when they refresh their
//! presence and at the holder's remaining TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::Result;
use dlock_api::raw::{Subscription, Subscriptions};
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
}

#[derive(Debug, Default)]
struct Channel {
    notify: Notify,
    subscribed: AtomicBool,
}

/// A grant delivered to one waiter: its fencing token. Not when it arrived: that says nothing
/// of when it was made (see the waiter in `lock.rs`).
#[derive(Debug, Default)]
struct Grant {
    granted: Mutex<Option<u64>>,
    notify: Notify,
}

/// One waiter's registration; dropping it unsubscribes when no waiter of the name is left.
#[derive(Debug)]
pub(crate) struct Waiting {
    hub: Arc<Wakeups>,
    channel: Arc<Subscription<Channel>>,
    owner: String,
    grant: Arc<Grant>,
    conn: Conn,
    timeout: Duration,
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
    pub(crate) fn handler(hub: &Arc<Self>) -> crate::conn::PushHandler {
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
                    // `free`, or a message this version does not know: every waiter checks.
                    _ => {
                        if let Some(channel) = channel {
                            self.channels
                                .with(channel, |channel| channel.notify.notify_waiters());
                        }
                    }
                }
            }
            PushKind::Disconnection => self.channels.for_each(|channel| {
                channel.subscribed.store(false, Ordering::SeqCst);
                channel.notify.notify_waiters();
            }),
            _ => {}
        }
    }

    /// Registers `owner` as a waiter on `channel`, subscribing if needed; returns once the
    /// subscription is live.
    pub(crate) async fn register(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        owner: &str,
        timeout: Duration,
    ) -> Result<Waiting> {
        let entry = self.channels.join(channel, Channel::default);
        let grant = Arc::new(Grant::default());
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner.to_owned(), grant.clone());
        let waiting = Waiting {
            hub: self.clone(),
            channel: entry,
            owner: owner.to_owned(),
            grant,
            conn: conn.clone(),
            timeout,
        };
        waiting.ensure_subscribed().await?;
        Ok(waiting)
    }
}

impl Waiting {
    /// A wake-up future for `free` announcements; create and `enable` it *before* re-checking.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.channel.notify.notified()
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
        self.hub
            .grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.owner);
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
