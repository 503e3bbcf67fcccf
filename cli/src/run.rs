//! `dlock run`: run a command while holding a lock, like flock(1) across machines, or one of N
//! permits of a semaphore (`--permits N`: at most N such commands run at once).

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{BackendArgs, Exit, parse_duration};

/// Arguments of `dlock run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Lease length; the lock is renewed while the command runs (default 30s).
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// How long to wait for the lock (default: without limit). Exit code 75 when it runs out.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Do not wait: exit with code 75 at once if the lock is busy (flock -n).
    #[arg(short = 'n', long, conflicts_with = "wait")]
    no_wait: bool,
    /// Hold one of this many permits instead of the lock: at most this many commands run at once
    /// under the name, on every machine together (every `dlock run` of the name must say the
    /// same number).
    #[arg(long)]
    permits: Option<u32>,
    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_after: Duration,
    /// The lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(super) async fn run(args: RunArgs) -> Result<Exit, LockError> {
    let name = LockName::new(&args.name)?;
    args.backend.require_given("run")?;
    let mut opts = match &args.backend.config {
        Some(path) => dlock::Config::from_file(path)?.lock_options(),
        None => LockOptions::new(),
    };
    if let Some(ttl) = args.ttl {
        opts = opts.with_ttl(ttl);
    }
    if let Some(wait) = args.wait {
        opts = opts.with_wait_timeout(wait);
    }
    opts.validate()?;
    // Installed before the wait, so that a signal at any point from here on is ours to handle:
    // once a handler exists, the signal no longer kills the process.
    let mut signals = Signals::install();
    let waited = tokio::select! {
        waited = connect_and_lock(&args, &name, &opts) => waited?,
        signal = signals.next() => {
            // The wait's future is dropped here: its cancellation undoes whatever it started on
            // the server in the background, and `run`'s caller settles that before exiting.
            eprintln!("dlock: interrupted while waiting for lock `{name}`");
            return Ok(Exit::settled(ExitCode::from(128u8.wrapping_add(signal as u8))));
        }
    };
    let Some((_locks, guard)) = waited else {
        match args.permits {
            Some(permits) => eprintln!("dlock: all {permits} permits of `{name}` are taken"),
            None => eprintln!("dlock: lock `{name}` is busy"),
        }
        return Ok(Exit::settled(ExitCode::from(75)));
    };

    let placement = Placement::here();
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("DLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("DLOCK_LOCK_NAME", name.as_str())
        .kill_on_drop(true);
    if let Some(permits) = args.permits {
        command.env("DLOCK_PERMITS", permits.to_string());
    }
    if placement == Placement::OwnGroup {
        command.process_group(0);
    }
    let spawned = command.spawn();
    let child = match spawned {
        Ok(child) => child,
        Err(error) => {
            eprintln!("dlock: cannot start `{}`: {error}", args.command[0]);
            // Released now, not by the dropped guard in the background: the next `dlock run`
            // on this name must find it free, and this one must not exit while still holding it.
            release_after_command(guard, &name).await;
            return Ok(Exit::settled(ExitCode::from(cannot_start_code(&error))));
        }
    };

    let mut command = Running { child, placement };
    match supervise(&mut command, &guard, &mut signals, args.kill_after).await {
        Supervised::Exited(status) => {
            release_after_command(guard, &name).await;
            Ok(Exit::settled(exit_code_of(status)))
        }
        Supervised::Lost(reason) => {
            eprintln!(
                "dlock: lock `{name}` lost while the command ran ({reason}); the command was stopped"
            );
            // Whatever of the lock is left on the server goes now, if the server answers soon;
            // that the release reports the loss again is expected, and dropping the guard
            // instead would warn of a guard never released. The lock is not this process's any
            // more, so a server that stopped answering (the likely cause of the loss) is not
            // waited for: the lock ends with its lease or session.
            let now = tokio::time::Instant::now();
            let give_up = now.checked_add(AFTER_A_LOSS).unwrap_or(now);
            let _ = tokio::time::timeout_at(give_up, guard.release()).await;
            Ok(Exit {
                code: ExitCode::from(74),
                settle_within: give_up.saturating_duration_since(tokio::time::Instant::now()),
            })
        }
    }
}

/// How long a holder that lost its lock still gives, in all, the release of whatever is left of it
/// on the server and the background work of its client, before it exits.
const AFTER_A_LOSS: Duration = Duration::from_millis(500);

/// Connects and takes the lock, or a permit: `None` if `-n` found it busy. The client is
/// returned with the guard so that it outlives it.
async fn connect_and_lock(
    args: &RunArgs,
    name: &LockName,
    opts: &LockOptions,
) -> Result<Option<(Arc<dyn DistributedLock>, LockGuard)>, LockError> {
    let locks = args.backend.connect().await?;
    let guard = match (args.permits, args.no_wait) {
        (None, true) => locks.try_acquire(name, opts).await?,
        (None, false) => Some(locks.acquire(name, opts).await?),
        (Some(permits), true) => locks.try_acquire_permit(name, permits, opts).await?,
        (Some(permits), false) => Some(locks.acquire_permit(name, permits, opts).await?),
    };
    Ok(guard.map(|guard| (locks, guard)))
}

/// Releases the lock the command ran (or was to run) under, reporting a failed release on stderr:
/// the command's outcome, not the release's, decides the exit code.
async fn release_after_command(guard: LockGuard, name: &LockName) {
    if let Err(error) = guard.release().await {
        eprintln!(
            "dlock: releasing `{name}` after the command: {}",
            crate::error_chain(&error)
        );
    }
}

/// The exit code for a command that could not be started, as `env(1)`, `timeout(1)` and shells
/// give it: 127 when it was not found, 126 when it was found but could not be run.
fn cannot_start_code(error: &std::io::Error) -> u8 {
    if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

enum Supervised {
    Exited(ExitStatus),
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
struct Signals {
    streams: Vec<(libc::c_int, Signal)>,
}

impl Signals {
    fn install() -> Self {
        Self {
            streams: handled()
                .into_iter()
                .filter_map(|(kind, number)| signal(kind).ok().map(|stream| (number, stream)))
                .collect(),
        }
    }

    /// The number of the next handled signal to arrive.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal that arrives while nobody awaits it is kept for the next call.
    async fn next(&mut self) -> libc::c_int {
        std::future::poll_fn(|cx| {
            for (number, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*number);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Where the command runs, as to process groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
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
    fn here() -> Self {
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
struct Running {
    child: Child,
    placement: Placement,
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
async fn supervise(
    command: &mut Running,
    guard: &LockGuard,
    signals: &mut Signals,
    kill_after: Duration,
) -> Supervised {
    loop {
        tokio::select! {
            status = command.child.wait() => {
                return Supervised::Exited(status.unwrap_or_else(|_| ExitStatus::from_raw(1 << 8)));
            }
            reason = guard.lost() => {
                command.stop(kill_after).await;
                return Supervised::Lost(reason);
            }
            signal = signals.next() => command.forward(signal),
        }
    }
}

fn exit_code_of(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from(128u8.wrapping_add(signal as u8)),
        (None, None) => ExitCode::FAILURE,
    }
}
