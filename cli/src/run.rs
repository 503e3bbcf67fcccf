//! `dlock run`: run a command while holding a lock, like flock(1) across machines, one of N
//! permits of a semaphore (`--permits N`: at most N such commands run at once), or a reader's
//! share of a reader-writer lock (`--read`: readers run together; `--write`, the lock, runs
//! alone and goes before readers that come after it).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions, LockSet};
use tokio::process::Command;

use crate::child::{
    Placement, Running, Signals, Supervised, cannot_start_code, exit_code_of, let_go_after_a_loss,
    signalled, supervise,
};
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
    #[arg(long, conflicts_with_all = ["read", "write"])]
    permits: Option<u32>,
    /// Hold a reader's share of the name: commands run with `--read` run together, while no
    /// `--write` (or plain) command holds the name or waits for it (flock -s).
    #[arg(long, conflicts_with = "write")]
    read: bool,
    /// Hold the name as its writer: the lock itself, which every reader and other writer waits
    /// for, and which readers that come after it wait behind (flock -x; the default).
    #[arg(long)]
    write: bool,
    /// After a lost lock, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_after: Duration,
    /// The lock names: every one is taken (sorted, within one wait) before the command starts.
    #[arg(required = true)]
    names: Vec<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub(super) async fn run(args: RunArgs) -> Result<Exit, LockError> {
    let names = args
        .names
        .iter()
        .map(LockName::new)
        .collect::<Result<Vec<_>, _>>()?;
    if args.permits.is_some() && names.len() > 1 {
        return Err(LockError::invalid(
            "--permits",
            "a semaphore's permit is of one name",
        ));
    }
    if args.read && names.len() > 1 {
        return Err(LockError::invalid(
            "--read",
            "a reader's share is of one name",
        ));
    }
    let name = names[0].clone();
    args.backend.require_given("run")?;
    let opts = args.backend.lock_options(args.ttl, args.wait)?;
    // Installed before the wait, so that a signal at any point from here on is ours to handle:
    // once a handler exists, the signal no longer kills the process.
    let mut signals = Signals::install();
    let waited = tokio::select! {
        waited = connect_and_lock(&args, &names, &opts) => waited?,
        signal = signals.next() => {
            // The wait's future is dropped here: its cancellation undoes whatever it started on
            // the server in the background, and `run`'s caller settles that before exiting.
            eprintln!("dlock: interrupted while waiting for lock `{name}`");
            return Ok(Exit::settled(signalled(signal)));
        }
    };
    let Some((locks, held)) = waited else {
        match args.permits {
            Some(permits) => eprintln!("dlock: all {permits} permits of `{name}` are taken"),
            None if args.read => eprintln!("dlock: `{name}` is held or awaited by a writer"),
            None => eprintln!("dlock: lock `{name}` is busy"),
        }
        return Ok(Exit::settled(ExitCode::from(75)));
    };

    let placement = Placement::here();
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env(
            "DLOCK_FENCING_TOKEN",
            held.guards()[0].fencing_token().to_string(),
        )
        .env("DLOCK_LOCK_NAME", held.guards()[0].name().as_str())
        .kill_on_drop(true);
    if names.len() > 1 {
        let tokens: String = held
            .fencing_tokens()
            .iter()
            .map(|(name, token)| format!("{name}={token}\n"))
            .collect();
        command.env("DLOCK_FENCING_TOKENS", tokens);
    }
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
            release_after_command(held, &name).await;
            crate::close_client(&*locks).await;
            return Ok(Exit::settled(ExitCode::from(cannot_start_code(&error))));
        }
    };

    let mut command = Running { child, placement };
    let lost = async { held.lost().await.1 };
    match supervise(&mut command, lost, &mut signals, args.kill_after).await {
        Supervised::Exited(status) => {
            release_after_command(held, &name).await;
            crate::close_client(&*locks).await;
            Ok(Exit::settled(exit_code_of(status)))
        }
        Supervised::Lost(reason) => {
            eprintln!(
                "dlock: lock `{name}` lost while the command ran ({reason}); the command was stopped"
            );
            let settle_within = let_go_after_a_loss(held.release()).await;
            crate::close_client(&*locks).await;
            Ok(Exit {
                code: ExitCode::from(74),
                settle_within,
            })
        }
    }
}

/// Connects and takes the lock (every lock of the names), a permit, or a reader's share: `None`
/// if `-n` found it busy. The client is returned with what it holds so that it outlives it.
async fn connect_and_lock(
    args: &RunArgs,
    names: &[LockName],
    opts: &LockOptions,
) -> Result<Option<(Arc<dyn DistributedLock>, LockSet)>, LockError> {
    let locks = args.backend.connect().await?;
    let name = &names[0];
    let held = match (args.permits, args.no_wait, names.len()) {
        (None, true, _) if args.read => locks.try_read(name, opts).await?.map(LockSet::from),
        (None, false, _) if args.read => Some(locks.read(name, opts).await?.into()),
        (None, true, 1) => locks.try_acquire(name, opts).await?.map(LockSet::from),
        (None, false, 1) => Some(locks.acquire(name, opts).await?.into()),
        (None, true, _) => locks.try_acquire_all(names, opts).await?,
        (None, false, _) => Some(locks.acquire_all(names, opts).await?),
        (Some(permits), true, _) => locks
            .try_acquire_permit(name, permits, opts)
            .await?
            .map(LockSet::from),
        (Some(permits), false, _) => Some(locks.acquire_permit(name, permits, opts).await?.into()),
    };
    Ok(held.map(|held| (locks, held)))
}

/// Releases the lock the command ran (or was to run) under, reporting a failed release on stderr:
/// the command's outcome, not the release's, decides the exit code.
async fn release_after_command(held: LockSet, name: &LockName) {
    if let Err(error) = held.release().await {
        eprintln!(
            "dlock: releasing `{name}` after the command: {}",
            crate::error_chain(&error)
        );
    }
}
