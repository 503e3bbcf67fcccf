//! The worker's side: the test binary re-executed as a lock user that logs everything it does.
//!
//! A worker takes locks of the run's names one round at a time: acquire, read the fenced
//! register and its shadow, think, write both back with the guard's token, release. Given a
//! number of permits ([`WorkerSpec::permits`]), it takes one permit of a semaphore instead; given
//! a share of reader rounds ([`WorkerSpec::reader_rounds`]), those rounds take a reader's share
//! of a reader-writer lock and only read (the others are its writer's, as a lock's). Every step
//! goes to its history file before and after the call, stamped with the host's monotonic clock,
//! so the checker can decide afterwards from the records alone what happened, whatever the
//! harness did to the process meanwhile (pause it, kill it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::Harness;
use crate::history::{Event, HistoryWriter, HoldId, Op, Phase, RegisterClient, tokio_deadline_ns};

/// Set in a worker's environment to its [`WorkerSpec`] as JSON.
pub const WORKER_SPEC: &str = "DLOCK_CONFORMANCE_WORKER";

/// What one worker process does.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// The run it belongs to.
    pub run: String,
    /// Its id in the run.
    pub worker: u32,
    /// The lock names it picks from, at random each round.
    pub names: Vec<String>,
    /// Its history file.
    pub history: PathBuf,
    /// The fenced register.
    pub register: SocketAddr,
    /// The unfenced shadow register.
    pub shadow: SocketAddr,
    /// Rounds to run: acquire, read, think, write, release.
    pub rounds: u32,
    /// The lease TTL it asks for.
    pub ttl: Duration,
    /// Each acquire's wait timeout.
    pub wait: Duration,
    /// The think time between read and write, drawn from zero up to this.
    pub think: Duration,
    /// Prints `acquiring <handle>` on stdout as it asks for a lock, and `holding <handle> <token>
    /// <wall clock, Unix ms>` once it holds it and has read the registers, then thinks exactly `think`: the points where
    /// the harness pauses or kills it.
    pub announce: bool,
    /// Once connected (and warmed up by one acquire and release of the first name), prints
    /// `ready` and waits this long before its first round: time for the harness to set a fault
    /// on its link that must hit the lock's requests, not the connect.
    pub ready_pause: Option<Duration>,
    /// The seed of its random choices.
    pub seed: u64,
    /// Starts no round after this long (counted from its first round), whatever `rounds` says:
    /// the long run's workers run for a time, not a count.
    #[serde(default)]
    pub run_for: Option<Duration>,
    /// A semaphore's number of permits: each round takes one of them
    /// ([`acquire_permit`](DistributedLock::acquire_permit)) instead of the lock, and its
    /// acquire events record the number for the checker. `None` (the default, and what a spec
    /// written without it reads as): a lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// Each round campaigns for the name as a leader ([`campaign`](DistributedLock::campaign),
    /// publishing `worker-ID`) instead of taking the lock: the round's token is the term. `false`
    /// (the default): a lock.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub elect: bool,
    /// The percentage of rounds (0 to 100) that take a reader's share of the name
    /// ([`read`](DistributedLock::read)) and only read the registers; the other rounds take the
    /// name's lock as its writer and write. `None` (the default): a lock's rounds, all writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_rounds: Option<u8>,
}

/// The element a hold adds to the register: unique per worker and round.
fn element(hold: HoldId) -> u64 {
    (u64::from(hold.worker) << 32) | (hold.handle & 0xffff_ffff)
}

/// Where a worker tells the harness where it is: its stdout (a worker process), or a channel (a
/// worker task).
pub(crate) type Say = dyn Fn(&str) -> Result<(), String> + Send + Sync;

