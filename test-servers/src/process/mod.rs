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

mod launch;
mod procfs;
mod registry;
mod spawn;

pub(crate) use launch::{Launch, find_program};
pub(crate) use registry::temp_dir;
pub(crate) use spawn::RunAs;

use std::fmt;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{Result, ServerError};
use launch::indent;
use procfs::{
    all_threads_stopped, descendants, group_has_live_members, is_alive, leader_exited,
    signal_descendants,
};
use registry::{register, set_registered_pid, unregister};

/// How long `stop()` waits for a clean exit before it kills.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Pause between readiness polls: short at first (most servers answer within a few tens of ms), then longer.
const POLL_FAST: Duration = Duration::from_millis(10);
const POLL: Duration = Duration::from_millis(50);
const FAST_POLLING_FOR: Duration = Duration::from_millis(500);

/// The instant `delay` after `start`, for a wait's deadline: a delay too long for the clock (a
/// caller's `Duration::MAX`) is cut to a year, which no test waits out. It is
/// `dlock_api::raw::time::after` on std's clock: this crate does not depend on dlock-api.
pub(crate) fn after(start: Instant, delay: Duration) -> Instant {
    start
        .checked_add(delay)
        .or_else(|| start.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(start)
}

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
        let child = spawn::spawn(command, self.launch.run_as).map_err(ServerError::io(
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
        let deadline = after(begun, self.ready_timeout);
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
                let deadline = after(Instant::now(), Duration::from_secs(2));
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
            let deadline = after(Instant::now(), Duration::from_secs(10));
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
            let deadline = after(Instant::now(), STOP_TIMEOUT);
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
        let deadline = after(Instant::now(), Duration::from_secs(2));
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
    fn a_deadline_past_the_clock_is_cut_not_a_panic() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(3600));
        assert_eq!(after(now, Duration::ZERO), now);
        assert_eq!(
            after(now, Duration::from_secs(2)),
            now + Duration::from_secs(2)
        );
    }

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
