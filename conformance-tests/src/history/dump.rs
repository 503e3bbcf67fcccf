//! Writing a failed run down, so it can be read after the test process is gone.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::checker::{Input, Report};

/// Writes `input` and `report` to a new directory under `parent` and returns its path:
/// `history.jsonl` (every worker's events merged in time order), `register.jsonl` and
/// `register-sets.json`, `shadow.jsonl` and `shadow-sets.json` (if there was a shadow),
/// `nemesis.jsonl`, and `notes.txt` (seed, notes, deaths, residue, torn files, the report).
pub fn dump(input: &Input, report: &Report, parent: &Path) -> io::Result<PathBuf> {
    let run = input.events.first().map_or("run", |e| e.run.as_str());
    let dir = fresh_dir(parent, run)?;

    let mut merged: Vec<_> = input.events.iter().collect();
    merged.sort_by_key(|e| (e.t, e.worker, e.handle));
    write_jsonl(&dir.join("history.jsonl"), &merged)?;
    write_jsonl(&dir.join("register.jsonl"), &input.register.log)?;
    write_json(&dir.join("register-sets.json"), &input.register.sets)?;
    if let Some(shadow) = &input.shadow {
        write_jsonl(&dir.join("shadow.jsonl"), &shadow.log)?;
        write_json(&dir.join("shadow-sets.json"), &shadow.sets)?;
    }
    write_jsonl(&dir.join("nemesis.jsonl"), &input.nemesis)?;

    let mut notes = String::new();
    let seed = input.seed.map_or("none".to_owned(), |s| s.to_string());
    let _ = writeln!(notes, "seed: {seed}");
    for note in &input.notes {
        let _ = writeln!(notes, "note: {note}");
    }
    for (worker, t) in &input.deaths {
        let _ = writeln!(notes, "worker {worker} killed at t={t}");
    }
    if let Some(max) = input.earlier_max_token {
        let _ = writeln!(notes, "earlier run's max token: {max}");
    }
    for path in &input.torn {
        let _ = writeln!(notes, "torn last line skipped: {}", path.display());
    }
    let _ = writeln!(notes, "\n{report}");
    std::fs::write(dir.join("notes.txt"), notes)?;
    Ok(dir)
}

/// `parent/history-<run>-<n>` for the first `n` not taken yet.
fn fresh_dir(parent: &Path, run: &str) -> io::Result<PathBuf> {
    std::fs::create_dir_all(parent)?;
    let run: String = run
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    for n in 0u32.. {
        let dir = parent.join(format!("history-{run}-{n}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("no free dump directory name"))
}

fn write_jsonl<T: Serialize>(path: &Path, records: &[T]) -> io::Result<()> {
    let mut text = Vec::new();
    for record in records {
        serde_json::to_writer(&mut text, record).map_err(io::Error::other)?;
        text.push(b'\n');
    }
    std::fs::write(path, text)
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    std::fs::write(path, text)
}
