//! Changes heard as they happen: the statements that write or delete a leader's record, and a
//! permit's release while a waiter is first in line, also `pg_notify` the name's channel, and
//! one `LISTEN` connection per client (and runtime) hears them for all of that client's
//! observers and waiters.
//!
//! A [`Hub`] is that connection's task and the channels it listens on, shared through
//! [`Subscriptions`]: the first observer (or waiter) of a name joins its channel and has the
//! task `LISTEN` before its first read (or attempt), so a change between that read and the
//! subscribe is not missed; the last to leave has it `UNLISTEN`. Each notification rings the
//! channel's [`ChangeBell`]s, and the observers read the record (the waiter tries the slots).
//! A lost connection rings every bell (a notification may have passed unheard), and the task
//! connects again and listens anew, ringing every bell once more when it has: observers then
//! read what changed meanwhile.
//!
//! The listening connection is not one of the pool's: it holds no locks and runs no statement of
//! the lock protocol, so its end loses nothing, and dropping the client ends its task.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::{ChangeBell, PerRuntime, Subscription, Subscriptions};
use dlock_api::{LockError, Result};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::timeout;

/// How long a listener whose connection failed waits before it connects again.
const RECONNECT: Duration = Duration::from_secs(1);

/// The channel the statements of `key`'s leader record notify.
pub(crate) fn leader_channel(key: i64) -> String {
    // Hex of a signed integer is its two's complement: 16 digits for every key.
    format!("dlock_leader_{key:016x}")
}

/// The channel a release of one of `key`'s permits notifies while a waiter is first in line.
pub(crate) fn permit_channel(key: i64) -> String {
    format!("dlock_permit_{key:016x}")
}

/// One client's listening connections, one per runtime: a connection's socket belongs to the
/// runtime that opened it, so each runtime's task connects (and reconnects) for itself.
#[derive(Debug)]
pub(crate) struct Listener {
    options: PgConnectOptions,
    within: Duration,
    hubs: PerRuntime<Arc<Hub>>,
}

/// One runtime's listening task and the channels its observers joined.
#[derive(Debug)]
struct Hub {
    channels: Arc<Subscriptions<watch::Sender<u64>>>,
    commands: mpsc::UnboundedSender<Command>,
}

#[derive(Debug)]
enum Command {
    Listen(String, oneshot::Sender<Result<()>>),
    Unlisten(String),
    Close,
}

/// An observer's share of its channel: the last to drop has the task `UNLISTEN`.
struct Membership {
    hub: Arc<Hub>,
    entry: Arc<Subscription<watch::Sender<u64>>>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let commands = self.hub.commands.clone();
        self.hub
            .channels
            .leave(&self.entry, move |entry| async move {
                let _ = commands.send(Command::Unlisten(entry.name().to_owned()));
            });
    }
}

impl Listener {
    /// A listener that connects with `options` when the first bell is asked for, bounding a
    /// connect and a `LISTEN` by `within` each.
    pub(crate) fn new(options: PgConnectOptions, within: Duration) -> Self {
        Self {
            options,
            within,
            hubs: PerRuntime::new(),
        }
    }

    /// A bell for `channel`, rung by every notification on it heard from now on.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if the listening connection cannot be had or its `LISTEN`
    /// fails.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves its membership, which unlistens if it was the last.
    pub(crate) async fn bell(&self, channel: String) -> Result<ChangeBell> {
        let hub = self
            .hubs
            .get_or_make(|_| self.start())
            .ok_or_else(|| unavailable("no tokio runtime to listen on"))?;
        let entry = hub.channels.join(&channel, || watch::channel(0).0);
        let rings = entry.subscribe();
        let membership = Membership {
            hub: hub.clone(),
            entry,
        };
        let (ack, acked) = oneshot::channel();
        {
            // Commands run in the order sent: an unlisten of an old entry sent before this
            // listen cannot undo it.
            let _turn = hub.channels.ordered().await;
            hub.commands
                .send(Command::Listen(channel, ack))
                .map_err(|_| unavailable("the listening task has ended"))?;
        }
        match timeout(self.within.saturating_mul(2), acked).await {
            Ok(Ok(Ok(()))) => Ok(ChangeBell::new(rings, membership)),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Err(unavailable("the listening task has ended")),
            Err(_) => Err(unavailable("no LISTEN within the timeout")),
        }
    }

    /// Ends every runtime's listening task, closing its connection.
    pub(crate) fn close(&self) {
        for hub in self.hubs.running() {
            let _ = hub.commands.send(Command::Close);
        }
    }

    fn start(&self) -> Arc<Hub> {
        let (commands, received) = mpsc::unbounded_channel();
        let channels = Arc::new(Subscriptions::new());
        // sqlx's listener connects through a pool; one connection, kept for as long as it
        // lives, is all it uses.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(self.within)
            .connect_lazy_with(self.options.clone());
        let task = Task {
            pool,
            within: self.within,
            channels: channels.clone(),
            listener: None,
            listening: HashSet::new(),
        };
        tokio::spawn(task.run(received));
        Arc::new(Hub { channels, commands })
    }
}

