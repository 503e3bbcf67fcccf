//! [`Driven`]: a redis-rs connection per tokio runtime that uses the client, each made on the
//! runtime whose task drives it; and the [`Line`] that keeps commands in the order they were
//! asked for while a runtime's connection is being made.
//!
//! redis-rs reads and writes a multiplexed connection in a task of the runtime it was opened
//! on. A client shared by runtimes (a `static` used by `#[tokio::test]`s, each on a runtime of
//! its own, one after another or in parallel) would otherwise lose that connection when its
//! runtime ends: commands of the other runtimes in flight on it would fail ("broken pipe"), and
//! waiters would wait for messages nobody reads. So each runtime gets a connection of its own,
//! and when one ends, every waiter re-checks and subscribes again on its own runtime's
//! connection. Locks are keys on the server, so a guard held across its runtime's end still
//! releases.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use dlock_api::Result;
use dlock_api::raw::{PerRuntime, RuntimeLife};
use redis::{PushInfo, PushKind};

/// Receives every push message (pub/sub messages, disconnections) of a connection.
pub(crate) type PushHandler = std::sync::Arc<dyn Fn(PushInfo) + Send + Sync>;

type Connecting<C> = Pin<Box<dyn Future<Output = Result<C>> + Send>>;

/// How a [`Driven`] connection is made (again): the topology's connect, with its config.
pub(crate) type Connect<C> = Box<dyn Fn() -> Connecting<C> + Send + Sync>;

/// A connection per runtime, and how to make one.
pub(crate) struct Driven<C> {
    connections: PerRuntime<C>,
    line: Line,
    connect: Connect<C>,
    push: PushHandler,
}

impl<C: Clone + Send + Sync + 'static> Driven<C> {
    /// Connects with `connect`, on the calling runtime; `push` hears of every new connection.
    pub(crate) async fn connect(connect: Connect<C>, push: PushHandler) -> Result<Self> {
        let conn = connect().await?;
        Ok(Self::adopting(conn, connect, push))
    }

    /// Keeps `conn`, made on the calling runtime, as its connection; other runtimes' are made
    /// with `connect` when they first send.
    pub(crate) fn adopting(conn: C, connect: Connect<C>, push: PushHandler) -> Self {
        let driven = Self {
            connections: PerRuntime::new(),
            line: Line::default(),
            connect,
            push,
        };
        driven.adopt(conn);
        driven
    }

    /// Runs `command` on this runtime's connection, made first if it has none, in the order
    /// the commands were asked for.
    pub(crate) async fn send<T, F>(&self, command: impl FnOnce(C) -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.line
            .send(self.connections.current(), || self.live_or_made(), command)
            .await
    }

    /// Drops this runtime's connection, which its driver will not repair, so that the next
    /// command makes a new one; waiters subscribed on it are told to check again and
    /// subscribe on the new one.
    pub(crate) fn forget_current(&self) {
        self.connections.forget_current();
        (self.push)(PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        });
    }

    /// Runs `command` on the connection of every runtime that still runs (unsubscribing a
    /// channel that any of them may have subscribed); the first error, after all have run.
    pub(crate) async fn send_everywhere<F>(&self, command: impl Fn(C) -> F) -> Result<()>
    where
        F: Future<Output = Result<()>>,
    {
        let sent = futures::future::join_all(self.connections.running().into_iter().map(command));
        sent.await.into_iter().collect()
    }

    /// Called only in the line's turn, so one caller makes the connection and those after it
    /// find it made.
    async fn live_or_made(&self) -> Result<C> {
        if let Some(conn) = self.connections.current() {
            return Ok(conn);
        }
        let conn = (self.connect)().await?;
        self.adopt(conn.clone());
        tracing::debug!("redis: connected on a tokio runtime that had no connection yet");
        Ok(conn)
    }

    fn adopt(&self, conn: C) {
        if let Some(life) = self.connections.set_current(conn) {
            tell_subscribers_at_end(&life, &self.push);
        }
    }
}

/// When `life`'s runtime ends, its connection's subscriptions end with it: tells every waiter,
/// so that each checks again and subscribes on its own runtime's connection.
fn tell_subscribers_at_end(life: &RuntimeLife, push: &PushHandler) {
    let push = push.clone();
    life.on_stop(move || {
        push(PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        })
    });
}

/// The callers waiting for their runtime's connection to be made, served one at a time in the order
/// they came: each one's command is handed to the connection (its first poll) before the next
/// one's. Redlock relies on that order: a lock request still in flight when its acquire was
/// decided must reach the node before the release sent after it, or the request would set the
/// key again once the release had deleted it. Callers that come while anyone waits join the line
/// instead of overtaking it.
#[derive(Default)]
pub(crate) struct Line {
    waiting: AtomicUsize,
    turn: tokio::sync::Mutex<()>,
}

impl Line {
    /// Hands `command` the `live` connection at once if nobody waits, else waits for its turn
    /// and hands it the connection `remade` returns (the live one, or one made again).
    pub(crate) async fn send<C, T, F, R>(
        &self,
        live: Option<C>,
        remade: impl FnOnce() -> R,
        command: impl FnOnce(C) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
        R: Future<Output = Result<C>>,
    {
        if self.waiting.load(Ordering::Acquire) == 0
            && let Some(conn) = live
        {
            return command(conn).await;
        }
        // Boxed, as rare: in place it would grow every command's future.
        Box::pin(self.in_order(remade(), command)).await
    }

    /// Waits for its turn, then gets the connection with `conn` and hands it `command`.
    async fn in_order<C, T, F>(
        &self,
        conn: impl Future<Output = Result<C>>,
        command: impl FnOnce(C) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        struct Left<'a>(&'a AtomicUsize);
        impl Drop for Left<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let left = Left(&self.waiting);
        let turn = self.turn.lock().await;
        let mut sending = pin!(command(conn.await?));
        // The first poll hands the command to the connection; the next caller may then go.
        if let Poll::Ready(done) = futures::poll!(sending.as_mut()) {
            return done;
        }
        drop((turn, left));
        sending.await
    }
}
