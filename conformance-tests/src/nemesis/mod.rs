//! The fault suite's instruments on the harness side: worker processes it can pause and kill,
//! the registers they write to, and the log of what the harness did to them.
//!
//! A [`Run`] is one fault test execution: a directory for the histories, a fenced register and
//! its unfenced shadow (served over loopback TCP), and the nemesis log. [`Run::spawn`] starts a
//! worker ([`worker::run_worker`], in a re-executed copy of the test binary, connected to the
//! same deployment through [`Harness::child_env`](crate::Harness::child_env)); the returned
//! [`WorkerProcess`] can be paused (`SIGSTOP`), resumed and killed (`SIGKILL`), each act logged.
//! [`Run::input`] gathers everything for the [history checker](crate::history).

pub mod clock;
pub mod link;
mod task;
pub mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use crate::history::{
    Edge, HistoryWriter, Input, NEMESIS_FILE, NemesisRecord, RegisterKind, RegisterServer, now_ns,
    read_history_dir, read_jsonl, worker_file,
};
use crate::{Ctx, Failure};
use worker::{WORKER_SPEC, WorkerSpec};

/// One fault test execution; see the [module docs](self).
pub struct Run {
    /// Unique per execution.
    pub id: String,
    /// Where histories, logs and a failure's dump go.
    pub dir: PathBuf,
    register: RegisterServer,
    shadow: RegisterServer,
    nemesis: HistoryWriter,
    deaths: Mutex<BTreeMap<u32, u64>>,
    /// What its workers are: processes with this environment, or tasks of this process.
    workers: Workers,
    /// The seed of the run's random choices.
    pub seed: u64,
}

fn failure(what: &str) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure(format!("{what}: {e}"))
}

impl Run {
    /// Starts the registers and the run directory for `ctx`'s case.
    ///
    /// # Errors
    /// When the harness has no child environment, or the directory or registers cannot be made.
    pub async fn start(ctx: &Ctx) -> Result<Self, Failure> {
        let workers = match ctx.child_env() {
            Some(env) => Workers::Processes(env),
            None if ctx
                .faults()
                .is_some_and(|f| f.supports(crate::Fault::TaskWorkers)) =>
            {
                Workers::Tasks(ctx.harness().clone())
            }
            None => {
                return Err(Failure(
                    "the harness runs no worker processes or tasks".into(),
                ));
            }
        };
        let seed: u64 = rand::random();
        let id = format!("{}-{seed:016x}", ctx.case().replace("::", "-"));
        let dir = std::env::temp_dir().join("dlock-faults").join(&id);
        std::fs::create_dir_all(&dir).map_err(failure("cannot create the run directory"))?;
        let register = RegisterServer::start(RegisterKind::Fenced)
            .await
            .map_err(failure("fenced register"))?;
        let shadow = RegisterServer::start(RegisterKind::Shadow)
            .await
            .map_err(failure("shadow register"))?;
        let nemesis =
            HistoryWriter::open(&dir.join(NEMESIS_FILE)).map_err(failure("nemesis log"))?;
        Ok(Self {
            id,
            dir,
            register,
            shadow,
            nemesis,
            deaths: Mutex::new(BTreeMap::new()),
            workers,
            seed,
        })
    }

    /// A worker's spec for this run: `rounds` rounds over `names`, thinking up to `think`, each
    /// round taking the lock (set [`WorkerSpec::permits`] for a semaphore's permit).
    pub fn spec(
        &self,
        worker: u32,
        names: &[dlock_api::LockName],
        rounds: u32,
        ttl: Duration,
        wait: Duration,
        think: Duration,
    ) -> WorkerSpec {
        WorkerSpec {
            run: self.id.clone(),
            worker,
            names: names.iter().map(|n| n.as_str().to_owned()).collect(),
            history: worker_file(&self.dir, worker),
            register: self.register.addr(),
            shadow: self.shadow.addr(),
            rounds,
            ttl,
            wait,
            think,
            announce: false,
            ready_pause: None,
            seed: self.seed,
            run_for: None,
            permits: None,
            elect: false,
            reader_rounds: None,
        }
    }

