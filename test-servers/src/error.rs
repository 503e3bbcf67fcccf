//! The one error type of the crate.

use std::io;
use std::path::PathBuf;

/// What the fix is when a server binary is missing.
pub const INSTALL_HINT: &str = "run scripts/install-servers (as root) to install the test servers";

/// Why a server could not be started or controlled.
///
/// `Display` is meant to be read in a failing test's output: it names the server, says what to do when it is not
/// installed, and for a failed start shows the command line and the last lines of the server's own log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A binary or file the server needs is not on this machine.
    #[error("{server} is not installed: {missing} not found; {hint}")]
    NotInstalled {
        /// The server kind, e.g. `"redis"`.
        server: &'static str,
        /// The binary or file that was looked for.
        missing: String,
        /// The fix: [`INSTALL_HINT`].
        hint: &'static str,
    },
    /// The server was launched but did not become ready (it exited, or did not answer within the bound).
    #[error(
        "{server} did not start: {reason}\n  command: {command}\n  log: {log}\n  last lines of the log:\n{log_tail}",
        log = log.display()
    )]
    StartFailed {
        /// The server kind, e.g. `"postgres"`.
        server: &'static str,
        /// What went wrong: "exited with status 1", "not ready after 30s", …
        reason: String,
        /// The command line that was run.
        command: String,
        /// The server's log file.
        log: PathBuf,
        /// The last lines of that log, indented.
        log_tail: String,
    },
    /// A helper command run against the server (a setup tool such as `initdb`, or a client such as `psql`) failed.
    #[error("{server}: command failed: {reason}\n  command: {command}\n  output:\n{output}")]
    CommandFailed {
        /// The server kind.
        server: &'static str,
        /// Its exit status, or "timed out after …".
        reason: String,
        /// The command line that was run.
        command: String,
        /// Its standard output and error, indented.
        output: String,
    },
    /// An I/O operation around the server failed (creating its directory, writing its config, spawning it…).
    #[error("{server}: {context}")]
    Io {
        /// The server kind.
        server: &'static str,
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl ServerError {
    pub(crate) fn io(
        server: &'static str,
        context: impl Into<String>,
    ) -> impl FnOnce(io::Error) -> Self {
        let context = context.into();
        move |source| ServerError::Io {
            server,
            context,
            source,
        }
    }

    /// Whether this error says the server is not installed.
    pub fn is_not_installed(&self) -> bool {
        matches!(self, ServerError::NotInstalled { .. })
    }
}

/// The crate's result type.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;
