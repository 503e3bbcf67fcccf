//! Child processes that cannot outlive the test process.
//!
//! * Every child is spawned by one long-lived **spawner thread**, with `PR_SET_PDEATHSIG = SIGKILL` set in the
//!   child. The kernel sends that signal when the *thread* that forked the child exits, so spawning from test
//!   threads (which come and go) would kill servers early; the spawner thread lives until the process exits.
//! * Every server runs in its **own process group**, so `kill`, `pause` and `resume` reach the processes it forks
//!   too (Postgres backends), and a Ctrl-C meant for `cargo test` does not reach it (PDEATHSIG does the cleanup).
//! * Every live server and its directory is in a **registry**; an `atexit` handler kills what is left and removes
//!   the directories, for handles that are never dropped (`static`s). Directories left behind by a test process
//!   that was killed outright are swept by the next test process (their names carry the owner's PID).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{Result, ServerError};

/// Prefix of every directory this crate creates in the temporary directory.
const DIR_PREFIX: &str = "dlock-test-";

/// How long `stop()` waits for a clean exit before it kills.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between readiness polls: short at first (most servers answer within a few tens of ms), then longer.
const POLL_FAST: Duration = Duration::from_millis(10);
const POLL: Duration = Duration::from_millis(50);
const FAST_POLLING_FOR: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------------------------------------
// The spawner thread.

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("dlock-test-servers-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop (and the thread) lasts until the process exits.
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the dlock-test-servers spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `command` from the spawner thread, as the leader of a new process group, with PDEATHSIG set, and
/// (when `run_as` is set) with the given user and group ids.
fn spawn(mut command: Command, run_as: Option<RunAs>) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    command.process_group(0);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls.
    unsafe {
        command.pre_exec(move || {
            if let Some(RunAs { uid, gid }) = run_as {
                if libc::setgroups(1, &gid) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            // After the credential change: changing the uid clears the parent-death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((command, tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

// ---------------------------------------------------------------------------------------------------------------
// Registry of live servers, cleaned up at exit.

struct Entry {
    pid: Option<libc::pid_t>,
    dir: PathBuf,
}

static REGISTRY: Mutex<Option<HashMap<u64, Entry>>> = Mutex::new(None);

fn registry() -> MutexGuard<'static, Option<HashMap<u64, Entry>>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn cleanup_at_exit() {
    let entries = registry().take().unwrap_or_default();
    for entry in entries.into_values() {
        if let Some(pid) = entry.pid {
            // SAFETY: plain system calls on a process group and pid we started.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        let _ = fs::remove_dir_all(&entry.dir);
    }
}

fn register(dir: &Path) -> u64 {
    static AT_EXIT: Once = Once::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    AT_EXIT.call_once(|| {
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(cleanup_at_exit) };
    });
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    registry().get_or_insert_with(HashMap::new).insert(
        id,
        Entry {
            pid: None,
            dir: dir.to_owned(),
        },
    );
    id
}

fn set_registered_pid(id: u64, pid: Option<libc::pid_t>) {
    if let Some(entry) = registry().as_mut().and_then(|m| m.get_mut(&id)) {
        entry.pid = pid;
    }
}

fn unregister(id: u64) {
    if let Some(map) = registry().as_mut() {
        map.remove(&id);
    }
}

/// Removes directories left by earlier test processes that no longer exist.
fn sweep_stale_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        // Names look like `dlock-test-<kind>-<pid>-<random>`.
        let mut parts = rest.rsplitn(3, '-');
        let (_random, pid) = (parts.next(), parts.next());
        let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Creates a fresh temporary directory for one server process.
pub(crate) fn temp_dir(kind: &'static str) -> Result<TempDir> {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep_stale_dirs);
    tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{kind}-{}-", std::process::id()))
        .tempdir()
        .map_err(ServerError::io(kind, "cannot create a temporary directory"))
}

// ---------------------------------------------------------------------------------------------------------------
// Launch specs.

/// A user and group to run a child as (Postgres refuses to run as root).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunAs {
    pub(crate) uid: libc::uid_t,
    pub(crate) gid: libc::gid_t,
}

impl RunAs {
    /// Looks up a user by name.
    pub(crate) fn user(name: &str) -> Option<RunAs> {
        let cname = std::ffi::CString::new(name).ok()?;
        // SAFETY: getpwnam returns a pointer to static storage or null; we copy the two ids out at once.
        let pw = unsafe { libc::getpwnam(cname.as_ptr()) };
        if pw.is_null() {
            return None;
        }
        // SAFETY: checked non-null above.
        let pw = unsafe { &*pw };
        Some(RunAs {
            uid: pw.pw_uid,
            gid: pw.pw_gid,
        })
    }

    /// Gives `path` to this user.
    pub(crate) fn chown(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
    }
}

/// How to start a program: enough to start it again after a kill.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    run_as: Option<RunAs>,
}

impl Launch {
    pub(crate) fn new(program: impl Into<PathBuf>) -> Self {
        Launch {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            run_as: None,
        }
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub(crate) fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    pub(crate) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub(crate) fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    pub(crate) fn run_as(mut self, user: Option<RunAs>) -> Self {
        self.run_as = user;
        self
    }

    fn command(&self, stdout: File, stderr: File) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command
    }

    /// Runs the program to completion (bounded by `timeout`). Returns its standard output; on failure the
    /// error carries its standard output and error.
    pub(crate) fn run(&self, server: &'static str, timeout: Duration) -> Result<String> {
        let io_err = |what: &str| ServerError::io(server, format!("{what} `{self}`"));
        let mut stdout =
            tempfile::tempfile().map_err(io_err("cannot create an output file for"))?;
        let mut stderr =
            tempfile::tempfile().map_err(io_err("cannot create an output file for"))?;
        let command = self.command(
            stdout.try_clone().map_err(io_err("cannot prepare"))?,
            stderr.try_clone().map_err(io_err("cannot prepare"))?,
        );
        let mut child = spawn(command, self.run_as).map_err(io_err("cannot run"))?;
        let deadline = Instant::now() + timeout;
        let status = loop {
            match child.try_wait().map_err(io_err("cannot wait for"))? {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => thread::sleep(Duration::from_millis(10)),
            }
        };
        let read = |file: &mut File| -> io::Result<String> {
            let mut text = String::new();
            file.rewind()?;
            file.read_to_string(&mut text)?;
            Ok(text)
        };
        let out = read(&mut stdout).map_err(io_err("cannot read the output of"))?;
        match status {
            Some(status) if status.success() => Ok(out),
            status => {
                let err = read(&mut stderr).unwrap_or_default();
                let all = format!("{out}{err}");
                let lines: Vec<&str> = all.lines().collect();
                Err(ServerError::CommandFailed {
                    server,
                    reason: match status {
                        Some(status) => status.to_string(),
                        None => format!("timed out after {timeout:?}"),
                    },
                    command: self.to_string(),
                    output: indent(lines[lines.len().saturating_sub(40)..].iter().copied()),
                })
            }
        }
    }
}

impl fmt::Display for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.env {
            write!(f, "{}={} ", k.to_string_lossy(), v.to_string_lossy())?;
        }
        write!(f, "{}", self.program.display())?;
        for arg in &self.args {
            let arg = arg.to_string_lossy();
            if arg.is_empty() || arg.contains(char::is_whitespace) {
                write!(f, " '{arg}'")?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        if let Some(RunAs { uid, .. }) = self.run_as {
            write!(f, " (as uid {uid})")?;
        }
        Ok(())
    }
}

fn indent<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    lines.map(|l| format!("    {l}\n")).collect()
}

/// Finds a program: an absolute path must exist; a bare name is looked up in `PATH` plus `/usr/sbin` and
/// `/usr/bin` (not every `PATH` has the sbin directories).
pub(crate) fn find_program(server: &'static str, name: &str) -> Result<PathBuf> {
    let path = Path::new(name);
    let found = if path.is_absolute() {
        path.is_file().then(|| path.to_owned())
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    };
    found.ok_or_else(|| ServerError::NotInstalled {
        server,
        missing: name.to_owned(),
        hint: crate::error::INSTALL_HINT,
    })
}

// ---------------------------------------------------------------------------------------------------------------
// A server process.

/// Answers "is the server ready?" by speaking its protocol. Must return within a second or so.
pub(crate) type Probe = Box<dyn Fn() -> bool + Send + Sync>;

struct State {
    child: Option<Child>,
    paused: bool,
    started_in: Duration,
}

/// One server process, its directory and how to (re)start it.
pub(crate) struct Proc {
    kind: &'static str,
    label: String,
    launch: Launch,
    log: PathBuf,
    probe: Probe,
    ready_timeout: Duration,
    stop_signal: libc::c_int,
    state: Mutex<State>,
    id: u64,
    // Last, so that it is removed after the process is gone.
    dir: TempDir,
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proc")
            .field("kind", &self.kind)
            .field("label", &self.label)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl Proc {
    /// Prepares a server; nothing runs until [`Proc::spawn`] or [`Proc::start`].
    pub(crate) fn new(
        kind: &'static str,
        label: String,
        dir: TempDir,
        launch: Launch,
        probe: Probe,
        ready_timeout: Duration,
        stop_signal: libc::c_int,
    ) -> Self {
        let id = register(dir.path());
        Proc {
            kind,
            label,
            log: dir.path().join("server.log"),
            launch,
            probe,
            ready_timeout,
            stop_signal,
            state: Mutex::new(State {
                child: None,
                paused: false,
                started_in: Duration::ZERO,
            }),
            id,
            dir,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn log_path(&self) -> &Path {
        &self.log
    }

    pub(crate) fn command_line(&self) -> String {
        self.launch.to_string()
    }

    /// Starts the process and waits until it is ready.
    pub(crate) fn start(&self) -> Result<Duration> {
        let begun = self.spawn()?;
        self.wait_ready(begun)
    }

    /// Starts the process without waiting; returns when it was started, for [`Proc::wait_ready`].
    pub(crate) fn spawn(&self) -> Result<Instant> {
        let mut state = self.state();
        if state.child.is_some() {
            return Ok(Instant::now());
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(ServerError::io(
                self.kind,
                format!("cannot open {}", self.log.display()),
            ))?;
        let log_too = log
            .try_clone()
            .map_err(ServerError::io(self.kind, "cannot prepare the command"))?;
        let command = self.launch.command(log, log_too);
        let begun = Instant::now();
        let child = spawn(command, self.launch.run_as).map_err(ServerError::io(
            self.kind,
            format!("cannot run `{}`", self.launch),
        ))?;
        set_registered_pid(self.id, Some(child.id() as libc::pid_t));
        state.child = Some(child);
        state.paused = false;
        Ok(begun)
    }

    /// Waits until the probe answers, the process exits, or the bound passes; returns the time since `begun`.
    pub(crate) fn wait_ready(&self, begun: Instant) -> Result<Duration> {
        let deadline = begun + self.ready_timeout;
        loop {
            let pid = self.state().child.as_ref().map(|c| c.id() as libc::pid_t);
            match pid {
                None => return Err(self.start_failed("it is not running".to_owned())),
                Some(pid) if leader_exited(pid) => {
                    let reason = match self.kill_and_reap() {
                        Some(status) => format!("it exited ({status})"),
                        None => "it exited".to_owned(),
                    };
                    return Err(self.start_failed(reason));
                }
                Some(_) => {}
            }
            if (self.probe)() {
                let took = begun.elapsed();
                self.state().started_in = took;
                eprintln!(
                    "dlock-test-servers: {} ready on {} in {took:.2?}",
                    self.kind, self.label
                );
                return Ok(took);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(
                    self.start_failed(format!("it did not answer within {:?}", self.ready_timeout))
                );
            }
            thread::sleep(if begun.elapsed() < FAST_POLLING_FOR {
                POLL_FAST
            } else {
                POLL
            });
        }
    }

    pub(crate) fn start_failed(&self, reason: String) -> ServerError {
        ServerError::StartFailed {
            server: self.kind,
            reason,
            command: self.launch.to_string(),
            log: self.log.clone(),
            log_tail: self.log_tail(30),
        }
    }

    /// The last `n` lines of the server's log.
    pub(crate) fn log_tail(&self, n: usize) -> String {
        let text = fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        indent(lines[lines.len().saturating_sub(n)..].iter().copied())
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.state().child.as_ref().map(Child::id)
    }

    pub(crate) fn is_running(&self) -> bool {
        let state = self.state();
        match &state.child {
            Some(child) => !leader_exited(child.id() as libc::pid_t),
            None => false,
        }
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.state().paused
    }

    pub(crate) fn started_in(&self) -> Duration {
        self.state().started_in
    }

    fn signal_group(state: &State, signal: libc::c_int) {
        if let Some(child) = &state.child {
            // SAFETY: signalling the process group we created for this child; it is not reaped yet, so the id
            // cannot have been reused.
            unsafe { libc::killpg(child.id() as libc::pid_t, signal) };
        }
    }

    /// Kills the whole process group with SIGKILL and reaps the leader. The directory stays.
    pub(crate) fn kill(&self) {
        self.kill_and_reap();
    }

    fn kill_and_reap(&self) -> Option<std::process::ExitStatus> {
        let mut state = self.state();
        let group = state.child.as_ref().map(|child| child.id() as libc::pid_t);
        // Postgres backends leave the group (`setsid`), and once the postmaster is gone they are
        // nobody's children we can find: name them while the tree still holds them. A backend left
        // alive keeps the old shared memory attached, and the next postmaster refuses to start.
        // Freeze the leader first so that it cannot fork one more between the listing and the kill.
        let descendants = match group {
            Some(leader) => {
                // SAFETY: signalling our own, unreaped child.
                unsafe { libc::kill(leader, libc::SIGSTOP) };
                let deadline = Instant::now() + Duration::from_secs(2);
                while !all_threads_stopped(leader as u32) && Instant::now() < deadline {
                    thread::sleep(Duration::from_millis(1));
                }
                descendants(leader)
            }
            None => Vec::new(),
        };
        Self::signal_group(&state, libc::SIGKILL);
        for &pid in &descendants {
            // SAFETY: `kill` has no memory effects; these are our server's own processes, alive a
            // moment ago.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let status = state.child.take().and_then(|mut child| child.wait().ok());
        state.paused = false;
        set_registered_pid(self.id, None);
        // SIGKILL is delivered asynchronously: the group's other members (Postgres backends,
        // helper processes) may still be dying, holding the port or the old shared memory, which
        // makes an immediate restart fail ("pre-existing shared memory block is still in use").
        if let Some(group) = group {
            let deadline = Instant::now() + Duration::from_secs(10);
            while (group_has_live_members(group) || descendants.iter().any(|&pid| is_alive(pid)))
                && Instant::now() < deadline
            {
                thread::sleep(Duration::from_millis(5));
            }
        }
        status
    }

    /// Asks the server to shut down with its stop signal, waits up to 10 s, then kills what is left.
    pub(crate) fn stop(&self) {
        {
            let mut state = self.state();
            let Some(child) = state.child.as_mut() else {
                return;
            };
            let pid = child.id() as libc::pid_t;
            if state.paused {
                Self::signal_group(&state, libc::SIGCONT);
                state.paused = false;
            }
            // SAFETY: signalling our own, unreaped child.
            unsafe { libc::kill(pid, self.stop_signal) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline && !leader_exited(pid) {
                thread::sleep(Duration::from_millis(10));
            }
        }
        // The leader has exited (but is not reaped, so its group id is still ours) or the wait ran out.
        self.kill();
    }

    /// Stops the server if it runs, starts it again with the same command, port and directory, and waits
    /// until it is ready.
    pub(crate) fn restart(&self) -> Result<Duration> {
        self.stop();
        match self.start() {
            Ok(took) => Ok(took),
            Err(first) => {
                // Seen under load with Postgres: the new postmaster exits at once although its log says
                // it is ready (its predecessor's last children still winding down). A second start
                // succeeds; a server that fails twice is really broken.
                eprintln!(
                    "dlock-test-servers: {} restart failed, trying once more: {first}",
                    self.kind
                );
                self.stop();
                self.start()
            }
        }
    }

    /// Freezes the process group with SIGSTOP, and returns once every thread of the server process has stopped
    /// (a signal is delivered asynchronously: a thread busy on another core could otherwise answer one more
    /// request).
    pub(crate) fn pause(&self) {
        let mut state = self.state();
        let Some(pid) = state.child.as_ref().map(Child::id) else {
            return;
        };
        Self::signal_group(&state, libc::SIGSTOP);
        // Postgres backends leave the group (`setsid`): stop every descendant too, or a paused
        // Postgres would go on answering the connections it already has.
        signal_descendants(pid as libc::pid_t, libc::SIGSTOP);
        state.paused = true;
        let deadline = Instant::now() + Duration::from_secs(2);
        while !all_threads_stopped(pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws the process group with SIGCONT.
    pub(crate) fn resume(&self) {
        let mut state = self.state();
        if let Some(pid) = state.child.as_ref().map(Child::id) {
            signal_descendants(pid as libc::pid_t, libc::SIGCONT);
        }
        Self::signal_group(&state, libc::SIGCONT);
        state.paused = false;
    }
}

/// What `/proc/<pid>/stat` says of one process: the fields after the parenthesised command
/// name (which may contain anything) are the state, the parent's id and the process group.
struct ProcStat {
    pid: libc::pid_t,
    ppid: libc::pid_t,
    pgrp: libc::pid_t,
    /// Exited: a zombie (`Z`) or dead (`X`).
    exited: bool,
}

impl ProcStat {
    fn read(pid: libc::pid_t) -> Option<Self> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, rest) = stat.rsplit_once(')')?;
        let mut fields = rest.split_whitespace();
        let state = fields.next()?;
        Some(Self {
            pid,
            ppid: fields.next()?.parse().ok()?,
            pgrp: fields.next()?.parse().ok()?,
            exited: matches!(state, "Z" | "X"),
        })
    }

    /// Every process's.
    fn all() -> Vec<Self> {
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|entry| Self::read(entry.file_name().to_str()?.parse().ok()?))
            .collect()
    }
}

/// Every descendant of `root` (not `root` itself), wherever their process group is.
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let processes = ProcStat::all();
    let mut family = vec![root];
    let mut i = 0;
    while let Some(&parent) = family.get(i) {
        family.extend(processes.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        i += 1;
    }
    family.remove(0);
    family
}

/// Sends `signal` to every descendant of `root` (not `root` itself), wherever their process
/// group is.
fn signal_descendants(root: libc::pid_t, signal: libc::c_int) {
    for pid in descendants(root) {
        // SAFETY: `kill` has no memory effects; these are our server's own children, alive a
        // moment ago.
        unsafe { libc::kill(pid, signal) };
    }
}

/// Whether `pid` is a process that has not exited (a zombie has).
fn is_alive(pid: libc::pid_t) -> bool {
    ProcStat::read(pid).is_some_and(|p| !p.exited)
}

/// Whether any process that has not exited is still in process group `group`.
fn group_has_live_members(group: libc::pid_t) -> bool {
    ProcStat::all().iter().any(|p| p.pgrp == group && !p.exited)
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/<pid>/task/<tid>/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            // The state follows the command name, which is in parentheses and may contain anything.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_none_or(|state| matches!(state, 'T' | 't' | 'Z' | 'X'))
        })
    })
}

/// Whether the child `pid` has exited, without reaping it.
fn leader_exited(pid: libc::pid_t) -> bool {
    // SAFETY: waitid writes into the zeroed siginfo we pass.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() != 0
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        unregister(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_program_says_how_to_install_it() {
        let err = find_program("redis", "dlock-no-such-server").unwrap_err();
        assert!(err.is_not_installed());
        let message = err.to_string();
        assert!(message.contains("scripts/install-servers"), "{message}");
        assert!(message.contains("dlock-no-such-server"), "{message}");
    }

    #[test]
    fn a_failed_start_shows_the_command_and_the_log() {
        let dir = temp_dir("selftest").unwrap();
        let launch =
            Launch::new("/bin/sh").args(["-c", "echo listening failed: port in use; exit 3"]);
        let proc = Proc::new(
            "selftest",
            "nowhere".into(),
            dir,
            launch,
            Box::new(|| false),
            Duration::from_secs(5),
            libc::SIGTERM,
        );
        let message = proc.start().unwrap_err().to_string();
        assert!(message.contains("exit status: 3"), "{message}");
        assert!(message.contains("port in use"), "{message}");
        assert!(message.contains("/bin/sh -c"), "{message}");
    }

    #[test]
    fn a_server_that_never_answers_times_out() {
        let dir = temp_dir("selftest").unwrap();
        let proc = Proc::new(
            "selftest",
            "nowhere".into(),
            dir,
            Launch::new("/bin/sleep").arg("60"),
            Box::new(|| false),
            Duration::from_millis(300),
            libc::SIGTERM,
        );
        let message = proc.start().unwrap_err().to_string();
        assert!(message.contains("did not answer within"), "{message}");
        assert!(!proc.is_running());
    }
}