/// Runs `spec` against a client of `harness`, announcing on stdout: a worker process's body.
/// Errors are of the harness (a register that does not answer, a history that cannot be
/// written), not of the lock: those are recorded.
pub async fn run_worker(harness: Arc<dyn Harness>, spec: WorkerSpec) -> Result<(), String> {
    // A server that is down or frozen when the worker starts is waited for, as a service
    // would, up to the worker's wait.
    let give_up = after(tokio::time::Instant::now(), spec.wait);
    let client = loop {
        match harness.client().await {
            Ok(client) => break client,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    run_rounds(client, spec, &say).await
}

/// The worker's rounds on `client`, announcing through `say`.
pub(crate) async fn run_rounds(
    client: Arc<dyn DistributedLock>,
    spec: WorkerSpec,
    say: &Say,
) -> Result<(), String> {
    let history = HistoryWriter::open(&spec.history).map_err(|e| e.to_string())?;
    let log = |event: Event| history.append(&event).map_err(|e| e.to_string());
    let mut fenced = RegisterClient::connect(spec.register)
        .await
        .map_err(|e| e.to_string())?;
    let mut shadow = RegisterClient::connect(spec.shadow)
        .await
        .map_err(|e| e.to_string())?;
    let options = LockOptions::new()
        .with_ttl(spec.ttl)
        .with_wait_timeout(spec.wait);
    if let Some(pause) = spec.ready_pause {
        // One round trip of each kind first, so that a fault set on the link after `ready` meets
        // the lock's requests themselves, not a first use's set-up (a script to load, a statement
        // to prepare). Nobody else runs yet, so this hold needs no record.
        if let Some(name) = spec.names.first() {
            let guard = acquire(&*client, name, &spec, &options)
                .await
                .map_err(|e| format!("warm-up: {e}"))?;
            guard.release().await.map_err(|e| format!("warm-up: {e}"))?;
        }
        say("ready")?;
        tokio::time::sleep(pause).await;
    }
    let mut rng = StdRng::seed_from_u64(spec.seed ^ u64::from(spec.worker));
    let stop_at = spec
        .run_for
        .map(|run_for| after(tokio::time::Instant::now(), run_for));
    for round in 0..spec.rounds {
        if stop_at.is_some_and(|stop_at| tokio::time::Instant::now() >= stop_at) {
            break;
        }
        let hold = HoldId {
            worker: spec.worker,
            handle: u64::from(round),
        };
        let name = &spec.names[rng.random_range(..spec.names.len())];
        let reading = spec
            .reader_rounds
            .is_some_and(|share| rng.random_range(0..100u8) < share);
        let at = |op, phase| Event::now(&spec.run, hold, name, op, phase);
        // Acquire events carry the semaphore's limit, or the reader's mark: the checker judges
        // the hold by it.
        let acquire_at = |phase| at(Op::Acquire, phase).permits(spec.permits).shared(reading);
        log(acquire_at(Phase::Invoke))?;
        if spec.announce {
            say(&format!("acquiring {}", hold.handle))?;
        }
        let acquired = if reading {
            match LockName::new(name) {
                Ok(name) => client.read(&name, &options).await,
                Err(error) => Err(error),
            }
        } else {
            acquire(&*client, name, &spec, &options).await
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(error) => {
                // An unreachable server may have granted it anyway: outcome unknown.
                let phase = if error.is_retryable() && !matches!(error, LockError::Timeout { .. }) {
                    Phase::Info
                } else {
                    Phase::Fail
                };
                log(acquire_at(phase).err(error.to_string()))?;
                if stop_at.is_some() {
                    // A run for a time goes on through faults: an outage that fails every
                    // attempt at once must not fill the history with them.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let token = guard.fencing_token().get();
        let mut granted = acquire_at(Phase::Ok).token(token);
        if let Some(deadline) = guard.valid_until() {
            granted = granted.valid_until(tokio_deadline_ns(deadline));
        }
        log(granted)?;
        let think = if spec.announce {
            spec.think
        } else {
            rng.random_range(Duration::ZERO..=spec.think)
        };
        // The lost signal is recorded as soon as it fires, while the worker thinks.
        // Scoped: the update borrows the guard, which `release` then takes.
        let lost_logged = {
            let update = async {
                log(at(Op::FrRead, Phase::Invoke))?;
                let fenced_base = fenced.read(name).await.map_err(|e| e.to_string())?;
                let shadow_base = shadow.read(name).await.map_err(|e| e.to_string())?;
                log(at(Op::FrRead, Phase::Ok))?;
                if spec.announce {
                    // Read, not yet written: where a pause or a kill bites.
                    // Its wall clock too, which a case may have stepped.
                    let wall = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis());
                    say(&format!("holding {} {token} {wall}", hold.handle))?;
                }
                // Thinks, recording each renewal the guard's watchdog makes meanwhile (the deadline
                // it moved to), so a hold longer than its lease is not taken for expired.
                let think_until = after(tokio::time::Instant::now(), think);
                let mut deadline = guard.valid_until();
                let slice = spec
                    .ttl
                    .checked_div(8)
                    .unwrap_or_default()
                    .max(Duration::from_millis(10));
                while let Some(left) =
                    think_until.checked_duration_since(tokio::time::Instant::now())
                    && !left.is_zero()
                {
                    tokio::time::sleep(slice.min(left)).await;
                    let now_valid_until = guard.valid_until();
                    if now_valid_until != deadline {
                        if let Some(next) = now_valid_until {
                            log(at(Op::Extend, Phase::Ok).valid_until(tokio_deadline_ns(next)))?;
                        }
                        deadline = now_valid_until;
                    }
                }
                if reading {
                    // A reader writes nothing.
                    return Ok(());
                }
                log(at(Op::FrWrite, Phase::Invoke).token(token))?;
                let accepted = fenced
                    .write(name, token, hold, &fenced_base.set, element(hold))
                    .await
                    .map_err(|e| e.to_string())?;
                shadow
                    .write(name, token, hold, &shadow_base.set, element(hold))
                    .await
                    .map_err(|e| e.to_string())?;
                let written = at(Op::FrWrite, if accepted { Phase::Ok } else { Phase::Fail });
                log(if accepted {
                    written
                } else {
                    written.err("refused: stale token")
                })
            };
            tokio::pin!(update);
            let mut lost_logged = false;
            tokio::select! {
                done = &mut update => done?,
                _ = guard.lost() => {
                    log(at(Op::Lost, Phase::Ok))?;
                    lost_logged = true;
                    // Like a process that does not check: it goes on and writes.
                    update.await?;
                }
            }
            lost_logged
        };
        if !lost_logged && !guard.is_held() {
            log(at(Op::Lost, Phase::Ok))?;
        }
        log(at(Op::Release, Phase::Invoke))?;
        match guard.release().await {
            Ok(()) => log(at(Op::Release, Phase::Ok))?,
            Err(error) => log(at(Op::Release, Phase::Fail).err(error.to_string()))?,
        }
    }
    Ok(())
}

/// The lock, one of the spec's permits of the semaphore, or the leadership of the election.
async fn acquire(
    client: &dyn DistributedLock,
    name: &str,
    spec: &WorkerSpec,
    options: &LockOptions,
) -> dlock_api::Result<LockGuard> {
    let name = LockName::new(name)?;
    match spec.permits {
        None if spec.elect => {
            let value = format!("worker-{}", spec.worker);
            let leadership = client.campaign(&name, value.as_bytes(), options).await?;
            Ok(leadership.into_guard())
        }
        None => client.acquire(&name, options).await,
        Some(permits) => client.acquire_permit(&name, permits, options).await,
    }
}

/// Tells the harness where this worker process is: `ready` (connected), `acquiring <handle>`
/// (asking for a lock), or `holding <handle> <token>` (holds it, has read the registers, is about
/// to think; with its wall clock in Unix milliseconds).
fn say(line: &str) -> Result<(), String> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").map_err(|e| e.to_string())?;
    stdout.flush().map_err(|e| e.to_string())
}
