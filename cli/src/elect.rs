//! `dlock elect`: run a command while this process leads an election, with its term in the
//! environment; stop it when leadership is lost, and (with `--again`) stand again.

use std::process::ExitCode;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};
use tokio::process::Command;

use crate::child::{
    Placement, Running, Signals, Supervised, cannot_start_code, exit_code_of, let_go_after_a_loss,
    signalled, supervise,
};
use crate::{BackendArgs, Exit, parse_duration};

/// Arguments of `dlock elect`.
#[derive(Debug, clap::Args)]
pub struct ElectArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// The value this candidate publishes while it leads, for `dlock leader` and observers
    /// (default: HOST:PID).
    #[arg(long)]
    value: Option<String>,
    /// Lease length; renewed while leading (default 30s). A crashed leader's term ends within it.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// How long to wait to lead (default: without limit). Exit code 75 when it runs out.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Stay a candidate: when the command ends or leadership is lost, campaign again (until a
    /// signal stops dlock).
    #[arg(long)]
    again: bool,
    /// After lost leadership, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    kill_after: Duration,
    /// The election's name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// How long a candidate whose server failed waits before it campaigns again (`--again`).
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

pub(super) async fn elect(args: ElectArgs) -> Result<Exit, LockError> {
    let name = LockName::new(&args.name)?;
    args.backend.require_given("elect")?;
    let opts = args.backend.lock_options(args.ttl, args.wait)?;
    let value = args.value.clone().unwrap_or_else(default_value);
    if value.len() > dlock_api::MAX_LEADER_VALUE {
        return Err(LockError::invalid(
            "value",
            format!("at most {} bytes", dlock_api::MAX_LEADER_VALUE),
        ));
    }
    let mut signals = Signals::install();
    let locks = tokio::select! {
        locks = args.backend.connect() => locks?,
        signal = signals.next() => return Ok(interrupted(signal)),
    };
    let exit = stand(&args, &*locks, &name, &value, &opts, &mut signals).await;
    // Ends the candidate's lease or session now, not at its TTL.
    crate::close_client(&*locks).await;
    exit
}

/// Campaigns and runs the command while leading, again after each term with `--again`.
async fn stand(
    args: &ElectArgs,
    locks: &dyn DistributedLock,
    name: &LockName,
    value: &str,
    opts: &LockOptions,
    signals: &mut Signals,
) -> Result<Exit, LockError> {
    loop {
        let campaign = tokio::select! {
            campaign = locks.campaign(name, value.as_bytes(), opts) => campaign,
            signal = signals.next() => {
                eprintln!("dlock: interrupted while campaigning for `{name}`");
                return Ok(interrupted(signal));
            }
        };
        let leadership = match campaign {
            Ok(leadership) => leadership,
            Err(LockError::Timeout { .. }) => {
                eprintln!("dlock: `{name}` has another leader");
                return Ok(Exit::settled(ExitCode::from(75)));
            }
            Err(error @ (LockError::Unavailable { .. } | LockError::Backend { .. }))
                if args.again =>
            {
                eprintln!(
                    "dlock: campaign for `{name}` failed ({}); standing again in {RETRY_AFTER_FAILURE:?}",
                    crate::error_chain(&error)
                );
                tokio::select! {
                    () = tokio::time::sleep(RETRY_AFTER_FAILURE) => continue,
                    signal = signals.next() => return Ok(interrupted(signal)),
                }
            }
            Err(error) => return Err(error),
        };
        let term = leadership.term().to_string();
        eprintln!("dlock: leading `{name}` in term {term}");
        let placement = Placement::here();
        let mut command = Command::new(&args.command[0]);
        command
            .args(&args.command[1..])
            .env("DLOCK_TERM", &term)
            .env("DLOCK_FENCING_TOKEN", &term)
            .env("DLOCK_LOCK_NAME", name.as_str())
            .env("DLOCK_LEADER_VALUE", value)
            .kill_on_drop(true);
        if placement == Placement::OwnGroup {
            command.process_group(0);
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                eprintln!("dlock: cannot start `{}`: {error}", args.command[0]);
                resign(leadership, name).await;
                return Ok(Exit::settled(ExitCode::from(cannot_start_code(&error))));
            }
        };
        let mut running = Running { child, placement };
        match supervise(&mut running, leadership.lost(), signals, args.kill_after).await {
            Supervised::Exited(status) => {
                resign(leadership, name).await;
                if !args.again || signals.received().is_some() {
                    return Ok(Exit::settled(exit_code_of(status)));
                }
            }
            Supervised::Lost(reason) => {
                eprintln!(
                    "dlock: leadership of `{name}` lost in term {term} ({reason}); the command was stopped"
                );
                let_go_after_a_loss(leadership.resign()).await;
                if !args.again || signals.received().is_some() {
                    return Ok(Exit::settled(ExitCode::from(74)));
                }
            }
        }
    }
}

/// Resigns after the command, reporting a failed resignation on stderr: the command's outcome
/// decides the exit code.
async fn resign(leadership: dlock_api::Leadership, name: &LockName) {
    if let Err(error) = leadership.resign().await {
        eprintln!(
            "dlock: resigning `{name}` after the command: {}",
            crate::error_chain(&error)
        );
    }
}

fn interrupted(signal: libc::c_int) -> Exit {
    Exit::settled(signalled(signal))
}

/// `HOST:PID`: which machine and process leads, for whoever reads the leader.
fn default_value() -> String {
    let mut host = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let named = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0;
    let host = if named {
        let end = host.iter().position(|b| *b == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        "unknown-host".to_owned()
    };
    format!("{host}:{}", std::process::id())
}
