//! What a backend can and cannot promise.

use std::time::Duration;

use crate::error::{LockError, Result};
use crate::options::LockOptions;

/// What a backend promises, beyond the contract every backend keeps.
///
/// The conformance suite checks the claims it can observe: `fifo` (waiters served in arrival
/// order; only with `inspect`, which the case needs to start each waiter once the server
/// counts the one before it), `wake_on_release` (a waiter let in on release, with a retry
/// policy that would poll too late: a backend that polls on a schedule of its own instead of
/// the options' retry policy is not caught), `lost_signal` and `takeover_signal` (a holder
/// killed on the server, where the harness can kill one), `extend`, `inspect` and the lease model (their own cases);
/// cases a backend's claims rule out show as ignored, with the reason.
///
/// Naming rule: plain nouns for features (`extend`, `fifo`), `max_*` for limits. Backends build it
/// with struct-update syntax from the base of their lease model
/// (`Capabilities { fifo: true, ..Capabilities::TTL_LEASE }`), which is why it is not
/// `#[non_exhaustive]`: new fields arrive in minor releases with a `false` / `None` default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// How far fencing tokens can be trusted.
    pub fencing: Fencing,
    /// What ends the lock when the holder vanishes.
    pub lease: LeaseKind,
    /// [`LockGuard::extend`](crate::LockGuard::extend) and automatic renewal work.
    pub extend: bool,
    /// Waiters acquire in the order they started waiting.
    pub fifo: bool,
    /// Waiters are woken by the server when the lock is released (no poll interval).
    pub wake_on_release: bool,
    /// The guard's [`lost`](crate::LockGuard::lost) signal fires on loss the backend can detect
    /// (expiry, failed renewal, closed session), not only at the local TTL deadline.
    pub lost_signal: bool,
    /// The guard's [`lost`](crate::LockGuard::lost) signal fires as the lock passes to another
    /// client without its holder's release (its key expired unnoticed or was deleted, its
    /// session was killed), not at the holder's next renewal: two guards do not both say
    /// `is_held()` for longer than the server's message takes to arrive. Where it is `false`,
    /// the holder learns at its next renewal (a third of the TTL) or its deadline.
    pub takeover_signal: bool,
    /// A held lock survives the failover of a server (a quorum or consensus system).
    pub survives_failover: bool,
    /// One client can hold the same name twice. No dlock backend is: a second acquire by the same
    /// client waits like any other client.
    pub reentrant: bool,
    /// [`DistributedLock::inspect`](crate::DistributedLock::inspect) answers who holds a name,
    /// with what token and lease left, and how many wait (each backend documents which of these
    /// its server can tell).
    pub inspect: bool,
    /// The longest name the backend keeps readable before mapping it to a digest key, if limited.
    pub max_name_bytes: Option<usize>,
    /// The longest lease the backend accepts, if limited.
    pub max_ttl: Option<Duration>,
    /// The shortest lease the backend accepts, if limited (Redlock: a round over every node and
    /// its drift allowance must still leave some validity). Shorter TTLs are refused before any
    /// network call.
    pub min_ttl: Option<Duration>,
    /// How much later than its TTL a lock whose holder vanished may still be held on the server:
    /// zero where the server expires a key at its TTL (Redis), more where it rounds a lease up or
    /// expires leases on a sweep (etcd: whole seconds, a sweep every 500 ms). A session lease
    /// ends with its session instead, so it has none.
    pub expiry_lag: Duration,
    /// The most permits a semaphore of this backend can have
    /// ([`DistributedLock::acquire_permit`](crate::DistributedLock::acquire_permit)); `0` where
    /// it has no semaphores.
    pub max_permits: u32,
    /// The server keeps one limit per name: while a name is held, an acquire with another
    /// number of permits (a lock being a semaphore of one) is refused with
    /// [`LockError::InvalidArgument`] naming both numbers. Where it is `false` (MySQL, whose
    /// named locks have no shared mode to keep a limit in), a semaphore is its name **and** its
    /// number: `("backups", 3)`, `("backups", 4)` and the lock `"backups"` are three separate
    /// things that do not see each other, each keeping its own limit.
    pub one_limit_per_name: bool,
    /// Leader election ([`DistributedLock::campaign`](crate::DistributedLock::campaign),
    /// [`leader`](crate::DistributedLock::leader), [`observe`](crate::DistributedLock::observe)).
    pub elections: bool,
    /// Reader-writer locks ([`DistributedLock::read`](crate::DistributedLock::read)): readers
    /// of a name share it, its lock (the writer) excludes them, and a waiting writer goes
    /// before readers that arrive after it.
    pub reader_writer: bool,
}

