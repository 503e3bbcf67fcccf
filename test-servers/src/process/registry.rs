//! Every live server and its directory, killed and removed at exit; and the temporary
//! directories, with those of killed test processes swept.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};

use tempfile::TempDir;

use crate::error::{Result, ServerError};

/// Prefix of every directory this crate creates in the temporary directory.
const DIR_PREFIX: &str = "dlock-test-";

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

pub(super) fn register(dir: &Path) -> u64 {
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

pub(super) fn set_registered_pid(id: u64, pid: Option<libc::pid_t>) {
    if let Some(entry) = registry().as_mut().and_then(|m| m.get_mut(&id)) {
        entry.pid = pid;
    }
}

pub(super) fn unregister(id: u64) {
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
