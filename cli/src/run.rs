//! `dlock run`: run a command while holding a lock, like flock(1) across machines.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::{BackendArgs, parse_duration};

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
    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_after: Duration,
    /// The lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(super) async fn run(args: RunArgs) -> Result<ExitCode, LockError> {
    let name = LockName::new(&args.name)?;
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
            return Ok(ExitCode::from(128u8.wrapping_add(signal as u8)));
        }
    };
    let Some((_locks, guard)) = waited else {
        eprintln!("dlock: lock `{name}` is busy");
        return Ok(ExitCode::from(75));
    };

    let spawned = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("DLOCK_FENCING_TOKEN", guard.fencing_token().to_string())
        .env("DLOCK_LOCK_NAME", name.as_str())
        .kill_on_drop(true)
        // Its own process group, so that stopping it reaches everything it started.
        .process_group(0)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            eprintln!("dlock: cannot start `{}`: {error}", args.command[0]);
            // Released now, not by the dropped guard in the background: the next `dlock run`
            // on this name must find it free, and this one must not exit while still holding it.
            release_after_command(guard, &name).await;
            return Ok(ExitCode::from(cannot_start_code(&error)));
        }
    };

    match supervise(&mut child, &guard, &mut signals, args.kill_after).await {
        Supervised::Exited(status) => {
            release_after_command(guard, &name).await;
            Ok(exit_code_of(status))
        }
        Supervised::Lost(reason) => {
            eprintln!(
                "dlock: lock `{name}` lost while the command ran ({reason}); the command was stopped"
            );
            Ok(ExitCode::from(74))
        }
    }
}

/// Connects and takes the lock: `None` if `-n` found it busy. The client is returned with the
/// guard so that it outlives it.
async fn connect_and_lock(
    args: &RunArgs,
    name: &LockName,
    opts: &LockOptions,
) -> Result<Option<(Arc<dyn DistributedLock>, LockGuard)>, LockError> {
    let locks = args.backend.connect().await?;
    let guard = if args.no_wait {
        locks.try_acquire(name, opts).await?
    } else {
        Some(locks.acquire(name, opts).await?)
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

/// The signals dlock handles from the wait on. SIGINT, SIGQUIT and SIGHUP reach the terminal's
/// whole foreground group, which the command, in its own group, is not in; left at their
/// defaults they would kill dlock and leave the command running on without the lock.
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

/// Waits for the command, forwarding the handled signals to its process group; stops the group
/// if the lock is lost.
async fn supervise(
    child: &mut Child,
    guard: &LockGuard,
    signals: &mut Signals,
    kill_after: Duration,
) -> Supervised {
    loop {
        tokio::select! {
            status = child.wait() => {
                return Supervised::Exited(status.unwrap_or_else(|_| ExitStatus::from_raw(1 << 8)));
            }
            reason = guard.lost() => {
                stop(child, kill_after).await;
                return Supervised::Lost(reason);
            }
            signal = signals.next() => send_signal(child, signal),
        }
    }
}

/// Sends `signal` to the command's whole process group (the command and everything it started).
fn send_signal(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on the process group we created for a child we have not reaped yet has
        // no memory effects.
        unsafe {
            libc::kill(-(pid as libc::pid_t), signal);
        }
    }
}

/// SIGTERM to the command's process group, then SIGKILL to it after `grace`.
async fn stop(child: &mut Child, grace: Duration) {
    send_signal(child, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        send_signal(child, libc::SIGKILL);
        let _ = child.kill().await;
    }
}

fn exit_code_of(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(code as u8),
        (None, Some(signal)) => ExitCode::from(128u8.wrapping_add(signal as u8)),
        (None, None) => ExitCode::FAILURE,
    }
}
