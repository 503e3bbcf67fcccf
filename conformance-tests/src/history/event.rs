//! What workers and the nemesis write down, and how it is stored: one JSON object per line.
//!
//! Every worker process appends an [`Event`] before each call it makes (phase `invoke`) and
//! after it returns (`ok`, `fail`, or `info` when the outcome is unknown), to its own file.
//! Each line is written and flushed on its own, so a worker killed with `SIGKILL` loses at most
//! the line it was writing; [`read_jsonl`] skips such a torn last line and reports it. The
//! harness logs the faults it injects the same way, as [`NemesisRecord`]s.
//!
//! Conventions of a run directory: `worker-<id>.jsonl` per worker ([`worker_file`]) and
//! [`NEMESIS_FILE`] for the nemesis.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::clock::now_ns;

/// One hold attempt: the worker that made it and its number within that worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HoldId {
    /// The worker's id in the run.
    pub worker: u32,
    /// Unique within the worker: one per acquire call, shared by everything done under it.
    pub handle: u64,
}

impl std::fmt::Display for HoldId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "w{}/h{}", self.worker, self.handle)
    }
}

/// The operation an [`Event`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `acquire` / `try_acquire`; `ok` carries the token and the deadline.
    Acquire,
    /// `release`; the hold ends when it is *invoked*.
    Release,
    /// `extend`; `ok` carries the new deadline.
    Extend,
    /// The guard's lost signal fired (phase `info`).
    Lost,
    /// A read of the fenced register.
    FrRead,
    /// A write to the fenced register.
    FrWrite,
}

/// Where in a call an [`Event`] was written (the usual convention of history checkers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Just before the call.
    Invoke,
    /// The call succeeded.
    Ok,
    /// The call failed and certainly had no effect.
    Fail,
    /// The outcome is unknown (a timeout, a lost reply), or a notification.
    Info,
}

/// One line of a worker's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The run (one fault test execution) it belongs to.
    pub run: String,
    /// The worker's id in the run.
    pub worker: u32,
    /// The worker's OS process id, for matching with the nemesis log.
    pub pid: u32,
    /// The hold attempt this event belongs to (see [`HoldId::handle`]).
    pub handle: u64,
    /// The lock name.
    pub name: String,
    /// What was called.
    pub op: Op,
    /// Where in the call.
    pub phase: Phase,
    /// [`now_ns`] just before the call (`invoke`) or just after it returned.
    pub t: u64,
    /// The fencing token: granted (`acquire` `ok`) or used (register writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The guard's deadline on the host clock (`acquire`/`extend` `ok`); none for session locks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<u64>,
    /// The error, for `fail` and `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err: Option<String>,
    /// On `acquire` events of a semaphore, its number of permits: the hold is one of that many
    /// that may be valid at once. None for a lock (one holder at a time), so a history written
    /// before semaphores reads as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// On `acquire` events of a reader-writer lock's reader: the hold is a shared one, which any
    /// number of other readers' may meet but no writer's (the name's lock). False for a lock, a
    /// writer and a permit, so a history written before reader-writer locks reads as it did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

impl Event {
    /// An event at `t` with no token, deadline or error.
    pub fn at(t: u64, run: &str, hold: HoldId, name: &str, op: Op, phase: Phase) -> Self {
        Self {
            run: run.to_owned(),
            worker: hold.worker,
            pid: std::process::id(),
            handle: hold.handle,
            name: name.to_owned(),
            op,
            phase,
            t,
            token: None,
            valid_until: None,
            err: None,
            permits: None,
            shared: false,
        }
    }

    /// [`Event::at`] now.
    pub fn now(run: &str, hold: HoldId, name: &str, op: Op, phase: Phase) -> Self {
        Self::at(now_ns(), run, hold, name, op, phase)
    }

    /// The hold attempt this event belongs to.
    pub fn hold(&self) -> HoldId {
        HoldId {
            worker: self.worker,
            handle: self.handle,
        }
    }

    /// With a token.
    pub fn token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    /// With a deadline (host-clock nanoseconds).
    pub fn valid_until(mut self, ns: u64) -> Self {
        self.valid_until = Some(ns);
        self
    }

    /// With a semaphore's number of permits (`None`: a lock).
    pub fn permits(mut self, permits: Option<u32>) -> Self {
        self.permits = permits;
        self
    }

    /// As a reader's (`true`) or not.
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// With an error.
    pub fn err(mut self, err: impl Into<String>) -> Self {
        self.err = Some(err.into());
        self
    }
}

/// Whether a fault starts or stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Edge {
    /// The fault begins (pause, blackhole, clock jump, kill…).
    Start,
    /// The fault is healed (resume, heal, restart…).
    Stop,
}

/// One line of the nemesis log: a fault the harness injected or healed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NemesisRecord {
    /// [`now_ns`] when the harness acted.
    pub t: u64,
    /// Start or stop.
    pub edge: Edge,
    /// What, in words: `pause pid 4242`, `blackhole fr-proxy`, `restart redis`.
    pub what: String,
}

/// The nemesis log's file name in a run directory.
pub const NEMESIS_FILE: &str = "nemesis.jsonl";

/// A worker's history file in a run directory: `worker-<id>.jsonl`.
pub fn worker_file(dir: &Path, worker: u32) -> PathBuf {
    dir.join(format!("worker-{worker}.jsonl"))
}

