//! # dlock-cli: the `dlock` command
//!
//! The command-line face of [dlock](https://docs.rs/dlock-rs): argument types and the
//! dispatcher the thin `dlock` binary calls. Install it with every backend:
//! `cargo install dlock-cli --features full` (etcd needs `protoc` to build); without features
//! it speaks only `memory://`.
//!
//! - `dlock demo [--backend URL]`: the coupon scenario, 100 workers taking one coupon each from
//!   a shared stock, without a lock (lost updates) and with one (exactly 0 left);
//! - `dlock run --backend URL NAME -- CMD…`: run a command while holding a lock, like `flock(1)`
//!   across machines; the command is stopped if the lock is lost;
//! - `dlock conformance --backend URL [--faults]`: the conformance suite (and the client-side
//!   fault cases) against a deployed backend: a way to certify one's own deployment;
//! - `dlock bench --backend URL [--rounds N]`: acquire/release pairs, contended hand-off and many
//!   names on one client, each against the backend's raw protocol floor (the same operations
//!   with its driver alone) measured in the same run; medians and spreads over N rounds;
//! - `dlock bench --backend URL --scale [held,queue,names] [--plot FILE.svg]`: the cost as the
//!   work grows (many locks held on one client, many waiters on one name, many names used once),
//!   against the raw floor and the server's own counters, with the curves drawn as SVG;
//! - `dlock elect --backend URL [--value V] [--again] NAME -- CMD…`: run a command while this
//!   process leads the election `NAME`, with `DLOCK_TERM` (also `DLOCK_FENCING_TOKEN`, the same
//!   number) in its environment; the command is stopped when leadership is lost (exit 74), and
//!   `--again` stands again after it ends (a service that stays a candidate);
//! - `dlock leader --backend URL NAME` prints the leader's term and value; `dlock observe
//!   --backend URL NAME` prints a line per change (`--json`: one object per line);
//! - `dlock status --backend URL NAME…`: who holds each name, with its fencing token, the lease
//!   it has left and how many wait, as the server says (`--json`; `--watch` refreshes). Every
//!   built-in backend can tell; a backend that cannot (one without
//!   [`Capabilities::inspect`](dlock_api::Capabilities::inspect)) is named, with exit code 64.
//!
//! The backend is a URL (`--backend`, or `DLOCK_URL`) or a TOML config file (`--config`,
//! `DLOCK_CONFIG`), as [`dlock::connect`] and [`dlock::Config`] take them.
//!
//! Exit codes follow sysexits(3) where one fits: 0 success; the command's own status for
//! `dlock run`; 1 a conformance case failed; 2 a command line the parser rejects (an unknown
//! flag, a missing argument); 64 an invalid value or configuration (a bad lock name, URL or
//! config file; also `dlock status` on a backend that cannot inspect); 69 backend unavailable;
//! 74 the lock was lost while the command ran; 75 the lock was busy (timed out);
//! 127 (not found) or 126 (not runnable) when `dlock run` cannot start the command, as `env(1)` exits;
//! 128 + the signal's number (130 for Ctrl-C) when SIGINT, SIGTERM, SIGHUP or SIGQUIT ended
//! `dlock run`'s wait for the lock (its place in the queue is given up before it exits). Every command lets background releases finish before it exits.
// Bad input must never panic: arithmetic on instants, durations and counters from the command
// line is checked or saturating (deadlines go through `dlock_api::raw::time`).
#![warn(clippy::arithmetic_side_effects)]

mod bench;
mod child;
mod conformance;
mod contend;
mod demo;
mod elect;
mod flood;
mod floor;
mod leader;
mod run;
mod status;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use dlock_api::{DistributedLock, LockError};

pub use bench::BenchArgs;
pub use conformance::{ConformanceArgs, run_worker_if_asked};
pub use demo::DemoArgs;
pub use elect::ElectArgs;
pub use leader::{LeaderArgs, ObserveArgs};
pub use run::RunArgs;
pub use status::StatusArgs;

