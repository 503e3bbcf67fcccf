//! How to start a program (enough to start it again after a kill), and finding it.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::spawn::{RunAs, spawn};
use crate::error::{Result, ServerError};

/// How to start a program: enough to start it again after a kill.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    pub(super) run_as: Option<RunAs>,
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

    pub(super) fn command(&self, stdout: File, stderr: File) -> Command {
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
        let deadline = super::after(Instant::now(), timeout);
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

pub(super) fn indent<'a>(lines: impl Iterator<Item = &'a str>) -> String {
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
