//! The one error type every dlock operation returns.

use std::error::Error as StdError;
use std::time::Duration;

use crate::status::LostReason;
use crate::token::FencingToken;

/// A boxed error from a driver (`redis`, `sqlx`, …), kept out of public signatures.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// `Result` with [`LockError`] as the default error.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// Everything that can go wrong with a lock.
///
/// Contention is not an error: [`try_acquire`](crate::DistributedLock::try_acquire) returns
/// `Ok(None)` when someone else holds the lock. Driver errors are boxed in `source` and reachable
/// through [`std::error::Error::source`] and downcasting, so no driver type appears here.
///
/// Rule for messages: the `#[error]` text never repeats a `#[source]`, so chained printers
/// (`{:#}` in anyhow, `tracing`'s error chains) print each cause once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Bad input (name, TTL, options), rejected before any network call.
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// What was wrong, e.g. `"lock name"` or `"ttl"`.
        what: &'static str,
        /// Why it was rejected.
        reason: String,
    },
    /// A malformed or unsupported configuration (URL, config file, missing feature).
    #[error("{backend} configuration: {reason}")]
    Config {
        /// The backend tag, e.g. `"redis"`, or `"dlock"` when no backend could be picked.
        backend: &'static str,
        /// What is wrong and, where possible, how to fix it.
        reason: String,
    },
    /// `acquire` waited as long as it was allowed to.
    #[error("timed out after {waited:?} waiting for lock `{name}`")]
    Timeout {
        /// The lock name.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// The caller does not hold the lock (any more): someone else does, or nobody.
    #[error("lock `{name}` is not held by this guard")]
    NotHeld {
        /// The lock name.
        name: String,
    },
    /// The lock was lost while held: lease expired, renewal failed, session closed.
    #[error("lock `{name}` was lost: {reason}")]
    Lost {
        /// The lock name.
        name: String,
        /// Why it was lost.
        reason: LostReason,
    },
    /// A protected resource refused a write carrying an older fencing token.
    #[error("stale fencing token {presented} for `{name}`: {highest} was already seen")]
    Fenced {
        /// The resource or lock name the token was checked against.
        name: String,
        /// The token the writer presented.
        presented: FencingToken,
        /// The highest token the resource has accepted.
        highest: FencingToken,
    },
    /// The backend cannot do this (see its [`Capabilities`](crate::Capabilities)).
    #[error("{backend} does not support {operation}")]
    Unsupported {
        /// The backend tag.
        backend: &'static str,
        /// The operation, e.g. `"extend"`.
        operation: &'static str,
    },
    /// The server could not be reached, or did not answer in time. Usually worth retrying.
    #[error("{backend} unavailable")]
    Unavailable {
        /// The backend tag.
        backend: &'static str,
        /// The underlying driver or I/O error.
        #[source]
        source: BoxError,
    },
    /// The server answered with an error, or with something the backend did not expect.
    #[error("{backend} error")]
    Backend {
        /// The backend tag.
        backend: &'static str,
        /// The underlying driver error.
        #[source]
        source: BoxError,
    },
}

/// The source of an [`LockError::Unavailable`] for a command the server did not answer within
/// its timeout: downcast to it to tell a slow server from an unreachable one.
#[derive(Debug, thiserror::Error)]
#[error("no reply within {after:?}")]
#[non_exhaustive]
pub struct CommandTimeout {
    /// The timeout that passed.
    pub after: Duration,
}

/// A plain message as an error source, for failures a backend describes in words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl LockError {
    /// An [`Unavailable`](LockError::Unavailable) error for a command that got no reply within
    /// `after`; its source is a [`CommandTimeout`].
    pub fn command_timeout(backend: &'static str, after: Duration) -> Self {
        Self::unavailable(backend, CommandTimeout { after })
    }

    /// An [`Unavailable`](LockError::Unavailable) error described in words.
    pub fn unavailable_because(backend: &'static str, reason: impl Into<String>) -> Self {
        Self::unavailable(backend, Message(reason.into()))
    }

    /// A [`Backend`](LockError::Backend) error for an answer the backend did not expect,
    /// described in words.
    pub fn unexpected(backend: &'static str, what: impl Into<String>) -> Self {
        Self::backend(backend, Message(what.into()))
    }

    /// Builds an [`InvalidArgument`](LockError::InvalidArgument) error.
    pub fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }

    /// Builds an [`Unavailable`](LockError::Unavailable) error from any driver error.
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            backend,
            source: source.into(),
        }
    }

    /// Builds a [`Backend`](LockError::Backend) error from any driver error.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Whether trying the same call again may succeed: true for [`Unavailable`](LockError::Unavailable)
    /// and [`Timeout`](LockError::Timeout), false for errors that a retry repeats.
    ///
    /// The renewal watchdog uses this: a retryable failure is retried until the lease's validity
    /// runs out; any other failure marks the lock lost at once.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Timeout { .. })
    }
}
