//! Where a held lock stands ([`LockStatus`]), and why it was lost ([`LostReason`]).

use std::fmt;

use tokio::time::Instant;

/// Where a held lock stands, as far as this client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockStatus {
    /// Held; for a TTL lease, until `valid_until` unless renewed (`None`: a session lease).
    Held {
        /// When the lease ends unless renewed.
        valid_until: Option<Instant>,
    },
    /// The session carrying the lock lost its connection: the server may still hold the lock for
    /// this client, or may already have given it away. Treat it as not held (stop writing) until
    /// it is `Held` again; it is `Lost` with [`LostReason::SessionExpired`] if the session does
    /// not come back by `until`. (ZooKeeper's and Curator's *suspended* state.)
    Suspended {
        /// The last instant the session can come back (last heartbeat + session timeout).
        until: Instant,
    },
    /// Lost for good.
    Lost(LostReason),
}

/// Why a held lock was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease's TTL ran out without renewal.
    Expired,
    /// Renewal kept failing (server unreachable) until the lease's validity ran out.
    RenewalFailed,
    /// The server says someone else holds the lock, or nobody does.
    TakenOver,
    /// The session or connection that held the lock closed (killed, dropped, server restarted).
    SessionClosed,
    /// The session carrying the lock expired: its connection stayed lost past the session
    /// timeout, or the server ended it.
    SessionExpired,
    /// The maximum hold time from [`LockOptions::with_max_hold`](crate::LockOptions::with_max_hold) was reached.
    MaxHoldExceeded,
    /// The client was closed ([`close`](crate::DistributedLock::close)), which released the
    /// lock.
    ClientClosed,
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Expired => "the lease expired",
            Self::RenewalFailed => "renewal failed until the lease expired",
            Self::TakenOver => "the server no longer has this holder",
            Self::SessionClosed => "the session holding the lock closed",
            Self::SessionExpired => "the session holding the lock expired",
            Self::MaxHoldExceeded => "the maximum hold time was reached",
            Self::ClientClosed => "the client was closed",
        })
    }
}