    /// Starts a worker process running `spec` against the case's deployment.
    ///
    /// # Errors
    /// When the test binary cannot be re-executed.
    pub fn spawn(&self, spec: &WorkerSpec) -> Result<WorkerProcess, Failure> {
        match &self.workers {
            Workers::Processes(env) => self.spawn_on(spec, env),
            Workers::Tasks(harness) => task::spawn(&**harness, spec),
        }
    }

    /// [`spawn`](Self::spawn) with `extra` set in the worker's environment (a
    /// [`clock::SteppedClock`]'s, say).
    ///
    /// # Errors
    /// When the test binary cannot be re-executed.
    pub fn spawn_with(
        &self,
        spec: &WorkerSpec,
        extra: &[(String, String)],
    ) -> Result<WorkerProcess, Failure> {
        let Workers::Processes(env) = &self.workers else {
            return Err(Failure(
                "an environment is for worker processes, and this run's workers are tasks".into(),
            ));
        };
        let env: Vec<_> = env.iter().chain(extra).cloned().collect();
        self.spawn_on(spec, &env)
    }

    /// Starts a worker process running `spec` against the deployment `harness` reaches (a
    /// case's own server, or the same through a fault proxy).
    ///
    /// # Errors
    /// When the harness runs no child processes, or the test binary cannot be re-executed.
    pub fn spawn_via(
        &self,
        spec: &WorkerSpec,
        harness: &dyn crate::Harness,
    ) -> Result<WorkerProcess, Failure> {
        let env = harness
            .child_env()
            .ok_or_else(|| Failure("the harness runs no child processes".into()))?;
        self.spawn_on(spec, &env)
    }

    fn spawn_on(
        &self,
        spec: &WorkerSpec,
        env: &[(String, String)],
    ) -> Result<WorkerProcess, Failure> {
        let exe = std::env::current_exe().map_err(failure("cannot find the test binary"))?;
        let json = serde_json::to_string(spec).map_err(|e| Failure(e.to_string()))?;
        let stderr = std::fs::File::create(self.dir.join(format!("worker-{}.stderr", spec.worker)))
            .map_err(failure("cannot create a worker's stderr file"))?;
        let mut child = tokio::process::Command::new(exe)
            .envs(env.iter().cloned())
            .env(WORKER_SPEC, json)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(failure("cannot start a worker process"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Failure("no worker stdout".into()))?;
        let pid = child
            .id()
            .ok_or_else(|| Failure("the worker exited at once".into()))?;
        Ok(WorkerProcess {
            worker: spec.worker,
            body: Body::Process(Box::new(ProcessBody {
                pid,
                child,
                lines: BufReader::new(stdout).lines(),
            })),
        })
    }

    /// Logs a fault's start or stop.
    pub fn log(&self, edge: Edge, what: impl Into<String>) {
        let record = NemesisRecord {
            t: now_ns(),
            edge,
            what: what.into(),
        };
        if let Err(error) = self.nemesis.append(&record) {
            eprintln!("the nemesis log could not be written: {error}");
        }
    }

    /// Pauses `worker` (`SIGSTOP`) and logs it.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause(&self, worker: &WorkerProcess) -> Result<(), Failure> {
        match &worker.body {
            Body::Process(process) => {
                worker.signal(libc::SIGSTOP)?;
                self.log(
                    Edge::Start,
                    format!("pause worker {} (pid {})", worker.worker, process.pid),
                );
            }
            Body::Task(task) => {
                task.pause();
                self.log(
                    Edge::Start,
                    format!(
                        "pause worker {} (a task: not polled, link cut)",
                        worker.worker
                    ),
                );
            }
        }
        Ok(())
    }