/// dlock: distributed locks over Redis, Redlock, MySQL, Postgres, etcd, ZooKeeper or memory.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
// Parsed once per process and matched once: the size of the largest variant (`bench`'s many
// options) costs nothing a box would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The coupon scenario: N workers take one coupon each from a shared stock, once
    /// without a lock (lost updates) and once with dlock (exactly 0 left).
    Demo(DemoArgs),
    /// Run a command while holding a lock (like flock(1), across machines).
    Run(RunArgs),
    /// Run the conformance suite against a deployed backend.
    Conformance(ConformanceArgs),
    /// Measure acquire/release latency and contended hand-off.
    Bench(BenchArgs),
    /// Show who holds each lock: fencing token, lease left, waiters (--json, --watch).
    Status(StatusArgs),
    /// Run a command while this process leads an election (DLOCK_TERM in its environment);
    /// stop it when leadership is lost; with --again, stand again.
    Elect(ElectArgs),
    /// Show an election's leader: its term and value (--json).
    Leader(LeaderArgs),
    /// Print one line per change of an election's leader (--json: one object per line).
    Observe(ObserveArgs),
}

/// Where the backend is: a URL, or a config file.
#[derive(Debug, Clone, clap::Args)]
pub struct BackendArgs {
    /// Backend URL, e.g. redis://127.0.0.1:6379, postgres://user@host/db, memory:// (`demo`,
    /// `bench` and `conformance` default to memory://; `run` and `status` need one).
    #[arg(long, env = "DLOCK_URL")]
    pub backend: Option<String>,
    /// A TOML config file (`url`, `[options]`, `[lock]`); overrides --backend.
    #[arg(long, env = "DLOCK_CONFIG")]
    pub config: Option<std::path::PathBuf>,
}

impl BackendArgs {
    /// `--backend`, or memory:// when it is not given.
    fn backend_or_memory(&self) -> &str {
        self.backend.as_deref().unwrap_or("memory://")
    }

    /// The backend URL: the config file's, or `--backend`.
    fn url(&self) -> Result<String, LockError> {
        match &self.config {
            Some(path) => Ok(dlock::Config::from_file(path)?.url),
            None => Ok(self.backend_or_memory().to_owned()),
        }
    }

    async fn connect(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        match &self.config {
            Some(path) => dlock::Config::from_file(path)?.connect().await,
            None => dlock::connect(self.backend_or_memory()).await,
        }
    }

    /// The lock options of a command that holds something while a child runs: the config
    /// file's `[lock]` table (or the defaults), with `--ttl` and `--wait` over it, checked.
    fn lock_options(
        &self,
        ttl: Option<Duration>,
        wait: Option<Duration>,
    ) -> Result<dlock_api::LockOptions, LockError> {
        let mut opts = match &self.config {
            Some(path) => dlock::Config::from_file(path)?.lock_options(),
            None => dlock_api::LockOptions::new(),
        };
        if let Some(ttl) = ttl {
            opts = opts.with_ttl(ttl);
        }
        if let Some(wait) = wait {
            opts = opts.with_wait_timeout(wait);
        }
        opts.validate()?;
        Ok(opts)
    }

    /// Refuses to fall back to memory:// for `command`, whose lock must be seen by other
    /// processes: a memory:// lock lives in this process only, so two `dlock run` would both
    /// take it. An explicit `--backend memory://` is taken at its word.
    fn require_given(&self, command: &str) -> Result<(), LockError> {
        if self.backend.is_some() || self.config.is_some() {
            return Ok(());
        }
        Err(LockError::Config {
            backend: "dlock",
            reason: format!(
                "dlock {command} needs a backend: --backend URL, DLOCK_URL or --config FILE \
                 (without one its lock would be memory://, seen by no other process)"
            ),
        })
    }
}

/// Parses `"30s"`, `"500ms"`, `"2m"` for clap.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| e.to_string())
}

