//! One client's shared parts: its configuration, its multiplexed connection, the scripts and the
//! wake-up hub. The acquire path (`lock.rs`) and the lease (`lease.rs`) both sit on it, and
//! neither imports the other's internals.

use std::sync::Arc;

use dlock_api::raw::{GuardTimer, Holdings};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::scripts::Scripts;
use crate::wake::Wakeups;

pub(crate) struct Inner {
    pub(crate) config: RedisConfig,
    pub(crate) conn: Conn,
    pub(crate) scripts: Scripts,
    pub(crate) hub: Arc<Wakeups>,
    pub(crate) timer: GuardTimer,
    /// The guards this client holds, which `close` releases.
    pub(crate) holdings: Holdings,
    pub(crate) held_by: HeldBy,
    /// The connection the held-by channel is subscribed on, made at the first watch: apart
    /// from the commands' connection, so that a server that drops a subscriber's connection
    /// (an operator's `CLIENT KILL TYPE pubsub`, a pub/sub output limit) drops no command in
    /// flight.
    pub(crate) watch_conn: tokio::sync::OnceCell<Conn>,
}

/// This client's id and the channel its watching holders listen on (`held.rs`).
pub(crate) struct HeldBy {
    /// Random hex digits, new for every client.
    pub(crate) client: String,
    /// `PREFIX:held-by:CLIENT`.
    pub(crate) channel: String,
    /// `PREFIX:held-by:`, for the acquire script to name another client's channel.
    pub(crate) prefix: String,
}

impl HeldBy {
    pub(crate) fn new(key_prefix: &str) -> Self {
        let client = dlock_api::raw::random_owner();
        let prefix = format!("{key_prefix}:held-by:");
        Self {
            channel: format!("{prefix}{client}"),
            client,
            prefix,
        }
    }
}
