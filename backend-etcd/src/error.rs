//! etcd errors as `LockError`s: an unreachable member, a member without a leader or a slow
//! answer is `Unavailable` (retryable); refused credentials or an untrusted certificate is
//! `Config` (fixed in the configuration); the rest is `Backend`.

use dlock_api::LockError;
use etcd_client::Error;
use tonic::Code;

use crate::BACKEND;

pub(crate) fn map_err(error: Error) -> LockError {
    let unavailable = is_unavailable(&error);
    let said = InOneSentence::new(error);
    if let Some(config) = to_fix_in_config(&said) {
        return config;
    }
    if unavailable {
        LockError::unavailable(BACKEND, said)
    } else {
        LockError::backend(BACKEND, said)
    }
}

/// Refused credentials or an untrusted certificate as the `Config` error they are: each fails
/// again on every retry, and the fix is in the configuration, not a wait.
pub(crate) fn to_fix_in_config(said: &InOneSentence) -> Option<LockError> {
    let reason = if refused_credentials(&said.error) {
        format!(
            "the server refused the credentials: {said}; check the user and password in the URL"
        )
    } else if said.sentence.contains("invalid peer certificate") {
        format!("TLS refused the server: {said}; check ca_cert and the host name")
    } else {
        return None;
    };
    Some(LockError::Config {
        backend: BACKEND,
        reason,
    })
}

/// The client's error said as one sentence: the gRPC status's message and its deepest cause
/// (`tcp connect error: Connection refused (os error 111)`), where the client's own `Display`
/// prints the status's code description and its transport error's debug dump. The sentence
/// says every cause worth printing, so it has no source a printer would add; the client's error
/// is kept for the code that asks what went wrong ([`error`](Self::error)).
#[derive(Debug)]
pub(crate) struct InOneSentence {
    sentence: String,
    error: Error,
}

impl InOneSentence {
    pub(crate) fn new(error: Error) -> Self {
        let deepest = |first: &(dyn std::error::Error + 'static)| {
            let mut cause = first;
            while let Some(next) = cause.source() {
                cause = next;
            }
            cause.to_string()
        };
        let sentence = match &error {
            Error::GRpcStatus(status) => {
                let message = status.message();
                let message = if message.is_empty() {
                    status.code().description()
                } else {
                    message
                };
                match std::error::Error::source(status).map(deepest) {
                    // The status often repeats its transport's error as its message.
                    Some(cause) if !message.contains(&cause) => format!("{message}: {cause}"),
                    _ => message.to_owned(),
                }
            }
            Error::TransportError(transport) => deepest(transport),
            other => other.to_string(),
        };
        Self { sentence, error }
    }

    /// The client's error.
    pub(crate) fn error(&self) -> &Error {
        &self.error
    }
}

impl std::fmt::Display for InOneSentence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sentence)
    }
}

impl std::error::Error for InOneSentence {}

/// Whether trying again (on another member, or after a pause) may succeed.
pub(crate) fn is_unavailable(error: &Error) -> bool {
    match error {
        Error::TransportError(_) | Error::IoError(_) => true,
        Error::GRpcStatus(status) => {
            matches!(
                status.code(),
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::ResourceExhausted
                    | Code::Cancelled
                    | Code::Unknown
            ) || is_auth_expired(error)
                || status.message().contains("no leader")
                || status.message().contains("leader changed")
                || status.message().contains("timed out")
        }
        Error::WatchError(_) | Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// A wrong password, or none where the cluster requires one.
fn refused_credentials(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status)
        if status.message().contains("authentication failed")
            || status.message().contains("user name is empty"))
}

/// The server no longer knows the lease (revoked, or expired).
pub(crate) fn is_lease_not_found(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status) if status.message().contains("lease not found"))
}

/// An authentication token that expired or was refused: a new stream (or request) gets a new one.
pub(crate) fn is_auth_expired(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status)
        if status.code() == Code::Unauthenticated
            || status.message().contains("invalid auth token")
            || status.message().contains("permission denied"))
}

pub(crate) fn timed_out(after: std::time::Duration) -> LockError {
    LockError::command_timeout(BACKEND, after)
}
