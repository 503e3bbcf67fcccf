//! [`Driven`]: a redis-rs connection together with the runtime whose task drives it, made again
//! on the calling runtime once that one has shut down; and the [`Line`] that keeps commands in
//! the order they were asked for while it is made again.
//!
//! redis-rs reads and writes a multiplexed connection in a task of the runtime it was opened
//! on. A client kept beyond that runtime (in a `static` shared by `#[tokio::test]`s, each on a
//! runtime of its own) would otherwise fail its next command ("broken pipe"), and its waiters
//! would wait for messages nobody reads. Locks are keys on the server, so they go on under the
//! new connection: a guard held across the runtime's end still releases.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use dlock_api::Result;
use dlock_api::raw::RuntimeLife;
use redis::{PushInfo, PushKind};

use crate::conn::PushHandler;

type Connecting<C> = Pin<Box<dyn Future<Output = Result<C>> + Send>>;

/// How a [`Driven`] connection is made (again): the topology's connect, with its config.
pub(crate) type Connect<C> = Box<dyn Fn() -> Connecting<C> + Send + Sync>;

/// A connection and the life of the runtime it was made on.
pub(crate) struct Driven<C> {
    current: RwLock<(C, Option<RuntimeLife>)>,
    line: Line,
    connect: Connect<C>,
    push: PushHandler,
}

impl<C: Clone + Send + Sync + 'static> Driven<C> {
    /// Connects with `connect`, on the calling runtime; `push` hears of every new connection.
    pub(crate) async fn connect(connect: Connect<C>, push: PushHandler) -> Result<Self> {
        let conn = connect().await?;
        Ok(Self {
            current: RwLock::new((conn, RuntimeLife::current())),
            line: Line::default(),
            connect,
            push,
        })
    }

    /// Runs `command` on the connection: the current one while its runtime runs, else a new
    /// one made on this runtime, in the order the commands were asked for.
    pub(crate) async fn send<T, F>(&self, command: impl FnOnce(C) -> F) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.line
            .send(self.live(), || self.live_or_remade(), command)
            .await
    }

    fn live(&self) -> Option<C> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        match &current.1 {
            Some(life) if life.has_stopped() => None,
            _ => Some(current.0.clone()),
        }
    }

    /// Called only in the line's turn, so one caller makes the connection and those after it
    /// find it made.
    async fn live_or_remade(&self) -> Result<C> {
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let conn = (self.connect)().await?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) =
            (conn.clone(), RuntimeLife::current());
        tracing::info!(
            "redis: connected again: the tokio runtime of the last connection shut down"
        );
        // The new connection has no subscriptions: every waiter checks again and re-subscribes.
        (self.push)(PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        });
        Ok(conn)
    }
}

/// The callers waiting for a connection being made again, served one at a time in the order
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
