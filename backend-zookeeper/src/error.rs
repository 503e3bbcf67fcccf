//! ZooKeeper errors as `LockError`s, and every request under a timeout of its own.

use std::future::Future;
use std::time::Duration;

use dlock_api::LockError;
use zookeeper_client::Error;

use crate::BACKEND;

/// Why a request did not succeed: the server's answer, or none within the timeout.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The client library's error (the server's answer, or a connection or session failure).
    Zk(Error),
    /// No answer within the timeout. The request may still be sent and applied later: the
    /// client library queues requests while disconnected.
    TimedOut(Duration),
}

impl Fail {
    /// Whether the request may have been applied without our hearing of it.
    pub(crate) fn outcome_unknown(&self) -> bool {
        self.task_gone()
            || matches!(
                self,
                Fail::TimedOut(_) | Fail::Zk(Error::ConnectionLoss | Error::Timeout)
            )
    }

    /// Whether the client library's task, which sends requests and reads their answers, is
    /// gone: the runtime it ran on ended (a client shared by runtimes running at once), with
    /// this request in flight or before it was sent. The library then answers with an error of
    /// its own instead of the server's; the session itself may live on.
    pub(crate) fn task_gone(&self) -> bool {
        matches!(self, Fail::Zk(Error::UnexpectedError(why))
            if why.starts_with("BUG: ") || why.starts_with("expect error state"))
    }

    /// Whether the session is over (every ephemeral node of it is gone, or will be).
    pub(crate) fn session_over(&self) -> bool {
        matches!(
            self,
            Fail::Zk(Error::SessionExpired | Error::ClientClosed | Error::AuthFailed)
        )
    }

    pub(crate) fn is(&self, error: &Error) -> bool {
        matches!(self, Fail::Zk(e) if e == error)
    }
}

impl From<Fail> for LockError {
    fn from(fail: Fail) -> Self {
        match fail {
            Fail::TimedOut(after) => LockError::command_timeout(BACKEND, after),
            Fail::Zk(error) => map_err(error),
        }
    }
}

/// Whether `error` is the client library's own report of a server that did not answer on a
/// connection in time (a handshake or a request too slow on a loaded machine): zookeeper-client
/// 0.11 gives it as a custom error, told apart only by its text ("no response from connection
/// in …ms"), not as [`Error::Timeout`].
pub(crate) fn no_response(error: &Error) -> bool {
    matches!(error, Error::Custom(custom) if custom.to_string().starts_with("no response from connection"))
}

/// Whether `error` is the client library's report of a connection that failed under it (reset
/// or refused: a server killed or restarting): zookeeper-client 0.11 gives it as a custom error
/// whose source is the I/O error, not as [`Error::ConnectionLoss`].
pub(crate) fn connection_failed(error: &Error) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut cause = std::error::Error::source(error);
    while let Some(now) = cause {
        let inner = now
            .downcast_ref::<Shared>()
            .map_or(now, |shared| &**shared as _);
        if inner.is::<std::io::Error>() {
            return true;
        }
        cause = inner.source();
    }
    false
}

/// A client library error as a `LockError`: connection and session trouble is `Unavailable`
/// (retrying, on a new session if need be, may succeed), the rest `Backend`.
pub(crate) fn map_err(error: Error) -> LockError {
    match error {
        error if no_response(&error) || connection_failed(&error) => {
            LockError::unavailable(BACKEND, error)
        }
        Error::ConnectionLoss
        | Error::Timeout
        | Error::NoHosts
        | Error::SessionExpired
        | Error::SessionMoved
        | Error::ClientClosed
        | Error::Throttled => LockError::unavailable(BACKEND, error),
        error => LockError::backend(BACKEND, error),
    }
}

/// Runs `request` with a timeout: the client library has none of its own, and queues requests
/// made while it is disconnected.
pub(crate) async fn timed<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, Error>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(Fail::Zk(error)),
        Err(_) => Err(Fail::TimedOut(timeout)),
    }
}
