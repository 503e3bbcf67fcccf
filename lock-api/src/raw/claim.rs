//! [`Claim`]: what one acquire asks of a name, as a backend's grant path reads it.

use crate::options::LockOptions;

/// What an acquire asks of a name: one of `limit` places (a lock has one, a semaphore its
/// number of permits), or a reader's shared place (`shared`, with the limit of the lock it
/// shares: 1). A backend's [`RawLock::try_grant`](super::RawLock::try_grant) and
/// [`wait_grant`](super::RawLock::wait_grant) receive the limit and the options; a backend
/// that keeps both kinds in one queue makes one of these with [`Claim::new`] and decides on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Claim {
    /// How many may hold the name at once.
    pub limit: u32,
    /// A reader's hold: shared with other readers, never with a writer (the name's lock), and
    /// never granted past a writer that waits ahead.
    pub shared: bool,
}

impl Claim {
    /// A lock's claim: the one place of its name.
    pub const LOCK: Self = Self {
        limit: 1,
        shared: false,
    };

    /// The claim of an acquire of one of `limit` places with `options`: a reader's when they
    /// say so ([`LockOptions::is_shared`]).
    pub fn new(limit: u32, options: &LockOptions) -> Self {
        Self {
            limit,
            shared: options.is_shared(),
        }
    }
}
