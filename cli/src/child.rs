//! A command run under a lock or a leadership: started in its own process group (or the
//! terminal's foreground), the handled signals forwarded to it, stopped (SIGTERM, then SIGKILL)
//! when the lock is lost, and its exit status turned into dlock's exit code. Shared by
//! `dlock run` and `dlock elect`.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::task::Poll;
use std::time::Duration;

use tokio::process::Child;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// The exit code for a command that could not be started, as `env(1)`, `timeout(1)` and shells
/// give it: 127 when it was not found, 126 when it was found but could not be run.
pub(crate) fn cannot_start_code(error: &std::io::Error) -> u8 {
    if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

pub(crate) enum Supervised {
    /// The command ended by itself, or by a signal dlock forwarded.
    Exited(ExitStatus),
    /// The lock was lost; the command was stopped.
    Lost(dlock_api::LostReason),
}

/// The signals dlock handles from the wait on. Left at their defaults they would kill dlock and
/// leave the command running on without the lock: SIGINT, SIGQUIT and SIGHUP from the terminal
/// reach its whole foreground group, whether the command is in it or not.
fn handled() -> [(SignalKind, libc::c_int); 4] {
    [
        (SignalKind::interrupt(), libc::SIGINT),
        (SignalKind::terminate(), libc::SIGTERM),
        (SignalKind::hangup(), libc::SIGHUP),
        (SignalKind::quit(), libc::SIGQUIT),
    ]
}

/// The [`handled`] signals: an interrupted wait ends cleanly, and a running command gets the
/// signal instead of dlock.
pub(crate) struct Signals {
    streams: Vec<(libc::c_int, Signal)>,
    /// The last signal that arrived, if any did.
    received: Option<libc::c_int>,
}

impl Signals {
    pub(crate) fn install() -> Self {
        Self {
            streams: handled()
                .into_iter()
                .filter_map(|(kind, number)| signal(kind).ok().map(|stream| (number, stream)))
                .collect(),
            received: None,
        }
    }

    /// The number of the next handled signal to arrive.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while nobody awaits it is kept for the next call.
    pub(crate) async fn next(&mut self) -> libc::c_int {
        let number = std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*number);
                }
            }
            Poll::Pending
        })
        .await;
        self.received = Some(number);
        number
    }

    /// Whether a handled signal has arrived since [`install`](Self::install): a service told to
    /// stop does not stand for election again.
    pub(crate) fn received(&self) -> Option<libc::c_int> {
        self.received
    }
}

/// Where the command runs, as to process groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// In a process group of its own, so that stopping it reaches everything it started, and a
    /// signal for dlock reaches it only as dlock forwards it.
    OwnGroup,
    /// In dlock's process group, the foreground of the terminal dlock runs in (a job of an
    /// interactive shell): as under flock(1), the command can read the terminal (a background
    /// group reading it would be stopped), and the terminal's Ctrl-C, Ctrl-\ and hang-up reach it
    /// directly, so dlock forwards only SIGTERM.
    TerminalForeground,
}

impl Placement {
    pub(crate) fn here() -> Self {
        // SAFETY: isatty, tcgetpgrp and getpgrp only read the process's and terminal's state.
        let in_foreground = [0, 1, 2]
            .into_iter()
            .any(|fd| unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() });
        if in_foreground {
            Self::TerminalForeground
        } else {
            Self::OwnGroup
        }
    }
}

/// The command as started.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) placement: Placement,
}

impl Running {
    /// Sends `signal` to the command: to its whole process group (the command and everything it
    /// started) when it has its own, else to the command alone.
    fn signal(&self, signal: libc::c_int) {
        // A pid the kernel gave always fits `pid_t`.
        let Some(pid) = self
            .child
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
        else {
            return;
        };
        let target = match self.placement {
            Placement::OwnGroup => pid.saturating_neg(),
            Placement::TerminalForeground => pid,
        };
        // SAFETY: kill(2) on a child we have not reaped yet (or the group we created for it) has
        // no memory effects.
        unsafe {
            libc::kill(target, signal);
        }
    }

    /// Passes on a signal dlock received, unless the terminal sent it to the command already.
    fn forward(&self, signal: libc::c_int) {
        if self.placement == Placement::OwnGroup || signal == libc::SIGTERM {
            self.signal(signal);
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    async fn stop(&mut self, grace: Duration) {
        self.signal(libc::SIGTERM);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.signal(libc::SIGKILL);
            let _ = self.child.kill().await;
        }
    }
}

/// Waits for the command, forwarding the handled signals to it; stops it if the lock is lost.
pub(crate) async fn supervise(
    command: &mut Running,
    lost: impl std::future::Future<Output = dlock_api::LostReason>,
    signals: &mut Signals,
    kill_after: Duration,
) -> Supervised {
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = command.child.wait() => {
                return Supervised::Exited(status.unwrap_or_else(|_| ExitStatus::from_raw(1 << 8)));
            }
            reason = &mut lost => {
                command.stop(kill_after).await;
                return Supervised::Lost(reason);
            }
            signal = signals.next() => command.forward(signal),
        }
    }
}

pub(crate) fn exit_code_of(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => signalled(signal),
        (None, None) => ExitCode::FAILURE,
    }
}

/// 128 + the signal's number, as a shell reports a command the signal ended.
pub(crate) fn signalled(signal: libc::c_int) -> ExitCode {
    ExitCode::from(128u8.wrapping_add(signal as u8))
}

/// How long a holder that lost its lock still gives, in all, the release of whatever is left of
/// it on the server and the background work of its client, before it exits.
const AFTER_A_LOSS: Duration = Duration::from_millis(500);

/// Lets go of whatever is left on the server of a lost hold (`release`), if the server answers
/// soon; returns how long of [`AFTER_A_LOSS`] is left for the client's background work. That the
/// release reports the loss again is expected, and dropping the hold instead would warn of a
/// guard never released. The hold is not this process's any more, so a server that stopped
/// answering (the likely cause of the loss) is not waited for: the lock ends with its lease or
/// session.
pub(crate) async fn let_go_after_a_loss<E>(
    release: impl std::future::Future<Output = Result<(), E>>,
) -> Duration {
    let now = tokio::time::Instant::now();
    let give_up = now.checked_add(AFTER_A_LOSS).unwrap_or(now);
    let _ = tokio::time::timeout_at(give_up, release).await;
    give_up.saturating_duration_since(tokio::time::Instant::now())
}
