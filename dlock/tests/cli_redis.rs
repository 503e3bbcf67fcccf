//! `dlock run` against a real Redis: the command is stopped when the lock is lost.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test_servers::RedisServer;

#[test]
fn run_stops_the_command_and_exits_74_when_the_lock_is_lost() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let marker = tempfile_path("dlock-run-marker");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args([
            "run",
            "--backend",
            &redis.url(),
            "--ttl",
            "2s",
            "--kill-after",
            "1s",
            "cli-lost",
        ])
        // The shell starts a grandchild and records its pid: stopping must reach it too.
        .args([
            "--",
            "sh",
            "-c",
            &format!("sleep 60 & echo $! > {marker}.tmp; mv {marker}.tmp {marker}; wait"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock");
    // Wait (bounded) until the command runs under the lock, then take the lock away server-side.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::path::Path::new(&marker).exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let deleted = redis.command(&["DEL", "dlock:{cli-lost}"]).unwrap();
    assert_eq!(
        deleted.as_text().as_deref(),
        Some("1"),
        "the lock key was there"
    );

    // Renewal finds the key gone within a third of the TTL; dlock stops `sleep 60` long before it ends.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "dlock did not stop the command"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // The grandchild was stopped with the command (a zombie awaiting its reaper counts as gone).
    let grandchild = std::fs::read_to_string(&marker).unwrap().trim().to_owned();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{grandchild}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    };
    let waited = Instant::now();
    while alive() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "the command's child {grandchild} outlived the lost lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(74), "{stderr}");
    assert!(stderr.contains("lost"), "{stderr}");
    let _ = std::fs::remove_file(&marker);
}

fn tempfile_path(prefix: &str) -> String {
    let dir = std::env::temp_dir();
    format!(
        "{}/{prefix}-{}-{}",
        dir.display(),
        std::process::id(),
        rand_suffix()
    )
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}
