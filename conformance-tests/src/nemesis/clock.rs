//! A wall clock the harness steps under its workers: libfaketime preloaded into the worker
//! processes, reading the offset from a file the harness rewrites.
//!
//! Only the wall clock (`CLOCK_REALTIME`, `SystemTime`) moves: the monotonic clock is left
//! alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`), both because the histories are stamped with it and
//! because a lock library must time leases on it, which is what the step checks.

use std::path::{Path, PathBuf};

use super::Run;
use crate::Failure;
use crate::history::Edge;

/// Where Debian and a source build put the library.
const LIBRARY_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime",
    "/usr/lib/aarch64-linux-gnu/faketime",
    "/usr/lib/faketime",
    "/usr/local/lib/faketime",
];

// The thread-safe build: a worker runs a multi-thread runtime.
const LIBRARY: &str = "libfaketimeMT.so.1";

/// The offset file of a run's workers; see the [module docs](self).
#[derive(Debug)]
pub struct SteppedClock {
    file: PathBuf,
    library: PathBuf,
}

impl SteppedClock {
    /// Finds libfaketime and starts the clock at the true time.
    ///
    /// # Errors
    /// Without libfaketime (the message says how to install it), or when the file cannot be
    /// written.
    pub fn new(run: &Run) -> Result<Self, Failure> {
        Self::in_dir(&run.dir)
    }

    /// A clock whose offset file lives in `dir`: for a process the harness starts itself (a
    /// server), outside a run.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn in_dir(dir: &Path) -> Result<Self, Failure> {
        let library = LIBRARY_DIRS
            .iter()
            .map(|dir| Path::new(dir).join(LIBRARY))
            .find(|path| path.is_file())
            .ok_or_else(|| {
                Failure(format!(
                    "{LIBRARY} not found in {LIBRARY_DIRS:?}: install libfaketime (Debian \
                     package `faketime`; scripts/install-servers does it)"
                ))
            })?;
        let clock = Self {
            file: dir.join("wall-clock-offset"),
            library,
        };
        clock.set("+0")?;
        Ok(clock)
    }

    /// The environment that puts a worker on this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("LD_PRELOAD", self.library.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            // Re-read the file at most once a second: a step shows within a second.
            ("FAKETIME_CACHE_DURATION", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// Steps the workers' wall clock to `offset` from the true time (`+1h`, `-1h`, `+0`) and
    /// logs it.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn step(&self, run: &Run, offset: &str) -> Result<(), Failure> {
        self.set(offset)?;
        let edge = if offset == "+0" {
            Edge::Stop
        } else {
            Edge::Start
        };
        run.log(edge, format!("wall clock of the workers at {offset}"));
        Ok(())
    }

    /// Sets the offset (`+1h`, `-1h`, `+0`) without logging it: for a clock outside a run.
    /// Writes beside and renames over, so a process never reads half a line.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn set(&self, offset: &str) -> Result<(), Failure> {
        let next = self.file.with_extension("next");
        std::fs::write(&next, format!("{offset}\n"))
            .and_then(|()| std::fs::rename(&next, &self.file))
            .map_err(|e| Failure(format!("cannot write the wall clock's offset: {e}")))
    }
}
