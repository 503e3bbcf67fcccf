//! The two runners: a `cargo test` binary (libtest-mimic) and [`run_all`] for the CLI.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use libtest_mimic::{Conclusion, Trial};

use crate::args::CommandLine;
use crate::case::{Case, Ctx, Failure};
use crate::cases::cases;
use crate::harness::Harness;

fn run_id() -> Arc<str> {
    format!("{}-{:08x}", std::process::id(), rand::random::<u32>()).into()
}

fn trial_name(case: &Case) -> String {
    format!("conformance::{}", case.id)
}

/// Cases take turns here: most share it, and a case whose fault may reach past its own clients
/// (a harness that cannot tell one case's waiting connections from another's kills them all)
/// has it alone, so the fault lands on nobody else's wait.
static BESIDE_OTHERS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Runs `trial` in `case`'s turn: alone if its fault may reach other cases, else beside them.
fn in_turn<T>(case: &Case, trial: impl FnOnce() -> T) -> T {
    use crate::harness::Fault;
    if case.needs.fault == Some(Fault::KillWaiters) {
        let _alone = BESIDE_OTHERS.write().unwrap_or_else(|e| e.into_inner());
        trial()
    } else {
        let _beside = BESIDE_OTHERS.read().unwrap_or_else(|e| e.into_inner());
        trial()
    }
}

async fn run_case(case: &Case, ctx: Ctx) -> Result<(), Failure> {
    // A hung case must fail, not hang the suite: every case's own waits are far shorter.
    let limit = ctx.timing().bound.saturating_mul(4);
    match tokio::time::timeout(limit, (case.run)(ctx.clone())).await {
        Ok(result) => result?,
        Err(_) => return Err(Failure(format!("the case did not finish within {limit:?}"))),
    }
    check_residue(&ctx).await
}

/// After a passing case: nothing of the names it used may stay on the server (a lock held or a
/// waiter queued by a client that is gone). Background releases of dropped guards need a moment,
/// so the server is read again until it is clean or the bound passes.
async fn check_residue(ctx: &Ctx) -> Result<(), Failure> {
    let names = ctx.used_names();
    if names.is_empty() {
        return Ok(());
    }
    let left = ctx.settled_residue(&names).await?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(Failure(format!(
            "left on the server {:?} after the case: {}",
            ctx.timing().bound,
            left.join("; ")
        )))
    }
}

