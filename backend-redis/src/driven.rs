//! [`Driven`]: a redis-rs connection together with the runtime whose task drives it, made again
//! on the calling runtime once that one has shut down.
//!
//! redis-rs reads and writes a multiplexed connection in a task of the runtime it was opened
//! on. A client kept beyond that runtime (in a `static` shared by `#[tokio::test]`s, each on a
//! runtime of its own) would otherwise fail its next command ("broken pipe"), and its waiters
//! would wait for messages nobody reads. Locks are keys on the server, so they go on under the
//! new connection: a guard held across the runtime's end still releases.

use std::future::Future;
use std::pin::Pin;
use std::sync::RwLock;

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
    /// Held while connecting again, so that one caller does it and the others take its result.
    remaking: tokio::sync::Mutex<()>,
    connect: Connect<C>,
    push: PushHandler,
}

impl<C: Clone + Send + Sync + 'static> Driven<C> {
    /// Connects with `connect`, on the calling runtime; `push` hears of every new connection.
    pub(crate) async fn connect(connect: Connect<C>, push: PushHandler) -> Result<Self> {
        let conn = connect().await?;
        Ok(Self {
            current: RwLock::new((conn, RuntimeLife::current())),
            remaking: tokio::sync::Mutex::new(()),
            connect,
            push,
        })
    }

    /// The connection: the current one while its runtime runs, else a new one on this runtime.
    pub(crate) async fn get(&self) -> Result<C> {
        match self.live() {
            Some(conn) => Ok(conn),
            // Boxed, as rare: in place it would grow every command's future.
            None => Box::pin(self.remake()).await,
        }
    }

    fn live(&self) -> Option<C> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        match &current.1 {
            Some(life) if life.has_stopped() => None,
            _ => Some(current.0.clone()),
        }
    }

    async fn remake(&self) -> Result<C> {
        let _one = self.remaking.lock().await;
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
