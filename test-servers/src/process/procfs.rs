//! What `/proc` says of a process and its descendants, and signals to them.

use std::fs;

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
pub(super) fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let processes = ProcStat::all();
    let mut family = vec![root];
    let mut i = 0;
    while let Some(&parent) = family.get(i) {
        family.extend(processes.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        i = i.saturating_add(1);
    }
    family.remove(0);
    family
}

/// Sends `signal` to every descendant of `root` (not `root` itself), wherever their process
/// group is.
pub(super) fn signal_descendants(root: libc::pid_t, signal: libc::c_int) {
    for pid in descendants(root) {
        // SAFETY: `kill` has no memory effects; these are our server's own children, alive a
        // moment ago.
        unsafe { libc::kill(pid, signal) };
    }
}

/// Whether `pid` is a process that has not exited (a zombie has).
pub(super) fn is_alive(pid: libc::pid_t) -> bool {
    ProcStat::read(pid).is_some_and(|p| !p.exited)
}

/// Whether any process that has not exited is still in process group `group`.
pub(super) fn group_has_live_members(group: libc::pid_t) -> bool {
    ProcStat::all().iter().any(|p| p.pgrp == group && !p.exited)
}

/// Whether every thread of `pid` is in the stopped state (`T` in `/proc/<pid>/task/<tid>/stat`).
pub(super) fn all_threads_stopped(pid: u32) -> bool {
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
pub(super) fn leader_exited(pid: libc::pid_t) -> bool {
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
