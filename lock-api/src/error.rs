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
/// `Ok(None)` when someone else holds the lock. Driver errors are boxed in `source`, so no
/// driver type appears here; [`LockError::source_as`] finds one by type.
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
    /// The client was closed ([`close`](crate::DistributedLock::close)): it takes no new locks
    /// and waits for none.
    #[error("the {backend} client is closed")]
    Closed {
        /// The backend tag.
        backend: &'static str,
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
/// its timeout: [`LockError::source_as`] finds it, to tell a slow server from an unreachable one.
#[derive(Debug, thiserror::Error)]
#[error("no reply within {after:?}")]
#[non_exhaustive]
pub struct CommandTimeout {
    /// The timeout that passed.
    pub after: Duration,
}

/// The source of an [`LockError::Unavailable`] or [`LockError::Backend`] met while connecting:
/// names where the client was connecting to (a URL with its password hidden), with the driver's
/// error as its own source.
#[derive(Debug, thiserror::Error)]
#[error("connecting to {target}")]
#[non_exhaustive]
pub struct Connecting {
    /// Where the client was connecting to.
    pub target: String,
    /// What went wrong.
    #[source]
    pub source: BoxError,
}

/// A plain message as an error source, for failures a backend describes in words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

/// A driver error as a [`LockError`]'s source: shows the driver's message, and hides the causes
/// that message already contains. Many drivers print their cause *and* return it from
/// `source()`, so every chained printer (`{:#}` in anyhow, `tracing`'s error chains, the CLI)
/// said it twice: `redis unavailable: Connection refused (os error 111): Connection refused
/// (os error 111)`.
#[derive(Debug)]
struct DriverError(BoxError);

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl StdError for DriverError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        let shown = self.0.to_string();
        let mut next = self.0.source();
        while let Some(cause) = next {
            if !shown.contains(&cause.to_string()) {
                return Some(cause);
            }
            next = cause.source();
        }
        None
    }
}

/// `error` and its causes on one line, `: `-separated, as the CLI and logs print them. With a
/// [`LockError`] each cause shows once (its driver error's repeats are hidden).
pub fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `error` as a source: wrapped when it has causes of its own (see [`DriverError`]).
fn as_source(error: BoxError) -> BoxError {
    if error.source().is_some() {
        Box::new(DriverError(error))
    } else {
        error
    }
}

impl LockError {
    /// The first of this error's causes that is a `T` (a driver's error type, a
    /// [`CommandTimeout`]), including the causes a chained printer is not shown because the
    /// driver's message already says them.
    pub fn source_as<T: StdError + 'static>(&self) -> Option<&T> {
        let mut next = StdError::source(self);
        while let Some(cause) = next {
            if let Some(found) = cause.downcast_ref::<T>() {
                return Some(found);
            }
            next = match cause.downcast_ref::<DriverError>() {
                Some(driver) => {
                    let inner: &(dyn StdError + 'static) = &*driver.0;
                    if let Some(found) = inner.downcast_ref::<T>() {
                        return Some(found);
                    }
                    inner.source()
                }
                None => cause.source(),
            };
        }
        None
    }

    /// An [`Unavailable`](LockError::Unavailable) error for a command that got no reply within
    /// `after`; its source is a [`CommandTimeout`].
    pub fn command_timeout(backend: &'static str, after: Duration) -> Self {
        Self::unavailable(backend, CommandTimeout { after })
    }

    /// This error, if it is [`Unavailable`](LockError::Unavailable) or
    /// [`Backend`](LockError::Backend), with [`Connecting`] naming `target` put before its
    /// cause: `postgres unavailable: connecting to postgres://app@db/shop: Connection refused`.
    /// Other errors already say what is wrong without a server, and come back unchanged.
    #[must_use]
    pub fn connecting_to(self, target: impl Into<String>) -> Self {
        let wrap = |source: BoxError| -> BoxError {
            Box::new(Connecting {
                target: target.into(),
                source,
            })
        };
        match self {
            Self::Unavailable { backend, source } => Self::Unavailable {
                backend,
                source: wrap(source),
            },
            Self::Backend { backend, source } => Self::Backend {
                backend,
                source: wrap(source),
            },
            other => other,
        }
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
            source: as_source(source.into()),
        }
    }

    /// Builds a [`Backend`](LockError::Backend) error from any driver error.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            backend,
            source: as_source(source.into()),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver error that prints its cause and also returns it, as many do.
    #[derive(Debug)]
    struct Chatty(std::io::Error);

    impl std::fmt::Display for Chatty {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "driver failed: {}", self.0)
        }
    }

    impl StdError for Chatty {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_the_driver_already_printed_is_said_once_and_still_found() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = LockError::unavailable("test", Chatty(refused));
        assert_eq!(
            error_chain(&error),
            "test unavailable: driver failed: refused"
        );
        assert!(error.source_as::<Chatty>().is_some());
        let io = error
            .source_as::<std::io::Error>()
            .expect("the hidden cause");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn a_cause_not_in_the_message_stays_in_the_chain() {
        let timeout = LockError::command_timeout("test", Duration::from_secs(1));
        assert_eq!(
            error_chain(&timeout),
            "test unavailable: no reply within 1s"
        );
        assert!(timeout.source_as::<CommandTimeout>().is_some());
    }

    #[test]
    fn connecting_to_names_the_target_and_keeps_every_cause() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = LockError::unavailable("test", Chatty(refused)).connecting_to("test://h");
        assert_eq!(
            error_chain(&error),
            "test unavailable: connecting to test://h: driver failed: refused"
        );
        assert_eq!(
            error.source_as::<Connecting>().map(|c| c.target.as_str()),
            Some("test://h")
        );
        assert!(error.source_as::<std::io::Error>().is_some());
        let timeout = LockError::command_timeout("test", Duration::from_secs(1)).connecting_to("t");
        assert!(timeout.source_as::<CommandTimeout>().is_some());
        let config = LockError::Config {
            backend: "test",
            reason: "bad".into(),
        };
        assert!(matches!(
            config.connecting_to("t"),
            LockError::Config { reason, .. } if reason == "bad"
        ));
    }
}
