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
    env: Vec<(String, String)>,
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
        let env = ctx
            .child_env()
            .ok_or_else(|| Failure("the harness runs no child processes".into()))?;
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
            env,
            seed,
        })
    }

    /// A worker's spec for this run: `rounds` rounds over `names`, thinking up to `think`.
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
        }
    }

    /// Starts a worker process running `spec` against the case's deployment.
    ///
    /// # Errors
    /// When the test binary cannot be re-executed.
    pub fn spawn(&self, spec: &WorkerSpec) -> Result<WorkerProcess, Failure> {
        self.spawn_on(spec, &self.env)
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
        let env: Vec<_> = self.env.iter().chain(extra).cloned().collect();
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
            pid,
            child,
            lines: BufReader::new(stdout).lines(),
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
        worker.signal(libc::SIGSTOP)?;
        self.log(
            Edge::Start,
            format!("pause worker {} (pid {})", worker.worker, worker.pid),
        );
        Ok(())
    }

    /// Resumes a paused `worker` (`SIGCONT`) and logs it.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&self, worker: &WorkerProcess) -> Result<(), Failure> {
        worker.signal(libc::SIGCONT)?;
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
        worker.signal(libc::SIGKILL)?;
        let _ = worker.child.wait().await;
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

/// A running worker process.
pub struct WorkerProcess {
    /// Its id in the run.
    pub worker: u32,
    /// Its process id.
    pub pid: u32,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl WorkerProcess {
    fn signal(&self, signal: libc::c_int) -> Result<(), Failure> {
        let pid = libc::pid_t::try_from(self.pid).map_err(|e| Failure(e.to_string()))?;
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
        self.lines
            .next_line()
            .await
            .map_err(failure("reading a worker's output"))
    }

    /// Waits for the worker to finish its rounds.
    ///
    /// # Errors
    /// When it exits unsuccessfully (its own errors are of the harness: a register or history
    /// it could not reach).
    pub async fn finish(mut self) -> Result<(), Failure> {
        while self.next_line().await?.is_some() {}
        let status = self
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
        f.debug_struct("WorkerProcess")
            .field("worker", &self.worker)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}