fn unavailable(why: &str) -> LockError {
    LockError::unavailable_because(crate::BACKEND, format!("notifications: {why}"))
}

/// The listening task's state.
struct Task {
    pool: PgPool,
    within: Duration,
    channels: Arc<Subscriptions<watch::Sender<u64>>>,
    /// `None` while disconnected.
    listener: Option<PgListener>,
    /// The channels `LISTEN`ed on the current connection.
    listening: HashSet<String>,
}

impl Task {
    /// Serves commands and notifications until the hub is dropped or closed.
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let mut joined = false;
            self.channels.for_each(|_| joined = true);
            let heard = async {
                match self.listener.as_mut() {
                    // Cancel safe: sqlx reads whole messages from its buffer.
                    Some(listener) => Some(listener.try_recv().await),
                    // Disconnected with observers: connect again after a pause.
                    None if joined => {
                        tokio::time::sleep(RECONNECT).await;
                        None
                    }
                    // Nobody to listen for: the next `Listen` connects.
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Listen(channel, ack)) => {
                        let _ = ack.send(self.listen(channel).await);
                    }
                    Some(Command::Unlisten(channel)) => self.unlisten(&channel).await,
                    Some(Command::Close) => {
                        drop(self.listener.take());
                        self.pool.close().await;
                        return;
                    }
                    None => return,
                },
                heard = heard => match heard {
                    Some(Ok(Some(notification))) => {
                        self.channels.with(notification.channel(), ring);
                    }
                    // The connection dropped (`None`) or failed: notifications may have passed.
                    Some(Ok(None) | Err(_)) => self.lost(),
                    None => self.reconnect().await,
                },
            }
        }
    }

    async fn listen(&mut self, channel: String) -> Result<()> {
        if self.listener.is_some() && self.listening.contains(&channel) {
            return Ok(());
        }
        if self.listener.is_none() {
            self.connect().await?;
        }
        let Some(listener) = self.listener.as_mut() else {
            return Err(unavailable("not connected"));
        };
        match timeout(self.within, listener.listen(&channel)).await {
            Ok(Ok(())) => {
                self.listening.insert(channel);
                Ok(())
            }
            Ok(Err(error)) => {
                self.lost();
                Err(LockError::unavailable(crate::BACKEND, error))
            }
            Err(_) => {
                self.lost();
                Err(unavailable("no LISTEN within the timeout"))
            }
        }
    }

    async fn unlisten(&mut self, channel: &str) {
        if !self.listening.remove(channel) {
            return;
        }
        if let Some(listener) = self.listener.as_mut() {
            if !matches!(
                timeout(self.within, listener.unlisten(channel)).await,
                Ok(Ok(()))
            ) {
                self.lost();
            }
        }
    }

    /// A new connection, listening on no channel yet.
    async fn connect(&mut self) -> Result<()> {
        let mut listener = match timeout(self.within, PgListener::connect_with(&self.pool)).await {
            Ok(Ok(listener)) => listener,
            Ok(Err(error)) => return Err(LockError::unavailable(crate::BACKEND, error)),
            Err(_) => return Err(unavailable("no connection within the timeout")),
        };
        // A lost connection is ours to notice (every bell rings), not sqlx's to hide.
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        self.listener = Some(listener);
        self.listening.clear();
        Ok(())
    }

    /// After a lost connection: listens again on every channel still joined, then rings them
    /// all, for what changed while nobody listened.
    async fn reconnect(&mut self) {
        let mut wanted = Vec::new();
        self.channels
            .for_each(|entry| wanted.push(entry.name().to_owned()));
        if wanted.is_empty() || self.connect().await.is_err() {
            return;
        }
        for channel in wanted {
            if self.listen(channel).await.is_err() {
                return;
            }
        }
        self.channels.for_each(|entry| ring(entry));
    }

    /// The connection is gone: every bell rings, and the task connects again after a pause.
    fn lost(&mut self) {
        if let Some(listener) = self.listener.take() {
            tracing::debug!("dlock: the leader-notification connection was lost; reconnecting");
            drop(listener);
        }
        self.listening.clear();
        self.channels.for_each(|entry| ring(entry));
    }
}

fn ring(entry: &Subscription<watch::Sender<u64>>) {
    entry.send_modify(|rings| *rings = rings.wrapping_add(1));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_is_an_identifier_postgres_keeps_whole() {
        let channel = leader_channel(-1);
        assert_eq!(channel, "dlock_leader_ffffffffffffffff");
        assert!(channel.len() < 64, "NAMEDATALEN truncates longer names");
    }
}
