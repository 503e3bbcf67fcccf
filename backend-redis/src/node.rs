//! One Redis node's lock primitives, without the single-node grant queue: the building blocks
//! of multi-node algorithms (Redlock, `dlock-redlock`).
//!
//! Each call is one script, one round trip, bounded by the timeout it is given (Redlock derives
//! a short per-node timeout from the TTL, so one frozen node never stalls an acquire):
//! - [`Node::try_lock`]: `SET lock owner NX PX ttl` and, when set, the next per-name fencing
//!   token (above the last one, and at least the server's clock in microseconds);
//! - [`Node::unlock`]: delete the lock only if `owner` holds it;
//! - [`Node::extend`]: reset the TTL only if `owner` holds it;
//! - [`Node::raise_fence`]: raise the per-name counter to at least a token, so the next token
//!   from this node is above every token the quorum handed out.
//!
//! The grant queue of [`RedisLock`](crate::RedisLock) is deliberately not here: on N independent
//! nodes it would hand the lock to different waiters on different nodes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockName, Result};
use redis::Script;

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::keys::LockKeys;
use crate::scripts::{EXTEND, NODE_ACQUIRE, NODE_RAISE_FENCE, NODE_RELEASE};

/// A connection to one Redis node (or Sentinel-managed primary) and its lock primitives.
pub struct Node {
    config: RedisConfig,
    conn: Conn,
    acquire: Script,
    release: Script,
    extend: Script,
    raise: Script,
}

impl Node {
    /// Connects to the node `config` names.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if it does not answer within
    /// the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        // No subscriptions on a node: its pushes are of no interest.
        let conn = Conn::connect(&config, Arc::new(|_| {})).await?;
        Ok(Self {
            config,
            conn,
            acquire: Script::new(NODE_ACQUIRE),
            release: Script::new(NODE_RELEASE),
            extend: Script::new(EXTEND),
            raise: Script::new(NODE_RAISE_FENCE),
        })
    }

    /// The keys of `name` on this node (under the configured prefix).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(&self.config.prefix, name)
    }

    /// Takes the lock for `owner` for `ttl` if nobody holds it: the new fencing token, or `None`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the node does not answer
    /// within `timeout`; the lock may then be set (release it with [`unlock`](Self::unlock)).
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: a dropped call may have set the lock; undo it with `unlock`.
    pub async fn try_lock(
        &self,
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Option<u64>> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let token: u64 = self
            .conn
            .run_script(
                timeout,
                &self.acquire,
                &[&keys.lock, &keys.fence],
                &[owner, &ttl_ms],
            )
            .await?;
        Ok((token > 0).then_some(token))
    }

    /// Deletes the lock if `owner` holds it; whether it did.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it is owner-checked, so sending it again is harmless.
    pub async fn unlock(&self, keys: &LockKeys, owner: &str, timeout: Duration) -> Result<bool> {
        let deleted: i64 = self
            .conn
            .run_script(timeout, &self.release, &[&keys.lock], &[owner])
            .await?;
        Ok(deleted == 1)
    }

    /// Resets the lock's TTL to `ttl` if `owner` holds it; whether it did.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: the TTL may or may not have been reset.
    pub async fn extend(
        &self,
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<bool> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let extended: i64 = self
            .conn
            .run_script(timeout, &self.extend, &[&keys.lock], &[owner, &ttl_ms])
            .await?;
        Ok(extended == 1)
    }

    /// Raises the name's fence counter to at least `token`; the counter after.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: raising is idempotent.
    pub async fn raise_fence(&self, keys: &LockKeys, token: u64, timeout: Duration) -> Result<u64> {
        self.conn
            .run_script(timeout, &self.raise, &[&keys.fence], &[&token.to_string()])
            .await
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