/// The exit code for a command line the parser did not take: 64 (`EX_USAGE`, as for any invalid
/// value) for a value it refused (`--ttl 5`, without a unit); otherwise clap's own, 0 for
/// `--help` and `--version` and 2 for a line of the wrong shape (an unknown flag, a missing
/// argument).
pub fn command_line_exit_code(error: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8 => 64,
        _ => u8::try_from(error.exit_code()).unwrap_or(2),
    }
}

/// Runs a parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Demo(args) => demo::demo(args).await.map(Exit::settled),
        Command::Run(args) => run::run(args).await,
        Command::Conformance(args) => conformance::conformance(args).await.map(Exit::settled),
        Command::Bench(args) => bench::bench(args).await.map(Exit::settled),
        Command::Status(args) => status::status(args).await.map(Exit::settled),
        Command::Elect(args) => elect::elect(args).await,
        Command::Leader(args) => leader::leader(args)
            .await
            .map(|()| Exit::settled(ExitCode::SUCCESS)),
        Command::Observe(args) => leader::observe(args)
            .await
            .map(|()| Exit::settled(ExitCode::SUCCESS)),
    };
    let (code, settle_within) = match result {
        Ok(exit) => (exit.code, exit.settle_within),
        Err(error) => {
            eprintln!("dlock: {}", error_chain(&error));
            (ExitCode::from(exit_code_for(&error)), SETTLE_BOUND)
        }
    };
    settle_before_exit(settle_within).await;
    code
}

/// How a command ends: its exit code, and how long the process may then wait for releases still
/// running in the background.
pub(crate) struct Exit {
    pub(crate) code: ExitCode,
    pub(crate) settle_within: Duration,
}

impl Exit {
    /// An exit after which releases still running are waited for up to [`SETTLE_BOUND`].
    pub(crate) fn settled(code: ExitCode) -> Self {
        Self {
            code,
            settle_within: SETTLE_BOUND,
        }
    }
}

/// How long the process waits, before it exits, for releases still running in the background.
pub(crate) const SETTLE_BOUND: Duration = Duration::from_secs(10);

/// Lets the background releases of dropped guards and cut-short acquires finish: the runtime,
/// and with it the process, would otherwise end them half done and leave their locks to their
/// leases. Bounded, because a server that stopped answering cannot be waited for.
async fn settle_before_exit(bound: Duration) {
    if tokio::time::timeout(bound, dlock::settle()).await.is_err() {
        eprintln!("dlock: locks still being released after {bound:?} are left to their leases");
    }
}

/// Closes a command's client before the process exits: what it still holds is released at once,
/// and what it keeps on the server beyond its locks (an etcd lease, a ZooKeeper session, SQL
/// connections) ends now rather than when its TTL or session timeout runs out.
pub(crate) async fn close_client(locks: &dyn dlock::DistributedLock) {
    match locks.close(SETTLE_BOUND).await {
        Ok(report) if !report.is_clean() => {
            let names: Vec<&str> = report.unreleased.iter().map(|n| n.as_str()).collect();
            eprintln!(
                "dlock: not released before exit, left to their leases: {}",
                names.join(", ")
            );
        }
        Ok(_) => {}
        Err(error) => eprintln!("dlock: closing the client: {}", error_chain(&error)),
    }
}

fn exit_code_for(error: &LockError) -> u8 {
    match error {
        LockError::InvalidArgument { .. }
        | LockError::Config { .. }
        | LockError::Unsupported { .. } => 64,
        LockError::Unavailable { .. } | LockError::Backend { .. } => 69,
        LockError::Lost { .. } | LockError::NotHeld { .. } => 74,
        LockError::Timeout { .. } => 75,
        _ => 70,
    }
}

pub(crate) use dlock_api::error_chain;

/// Logs warnings to stderr (`RUST_LOG` overrides).
pub fn init_logging() {
    let filter =
        // The redis driver warns of every failed reconnect to a cluster node, about once a
        // second per process; dlock reports what that means for the locks itself.
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "warn,redis=error".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a person: escape codes in a log file or a CI log are noise.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
