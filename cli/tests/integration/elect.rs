//! `dlock elect --again` on three "machines" (processes) against a real Redis: one command
//! runs at a time, with its term in `DLOCK_TERM`; the leader's machine is killed, and exactly
//! one command runs again within the lease, with a larger term. `dlock leader` names it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test_servers::RedisServer;

/// Terms that have started a command: `lead.TERM` files, each holding the term and the pid of
/// the `dlock elect` that started it.
fn leaders(dir: &Path) -> Vec<(u64, u32)> {
    let mut found: Vec<(u64, u32)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("lead.")?.parse::<u64>().ok()?;
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let mut fields = text.split_whitespace();
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        })
        .collect();
    found.sort_unstable();
    found
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn candidate(url: &str, dir: &Path) -> Child {
    // The command records its term and its parent (the `dlock elect` running it), then stays up
    // as a scheduler would.
    let script = format!(
        "echo \"$DLOCK_TERM $PPID\" > {dir}/tmp.$$ && mv {dir}/tmp.$$ {dir}/lead.$DLOCK_TERM; exec sleep 600",
        dir = dir.display()
    );
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["elect", "--again", "--ttl", "2s", "--backend", url])
        .args(["scheduler", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run dlock elect")
}

/// Kills a "machine": the `dlock elect` process and its command's process group, with SIGKILL,
/// so nothing is released.
fn kill_machine(pid: u32) {
    let pid = pid as libc::pid_t;
    // The command runs in a process group of its own, whose id is the command's pid: find the
    // children of `pid` and kill their groups, then `pid` itself.
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace() {
        if let Ok(child) = child.parse::<libc::pid_t>() {
            // SAFETY: kill(2) has no memory effects.
            unsafe {
                libc::kill(-child, libc::SIGKILL);
            }
        }
    }
    // SAFETY: as above.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// The term `dlock leader --json` reports for `scheduler`.
fn leader_term(url: &str) -> u64 {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["leader", "--json", "--backend", url, "scheduler"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    doc["leader"]["term"]
        .as_u64()
        .unwrap_or_else(|| panic!("no leader's term in {doc}"))
}

#[test]
fn elect_again_hands_the_job_to_exactly_one_survivor_with_a_larger_term() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let dir: PathBuf = std::env::temp_dir().join(format!("dlock-elect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut machines: Vec<Child> = (0..3).map(|_| candidate(&redis.url(), &dir)).collect();

    until("a first leader's command", || leaders(&dir).len() == 1);
    let (first_term, first_pid) = leaders(&dir)[0];
    assert_eq!(leader_term(&redis.url()), first_term);

    kill_machine(first_pid);
    until(
        "the next leader's command after the leader's machine died",
        || leaders(&dir).len() >= 2,
    );
    let after = leaders(&dir);
    assert_eq!(after.len(), 2, "more than one command started: {after:?}");
    let (second_term, second_pid) = after[1];
    assert!(second_term > first_term, "{after:?}");
    assert_ne!(second_pid, first_pid);

    // The server names the survivor's term, and no third command started beside it.
    assert_eq!(leader_term(&redis.url()), second_term, "{after:?}");
    assert_eq!(
        leaders(&dir).len(),
        2,
        "a third command started: {:?}",
        leaders(&dir)
    );

    for machine in &mut machines {
        // SAFETY: kill(2) on children we spawned.
        unsafe {
            libc::kill(machine.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    for mut machine in machines {
        let _ = machine.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