/// Runs the whole suite as a `cargo test` binary (`[[test]] harness = false`) against the
/// harness `setup` builds, on one multi-thread runtime shared by all cases.
///
/// Filtering works as with libtest (`cargo test -p dlock-redis -- fencing:: waiting::` runs the
/// cases that match either filter; `--exact` and `--skip` as libtest), and the closing
/// `test result:` line is libtest's. Cases whose needs the backend does not meet are reported as
/// *ignored* with the reason in their name; they never count as passed.
///
/// # Panics
/// If the harness cannot start or give a client: a missing server fails loudly, with the fix.
pub fn main<H, F, Fut>(setup: F) -> ExitCode
where
    H: Harness,
    F: FnOnce() -> Fut,
    Fut: Future<Output = H>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Ok(name) = std::env::var(crate::cases::crash::CHILD_HOLDS) {
        // Re-executed by a cross-process case: hold the lock until killed.
        runtime.block_on(async move {
            crate::cases::crash::hold_until_killed(Arc::new(setup().await), &name).await
        });
        return ExitCode::FAILURE;
    }
    if let Ok(spec) = std::env::var(crate::nemesis::worker::WORKER_SPEC) {
        // Re-executed by a fault case as one of its workers.
        let spec = serde_json::from_str(&spec).expect("a worker spec from the fault suite");
        let outcome = runtime.block_on(async move {
            crate::nemesis::worker::run_worker(Arc::new(setup().await), spec).await
        });
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("worker failed: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let line = CommandLine::from_env();
    let harness: Arc<dyn Harness> = Arc::new(runtime.block_on(setup()));
    let caps = runtime
        .block_on(harness.client())
        .unwrap_or_else(|e| {
            panic!(
                "{}: could not create a client: {}",
                harness.label(),
                Failure::from(e)
            )
        })
        .capabilities();
    let run = run_id();
    let trials = cases()
        .iter()
        .map(|case| {
            if let Some(reason) = case.needs.unmet(&caps, &*harness) {
                return not_run(case, reason);
            }
            let (handle, ctx, case) = (
                runtime.handle().clone(),
                Ctx::new(harness.clone(), case.id, run.clone()),
                *case,
            );
            Trial::test(trial_name(&case), move || {
                in_turn(&case, || handle.block_on(run_case(&case, ctx))).map_err(|f| f.0.into())
            })
        })
        .chain(std::iter::once(long_trial(&runtime, &harness)))
        .collect();
    let conclusion = run_selected(&line, trials);
    runtime.block_on(async move { drop(harness) });
    conclusion.exit_code()
}

/// Like [`main`], but each case runs on its own runtime, made by `runtime`, with its own harness.
///
/// For in-process backends under **paused time**: a test passes a current-thread runtime built
/// with tokio's `start_paused(true)` (which needs tokio's `test-util` feature in the test's own
/// dev-dependencies, not in this crate, so that nothing users install links it), and TTLs pass
/// instantly. A real server's clock does not pause.
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     dlock_conformance::main_per_case(dlock_conformance::MemoryHarness::new, || {
///         tokio::runtime::Builder::new_current_thread()
///             .enable_all()
///             // .start_paused(true), with tokio's `test-util` feature
///             .build()
///             .expect("tokio runtime")
///     })
/// }
/// ```
pub fn main_per_case<H: Harness>(
    setup: fn() -> H,
    runtime: fn() -> tokio::runtime::Runtime,
) -> ExitCode {
    let line = CommandLine::from_env();
    let probe: Arc<dyn Harness> = Arc::new(setup());
    let caps = runtime()
        .block_on(probe.client())
        .expect("client")
        .capabilities();
    let run = run_id();
    let trials = cases()
        .iter()
        .map(|case| {
            if let Some(reason) = case.needs.unmet(&caps, &*probe) {
                return not_run(case, reason);
            }
            let (case, run) = (*case, run.clone());
            Trial::test(trial_name(&case), move || {
                let ctx = Ctx::new(Arc::new(setup()), case.id, run);
                in_turn(&case, || runtime().block_on(run_case(&case, ctx))).map_err(|f| f.0.into())
            })
        })
        .collect();
    run_selected(&line, trials).exit_code()
}

/// Set to a duration (`30s`) to add [the long run](run_long) to a [`main`] suite's trials; with
/// `LONG_RUN_WORKERS_VAR`, its workers (6 by default).
pub const LONG_RUN_VAR: &str = "DLOCK_CONFORMANCE_LONG";
const LONG_RUN_WORKERS_VAR: &str = "DLOCK_CONFORMANCE_LONG_WORKERS";

/// The long run as a trial: run when [`LONG_RUN_VAR`] says for how long, else listed as ignored
/// with the way to run it.
fn long_trial(runtime: &tokio::runtime::Runtime, harness: &Arc<dyn Harness>) -> Trial {
    let name = format!("conformance::{LONG_RUN_ID}");
    let Ok(duration) = std::env::var(LONG_RUN_VAR) else {
        return Trial::test(format!("{name} (not run: set {LONG_RUN_VAR}=30s)"), || {
            Err(format!("the long run runs when {LONG_RUN_VAR} is set").into())
        })
        .with_ignored_flag(true);
    };
    let (handle, harness) = (runtime.handle().clone(), harness.clone());
    Trial::test(name, move || {
        let duration = humantime::parse_duration(&duration)
            .map_err(|e| format!("{LONG_RUN_VAR}={duration}: {e}"))?;
        let workers = match std::env::var(LONG_RUN_WORKERS_VAR) {
            Ok(workers) => workers
                .parse()
                .map_err(|e| format!("{LONG_RUN_WORKERS_VAR}={workers}: {e}"))?,
            Err(_) => 6,
        };
        let plan = crate::cases::faults::LongRun::new(duration, workers);
        match handle.block_on(run_long(harness, plan)).outcome {
            Outcome::Passed => Ok(()),
            Outcome::Failed(why) => Err(why.into()),
            Outcome::NotRun(why) => Err(format!("not run on this backend: {why}").into()),
        }
    })
}

/// A case the backend cannot run, listed as ignored with the reason in its name. Run anyway
/// (`--ignored`, `--include-ignored`), it fails: a case that did not run never counts as passed.
fn not_run(case: &Case, reason: &'static str) -> Trial {
    Trial::test(
        format!("{} (not run: {reason})", trial_name(case)),
        move || Err(format!("not run on this backend: {reason}").into()),
    )
    .with_ignored_flag(true)
}

/// Cases at once when neither `--test-threads` nor `RUST_TEST_THREADS` says: most of a case is
/// waiting (for a lease to run out, a server to answer), so four keep a 2-core machine busy
/// without starving it, as `dlock conformance` runs them ([`run_all`]). libtest's default, one per
/// core, left the suites mostly idle.
const CASES_AT_ONCE: usize = 4;

/// Runs the trials the command line's filters select, as libtest would.
fn run_selected(line: &CommandLine, trials: Vec<Trial>) -> Conclusion {
    let mut arguments = line.arguments_for(trials.iter().map(Trial::name));
    if arguments.test_threads.is_none() && std::env::var_os("RUST_TEST_THREADS").is_none() {
        arguments.test_threads = Some(CASES_AT_ONCE);
    }
    libtest_mimic::run(&arguments, trials)
}

/// How one case ended.
#[derive(Debug)]
pub enum Outcome {
    /// It passed.
    Passed,
    /// It failed, with the reason.
    Failed(String),
    /// It could not run here, with the reason (a capability the backend lacks, no fault hooks).
    NotRun(&'static str),
}

/// One case's result.
#[derive(Debug)]
pub struct CaseReport {
    /// The case id.
    pub id: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

/// The results of [`run_all`].
#[derive(Debug, Default)]
pub struct Report {
    /// One entry per case, in table order.
    pub cases: Vec<CaseReport>,
}

impl Report {
    /// `(passed, failed, not run)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |f: fn(&Outcome) -> bool| self.cases.iter().filter(|c| f(&c.outcome)).count();
        (
            count(|o| matches!(o, Outcome::Passed)),
            count(|o| matches!(o, Outcome::Failed(_))),
            count(|o| matches!(o, Outcome::NotRun(_))),
        )
    }

    /// `N passed, M failed` with `, K skipped` when any case did not run.
    pub fn summary(&self) -> String {
        let (passed, failed, skipped) = self.counts();
        let mut line = format!("{passed} passed, {failed} failed");
        if skipped > 0 {
            line.push_str(&format!(", {skipped} skipped"));
        }
        line
    }
}

/// The id [`run_long`] reports under.
pub const LONG_RUN_ID: &str = "faults::long_run_under_every_nemesis";

/// Runs [the long run](crate::cases::faults::long_run_under_every_nemesis) against `harness`, on
/// the caller's runtime, and checks what it left as every case is checked. For `dlock conformance
/// --faults --long`: not in the case table, since it runs for as long as it is told.
pub async fn run_long(
    harness: Arc<dyn Harness>,
    plan: crate::cases::faults::LongRun,
) -> CaseReport {
    let started = Instant::now();
    let unmet = match harness.client().await {
        Ok(client) => crate::cases::FENCED_WORKERS.unmet(&client.capabilities(), &*harness),
        Err(error) => {
            return CaseReport {
                id: LONG_RUN_ID,
                outcome: Outcome::Failed(format!("no client: {error}")),
                elapsed: started.elapsed(),
            };
        }
    };
    let outcome = match unmet {
        Some(reason) => Outcome::NotRun(reason),
        None => {
            let ctx = Ctx::new(harness, LONG_RUN_ID, run_id());
            // Hung workers must fail the run, not hang it: its own waits are far shorter.
            let limit = plan
                .duration
                .saturating_mul(3)
                .saturating_add(ctx.timing().bound.saturating_mul(4));
            let ran = tokio::time::timeout(
                limit,
                crate::cases::faults::long_run_under_every_nemesis(ctx.clone(), plan),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Failure(format!(
                    "the long run did not end within {limit:?}"
                )))
            });
            match ran {
                Ok(()) => match check_residue(&ctx).await {
                    Ok(()) => Outcome::Passed,
                    Err(failure) => Outcome::Failed(failure.0),
                },
                Err(failure) => Outcome::Failed(failure.0),
            }
        }
    };
    CaseReport {
        id: LONG_RUN_ID,
        outcome,
        elapsed: started.elapsed(),
    }
}

/// Runs the cases whose id contains one of `filters` (all if there is none) against `harness`, at
/// most four at a time, on the caller's runtime. For `dlock conformance --backend URL`.
pub async fn run_all(harness: Arc<dyn Harness>, filters: &[String]) -> Result<Report, Failure> {
    let caps = harness.client().await?.capabilities();
    let run = run_id();
    let selected: Vec<&Case> = cases()
        .iter()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.id.contains(f.as_str())))
        .collect();
    let results = futures::stream::iter(selected)
        .map(|case| {
            let ctx = Ctx::new(harness.clone(), case.id, run.clone());
            let unmet = case.needs.unmet(&caps, &*harness);
            async move {
                let started = Instant::now();
                let outcome = match unmet {
                    Some(reason) => Outcome::NotRun(reason),
                    None => match run_case(case, ctx).await {
                        Ok(()) => Outcome::Passed,
                        Err(failure) => Outcome::Failed(failure.0),
                    },
                };
                CaseReport {
                    id: case.id,
                    outcome,
                    elapsed: started.elapsed(),
                }
            }
        })
        .buffered(CASES_AT_ONCE)
        .collect()
        .await;
    Ok(Report { cases: results })
}
