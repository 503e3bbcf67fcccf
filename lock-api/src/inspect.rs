//! Holder inspection: what the server says about one lock name right now.

use std::time::Duration;

use crate::error::{LockError, Result};
use crate::name::LockName;
use crate::raw::RawLock;
use crate::token::FencingToken;

/// What a backend's server says about one lock name at the moment it was asked
/// ([`DistributedLock::inspect`](crate::DistributedLock::inspect)): whether it is held, the
/// holder's fencing token and remaining lease, and how many wait.
///
/// It is a snapshot for operators and dashboards (`dlock status`), not a way to decide whether
/// to acquire: the answer may be stale by the time it arrives. Each field the backend cannot know
/// is `None`, never a guess; each backend's crate docs list what it reports.
///
/// Not to be confused with [`LockStatus`](crate::LockStatus), which is what a *guard* knows of its
/// own hold.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// Someone holds the lock.
    pub held: bool,
    /// The holder's fencing token; `None` when free, or where the server keeps no token per name
    /// (Postgres: one sequence for every name) or fencing is off.
    pub token: Option<FencingToken>,
    /// How long the holder's lease has left on the server; `None` when free, or where the lease
    /// is a session with no time to live (MySQL, Postgres).
    pub remaining: Option<Duration>,
    /// How many wait for the lock, as the server counts them; `None` where the server cannot
    /// tell (Redlock has no queue). On the SQL backends a client queues its own waiters for a name
    /// and only its first waits at the server, so this counts waiting clients, not tasks.
    pub waiters: Option<usize>,
    /// The holder as the server names it, opaque: the owner value (Redis, Redlock), the
    /// connection id (MySQL), the backend pid (Postgres), the lease id (etcd). While readers
    /// share the name, one of them (Redis names the readers' shared mark, `#readers`).
    pub holder: Option<String>,
    /// How many readers share the name now
    /// ([`read`](crate::DistributedLock::read)): 0 when a writer holds it or it is free; `None`
    /// where the backend has no readers or the server cannot tell. While readers hold, `held`
    /// is true, and the token, lease and holder are those of one of them.
    pub readers: Option<usize>,
    /// How many of the [`waiters`](Self::waiters) wait to read; the others wait to write (to
    /// take the lock). `None` where the backend has no readers or the server cannot tell.
    pub waiting_readers: Option<usize>,
}

impl Inspection {
    /// A free lock with `waiters` waiting (a lock between a release and its next grant may be
    /// free with waiters).
    pub fn free(waiters: Option<usize>) -> Self {
        Self {
            held: false,
            token: None,
            remaining: None,
            waiters,
            holder: None,
            readers: None,
            waiting_readers: None,
        }
    }

    /// A held lock whose holder has fencing `token`, if the server knows it; the rest unknown
    /// until set with the `with_*` methods.
    pub fn held(token: Option<FencingToken>) -> Self {
        Self {
            held: true,
            token,
            remaining: None,
            waiters: None,
            holder: None,
            readers: None,
            waiting_readers: None,
        }
    }

    /// With the holder's remaining lease.
    #[must_use]
    pub fn with_remaining(mut self, remaining: Duration) -> Self {
        self.remaining = Some(remaining);
        self
    }

    /// With the number of waiters.
    #[must_use]
    pub fn with_waiters(mut self, waiters: usize) -> Self {
        self.waiters = Some(waiters);
        self
    }

    /// With how many readers share the name now, and how many of its waiters wait to read.
    #[must_use]
    pub fn with_readers(mut self, readers: usize, waiting_readers: usize) -> Self {
        self.readers = Some(readers);
        self.waiting_readers = Some(waiting_readers);
        self
    }

    /// With the holder's identity as the server names it.
    #[must_use]
    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }
}

/// The error of a backend that cannot inspect.
pub(crate) fn unsupported(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        operation: "holder inspection",
    }
}

/// [`DistributedLock::inspect`](crate::DistributedLock::inspect) for a [`RawLock`]: refused with
/// [`LockError::Unsupported`] before any network call when the backend's capabilities say it
/// cannot inspect, else the backend's [`RawLock::inspect`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn inspect<B: RawLock + ?Sized>(backend: &B, name: &LockName) -> Result<Inspection> {
    if !backend.capabilities().inspect {
        return Err(unsupported(backend.backend()));
    }
    backend.holdings().check_open(backend.backend())?;
    backend.inspect(name).await
}
