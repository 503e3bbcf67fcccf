//! The state every guard and waiter of one `Redlock` client shares: its nodes, the wake-up hub of
//! their announcements, the renewal timer and the round counters.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::config::RedlockConfig;
use crate::nodes::Slot;
use crate::wake::Hub;

/// One `Redlock` client's shared state.
pub(crate) struct Inner {
    pub(crate) config: RedlockConfig,
    pub(crate) slots: Vec<Arc<Slot>>,
    pub(crate) hub: Arc<Hub>,
    pub(crate) stats: Counters,
    /// Starts this client's watchdogs when their first renewal comes due.
    pub(crate) timer: dlock_api::raw::GuardTimer,
}

/// How this client's rounds went, for [`RedlockStats`](crate::RedlockStats).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) rounds: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) split_votes: AtomicU64,
    pub(crate) first_in_line_rounds: AtomicU64,
}