/// How far fencing tokens can be trusted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fencing {
    /// No tokens (every guard reports 0).
    #[default]
    None,
    /// Tokens increase, except across a failure the backend documents (e.g. Redis failover).
    BestEffort,
    /// Tokens strictly increase per name, always.
    Strict,
}

/// What ends the lock when the holder vanishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseKind {
    /// A time-to-live on the server (Redis, etcd, memory).
    #[default]
    Ttl,
    /// The holder's session or connection (MySQL, Postgres, ZooKeeper).
    Session,
}

impl Capabilities {
    /// A lease that ends at its TTL, extended by its guard; waiters woken on release, loss
    /// signalled. Without fencing, FIFO order, failover, inspection or limits: a backend names
    /// what it adds, and a backend whose waiters poll sets `wake_on_release: false`.
    pub const TTL_LEASE: Self = Self {
        fencing: Fencing::None,
        lease: LeaseKind::Ttl,
        extend: true,
        fifo: false,
        wake_on_release: true,
        lost_signal: true,
        takeover_signal: false,
        survives_failover: false,
        reentrant: false,
        inspect: false,
        max_name_bytes: None,
        max_ttl: None,
        min_ttl: None,
        expiry_lag: Duration::ZERO,
        max_permits: 0,
        one_limit_per_name: false,
        elections: false,
        reader_writer: false,
    };

    /// A lease that lasts as long as the holder's session, so there is nothing to extend;
    /// waiters woken on release, a lost session signalled. Otherwise as
    /// [`TTL_LEASE`](Self::TTL_LEASE).
    pub const SESSION_LEASE: Self = Self {
        lease: LeaseKind::Session,
        extend: false,
        ..Self::TTL_LEASE
    };

    /// Checks a semaphore's number of permits against these capabilities, before any network
    /// call.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without semaphores; [`LockError::InvalidArgument`]
    /// for no permits, or more than the backend can keep.
    pub fn check_permits(&self, backend: &'static str, permits: u32) -> Result<()> {
        if self.max_permits == 0 {
            return Err(LockError::Unsupported {
                backend,
                operation: "semaphores",
            });
        }
        if permits == 0 {
            return Err(LockError::invalid(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        if permits > self.max_permits {
            return Err(LockError::invalid(
                "permits",
                format!(
                    "{permits} permits is more than {backend}'s limit of {}",
                    self.max_permits
                ),
            ));
        }
        Ok(())
    }

    /// Checks `options` against these capabilities and on their own. Backends call this first,
    /// so bad input fails before any network call (OpenDAL's correctness-check layer).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for options no backend accepts or beyond this backend's
    /// limits; [`LockError::Unsupported`] for renewal on a backend without `extend` where the lease
    /// is a TTL.
    pub fn check(&self, backend: &'static str, options: &LockOptions) -> Result<()> {
        options.validate()?;
        if let Some(min) = self.min_ttl {
            if self.lease == LeaseKind::Ttl && options.ttl() < min {
                return Err(LockError::invalid(
                    "ttl",
                    format!(
                        "{:?} is shorter than {backend}'s minimum of {min:?}",
                        options.ttl()
                    ),
                ));
            }
        }
        if let Some(max) = self.max_ttl {
            if self.lease == LeaseKind::Ttl && options.ttl() > max {
                return Err(LockError::invalid(
                    "ttl",
                    format!(
                        "{:?} is longer than {backend}'s limit of {max:?}",
                        options.ttl()
                    ),
                ));
            }
        }
        if self.lease == LeaseKind::Ttl && !self.extend && options.renewal_interval().is_some() {
            return Err(LockError::Unsupported {
                backend,
                operation: "lease renewal",
            });
        }
        Ok(())
    }
}