    /// Resumes a paused `worker` (`SIGCONT`) and logs it.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&self, worker: &WorkerProcess) -> Result<(), Failure> {
        match &worker.body {
            Body::Process(_) => worker.signal(libc::SIGCONT)?,
            Body::Task(task) => task.resume(),
        }
        self.log(Edge::Stop, format!("resume worker {}", worker.worker));
        Ok(())
    }

    /// Kills `worker` (`SIGKILL`: no release, no goodbye), logs it and records its death: its
    /// holds end there.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub async fn kill(&self, mut worker: WorkerProcess) -> Result<(), Failure> {
        let t = now_ns();
        if let Body::Task(task) = &worker.body {
            task.kill().await;
        } else {
            worker.signal(libc::SIGKILL)?;
            if let Body::Process(process) = &mut worker.body {
                let _ = process.child.wait().await;
            }
        }
        self.log(Edge::Start, format!("kill worker {}", worker.worker));
        self.deaths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(worker.worker, t);
        Ok(())
    }

    /// The run passed: its directory is not needed.
    pub fn discard(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// Everything the run recorded, with `residue` (what the server still holds of the run's
    /// names), for the checker.
    ///
    /// # Errors
    /// When a history cannot be read.
    pub fn input(&self, residue: Vec<String>) -> Result<Input, Failure> {
        let loaded = read_history_dir(&self.dir).map_err(failure("reading the histories"))?;
        let nemesis = read_jsonl::<NemesisRecord>(&[self.dir.join(NEMESIS_FILE)])
            .map_err(failure("reading the nemesis log"))?;
        Ok(Input {
            events: loaded.records,
            torn: loaded.torn,
            register: self.register.snapshot(),
            shadow: Some(self.shadow.snapshot()),
            nemesis: nemesis.records,
            deaths: self
                .deaths
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            residue: Some(residue),
            earlier_max_token: None,
            seed: Some(self.seed),
            notes: vec![format!("run {}", self.id)],
        })
    }
}

/// A running worker: a process, or (where the deployment lives in this process) a task.
pub struct WorkerProcess {
    /// Its id in the run.
    pub worker: u32,
    body: Body,
}

enum Body {
    Process(Box<ProcessBody>),
    Task(task::WorkerTask),
}

struct ProcessBody {
    pid: u32,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

/// What a run's workers are.
enum Workers {
    /// Processes (the test binary re-executed) with this environment.
    Processes(Vec<(String, String)>),
    /// Tasks of this process, on clients of this harness.
    Tasks(std::sync::Arc<dyn crate::Harness>),
}

impl WorkerProcess {
    fn signal(&self, signal: libc::c_int) -> Result<(), Failure> {
        let Body::Process(process) = &self.body else {
            return Err(Failure(format!("worker {} is a task", self.worker)));
        };
        let pid = libc::pid_t::try_from(process.pid).map_err(|e| Failure(e.to_string()))?;
        // SAFETY: `kill` has no memory effects; the pid is our own child's, which we have not
        // reaped (we hold its `Child`), so it cannot name another process.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(Failure(format!(
                "signal {signal} to worker {}: {}",
                self.worker,
                std::io::Error::last_os_error()
            )));
        }
        Ok(())
    }

    /// The next line the worker printed (`holding <handle> <token>`), `None` at its exit.
    ///
    /// # Errors
    /// When its output cannot be read.
    pub async fn next_line(&mut self) -> Result<Option<String>, Failure> {
        match &mut self.body {
            Body::Process(process) => process
                .lines
                .next_line()
                .await
                .map_err(failure("reading a worker's output")),
            Body::Task(task) => Ok(task.next_line().await),
        }
    }

    /// Waits for the worker to finish its rounds.
    ///
    /// # Errors
    /// When it exits unsuccessfully (its own errors are of the harness: a register or history
    /// it could not reach).
    pub async fn finish(mut self) -> Result<(), Failure> {
        while self.next_line().await?.is_some() {}
        match self.body {
            Body::Process(mut process) => {
                let status = process
                    .child
                    .wait()
                    .await
                    .map_err(failure("waiting for a worker"))?;
                if status.success() {
                    Ok(())
                } else {
                    Err(Failure(format!(
                        "worker {} exited with {status}",
                        self.worker
                    )))
                }
            }
            Body::Task(task) => task
                .finish()
                .await
                .map_err(|e| Failure(format!("worker {}: {e}", self.worker))),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("id", &self.id)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for WorkerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = f.debug_struct("WorkerProcess");
        out.field("worker", &self.worker);
        if let Body::Process(process) = &self.body {
            out.field("pid", &process.pid);
        }
        out.finish_non_exhaustive()
    }
}
