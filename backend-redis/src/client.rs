//! One client's shared parts: its configuration, its multiplexed connection, the scripts and the
//! wake-up hub. The acquire path (`lock.rs`) and the lease (`lease.rs`) both sit on it, and
//! neither imports the other's internals.

use std::sync::Arc;

use dlock_api::raw::GuardTimer;

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
}
