//! Pub/sub wake-up of waiters: one subscription per name per client, shared by all its waiters.
//!
//! A waiter registers (subscribing the name's channel if it is the first), then re-checks the lock,
//! so a release between its failed attempt and its subscription is not missed. A release
//! publishes on the channel; the client's push handler wakes every local waiter of that name, and
//! they race for the lock. A lost connection wakes every waiter, so none sleeps through a release
//! it could not hear; each waiter also re-checks at the holder's remaining TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::Result;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::conn::Conn;

#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// Orders subscribe and unsubscribe commands, so a late unsubscribe never undoes a new subscribe.
    subscriptions: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Channel {
    name: String,
    notify: Notify,
    waiters: Mutex<usize>,
    subscribed: AtomicBool,
}

/// One waiter's registration; dropping it unsubscribes when no waiter of the name is left.
#[derive(Debug)]
pub(crate) struct Waiting {
    hub: Arc<Wakeups>,
    channel: Arc<Channel>,
    conn: Conn,
    timeout: Duration,
}

fn text(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(s) => Some(s.as_bytes()),
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
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        match info.kind {
            PushKind::Message | PushKind::SMessage => {
                let name = info
                    .data
                    .first()
                    .and_then(text)
                    .and_then(|b| std::str::from_utf8(b).ok());
                if let Some(channel) = name.and_then(|n| channels.get(n)) {
                    channel.notify.notify_waiters();
                }
            }
            PushKind::Disconnection => {
                for channel in channels.values() {
                    channel.subscribed.store(false, Ordering::SeqCst);
                    channel.notify.notify_waiters();
                }
            }
            _ => {}
        }
    }

    /// Registers a waiter on `channel`, subscribing if needed; returns once the subscription is live.
    pub(crate) async fn register(
        self: &Arc<Self>,
        conn: &Conn,
        channel: &str,
        timeout: Duration,
    ) -> Result<Waiting> {
        let entry = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    Arc::new(Channel {
                        name: channel.to_owned(),
                        notify: Notify::new(),
                        waiters: Mutex::new(0),
                        subscribed: AtomicBool::new(false),
                    })
                })
                .clone();
            *entry.waiters.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            entry
        };
        let waiting = Waiting {
            hub: self.clone(),
            channel: entry,
            conn: conn.clone(),
            timeout,
        };
        waiting.ensure_subscribed().await?;
        Ok(waiting)
    }
}

impl Waiting {
    /// A wake-up future; create and `enable` it *before* re-checking the lock.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.channel.notify.notified()
    }

    /// Subscribes again after a lost connection (a no-op while subscribed).
    pub(crate) async fn ensure_subscribed(&self) -> Result<()> {
        if self.channel.subscribed.load(Ordering::SeqCst) {
            return Ok(());
        }
        let _ordered = self.hub.subscriptions.lock().await;
        if !self.channel.subscribed.load(Ordering::SeqCst) {
            self.conn
                .subscribe(self.timeout, &self.channel.name)
                .await?;
            self.channel.subscribed.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let last = {
            let mut waiters = self
                .channel
                .waiters
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *waiters -= 1;
            *waiters == 0
        };
        if !last {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (hub, channel, conn, timeout) = (
            self.hub.clone(),
            self.channel.clone(),
            self.conn.clone(),
            self.timeout,
        );
        runtime.spawn(async move {
            let _ordered = hub.subscriptions.lock().await;
            let remove = {
                let mut channels = hub.channels.lock().unwrap_or_else(|e| e.into_inner());
                let idle = *channel.waiters.lock().unwrap_or_else(|e| e.into_inner()) == 0;
                let same = channels
                    .get(&channel.name)
                    .is_some_and(|c| Arc::ptr_eq(c, &channel));
                if idle && same {
                    channels.remove(&channel.name);
                }
                idle && same
            };
            if remove && channel.subscribed.load(Ordering::SeqCst) {
                if let Err(error) = conn.unsubscribe(timeout, &channel.name).await {
                    tracing::debug!(%error, channel = %channel.name, "redis: unsubscribe failed");
                }
            }
        });
    }
}