/// Appends records to a JSONL file, one `write` and flush per line. Clones share the file, so
/// the tasks of one worker can log through one writer.
#[derive(Clone, Debug)]
pub struct HistoryWriter {
    file: Arc<Mutex<File>>,
}

impl HistoryWriter {
    /// Opens `path` for appending, creating it. A torn last line left by an earlier writer that
    /// was killed is cut off first, so new lines start on a line of their own.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        if !text.is_empty() && !text.ends_with(b"\n") {
            let keep = text
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i.saturating_add(1));
            file.set_len(u64::try_from(keep).unwrap_or(u64::MAX))?;
            file.seek(SeekFrom::End(0))?;
        }
        Ok(Self {
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// Appends `record` as one line and flushes it. Blocks briefly (one small write); fine from
    /// async code in a test worker.
    pub fn append<T: Serialize>(&self, record: &T) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(&line)?;
        file.flush()
    }
}

/// Records read from JSONL files.
#[derive(Clone, Debug, Default)]
pub struct Loaded<T> {
    /// Every complete record, file by file, in file order.
    pub records: Vec<T>,
    /// The files whose last line was torn (cut off by a kill) and skipped.
    pub torn: Vec<PathBuf>,
}

/// Reads every record of `paths`. A last line without its newline that does not parse is a
/// torn write and is skipped (listed in [`Loaded::torn`]); any other bad line is an error
/// naming the file and line.
pub fn read_jsonl<T: DeserializeOwned>(paths: &[PathBuf]) -> io::Result<Loaded<T>> {
    let mut loaded = Loaded {
        records: Vec::new(),
        torn: Vec::new(),
    };
    for path in paths {
        let text = std::fs::read_to_string(path)?;
        let complete = text.ends_with('\n');
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(line) {
                Ok(record) => loaded.records.push(record),
                Err(_) if !complete && i.saturating_add(1) == lines.len() => {
                    loaded.torn.push(path.clone())
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}:{}: {e}", path.display(), i.saturating_add(1)),
                    ));
                }
            }
        }
    }
    Ok(loaded)
}

/// The worker histories of a run directory (every `worker-*.jsonl`, in name order).
pub fn read_history_dir(dir: &Path) -> io::Result<Loaded<Event>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("worker-") && name.ends_with(".jsonl") {
            paths.push(path);
        }
    }
    paths.sort();
    read_jsonl(&paths)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // Tests may panic.
mod tests {
    use super::*;
    use crate::history::testutil::temp_dir;

    fn event(handle: u64, phase: Phase) -> Event {
        let hold = HoldId { worker: 1, handle };
        Event::at(10 + handle, "r", hold, "n", Op::Acquire, phase).token(handle)
    }

    #[test]
    fn events_round_trip_with_optional_fields_left_out() {
        let e = event(3, Phase::Ok).valid_until(99);
        let line = serde_json::to_string(&e).unwrap();
        assert!(line.contains(r#""op":"acquire""#) && line.contains(r#""phase":"ok""#));
        assert!(!line.contains("err"), "{line}");
        assert_eq!(serde_json::from_str::<Event>(&line).unwrap(), e);
        let fr = Event::at(1, "r", e.hold(), "n", Op::FrWrite, Phase::Info).err("timeout");
        let line = serde_json::to_string(&fr).unwrap();
        assert!(line.contains(r#""op":"fr_write""#), "{line}");
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_reported() {
        let dir = temp_dir("torn");
        let writer = HistoryWriter::open(&worker_file(&dir, 1)).unwrap();
        writer.append(&event(1, Phase::Invoke)).unwrap();
        writer.append(&event(1, Phase::Ok)).unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(worker_file(&dir, 1))
            .unwrap();
        f.write_all(br#"{"run":"r","worker":1,"pid":7,"hand"#)
            .unwrap();
        HistoryWriter::open(&worker_file(&dir, 2))
            .unwrap()
            .append(&event(2, Phase::Invoke))
            .unwrap();
        std::fs::write(dir.join(NEMESIS_FILE), "not an event\n").unwrap();

        let loaded = read_history_dir(&dir).unwrap();
        assert_eq!(loaded.records.len(), 3);
        assert_eq!(loaded.torn, vec![worker_file(&dir, 1)]);

        // A writer reopening the file cuts the torn tail and carries on.
        let writer = HistoryWriter::open(&worker_file(&dir, 1)).unwrap();
        writer.append(&event(3, Phase::Invoke)).unwrap();
        let loaded = read_history_dir(&dir).unwrap();
        assert_eq!(loaded.records.len(), 4);
        assert!(loaded.torn.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_line_in_the_middle_is_an_error() {
        let dir = temp_dir("bad");
        let path = dir.join("x.jsonl");
        std::fs::write(&path, "{\"t\":1}\n{oops\n{\"t\":2}\n").unwrap();
        let err = read_jsonl::<serde_json::Value>(std::slice::from_ref(&path)).unwrap_err();
        assert!(err.to_string().contains("x.jsonl:2"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn nemesis_records_read_back() {
        let dir = temp_dir("nemesis");
        let path = dir.join(NEMESIS_FILE);
        let writer = HistoryWriter::open(&path).unwrap();
        let pause = NemesisRecord {
            t: 5,
            edge: Edge::Start,
            what: "pause pid 42".into(),
        };
        writer.append(&pause).unwrap();
        let loaded = read_jsonl::<NemesisRecord>(&[path]).unwrap();
        assert_eq!(loaded.records, vec![pause]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
