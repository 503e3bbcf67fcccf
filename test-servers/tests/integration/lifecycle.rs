//! Self-tests: no orphan servers or directories, whatever way the test process ends; shared instances.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test_servers::{RedisServer, Resp, shared_redis};

const CHILD_ENV: &str = "DLOCK_TEST_SERVERS_CHILD";

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
    })
}

fn wait_gone(pid: u32, dir: Option<&Path>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) || dir.is_some_and(Path::exists) {
        assert!(
            Instant::now() < deadline,
            "server {pid} or its directory {dir:?} outlived the test process"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs this test binary's `child` test with `mode`; returns the child's server pid and directory.
fn run_child(mode: &str) -> (u32, std::path::PathBuf, std::process::ExitStatus) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lifecycle::child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut pid, mut dir) = (None, None);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // The harness may print `test child ... ` in front of the first line.
        if let Some((_, p)) = line.split_once("SERVER-PID ") {
            pid = Some(p.trim().parse().unwrap());
        }
        if let Some((_, d)) = line.split_once("SERVER-DIR ") {
            dir = Some(d.trim().into());
        }
    }
    let status = child.wait().unwrap();
    (
        pid.expect("child reported its server"),
        dir.unwrap(),
        status,
    )
}

/// Not a test on its own: the body of the child processes above (does nothing unless `CHILD_ENV` is set).
#[test]
fn child() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    // Started from a thread that ends at once: the server must survive that thread.
    let redis = std::thread::spawn(shared_redis).join().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        redis.command(&["PING"]).unwrap(),
        Resp::Simple("PONG".into())
    );
    println!("SERVER-PID {}", redis.pid().unwrap());
    println!("SERVER-DIR {}", redis.dir().display());
    match mode.as_str() {
        "abort" => std::process::abort(),
        "panic" => panic!("a test panics while holding servers"),
        _ => {}
    }
}

#[test]
fn a_shared_server_is_cleaned_up_when_the_process_exits() {
    let (pid, dir, status) = run_child("exit");
    assert!(status.success());
    wait_gone(pid, Some(&dir));
}

#[test]
fn servers_die_when_a_test_panics() {
    let (pid, dir, status) = run_child("panic");
    assert!(!status.success());
    wait_gone(pid, Some(&dir));
}

#[test]
fn servers_die_when_the_test_process_is_killed() {
    let (pid, _dir, status) = run_child("abort");
    assert!(!status.success());
    // No exit handler runs on abort: PDEATHSIG kills the server (the directory is swept by a later run).
    wait_gone(pid, None);
}

#[test]
fn shared_instances_are_one_per_binary() {
    let a = std::thread::spawn(|| shared_redis().pid()).join().unwrap();
    let b = std::thread::spawn(|| shared_redis().pid()).join().unwrap();
    assert_eq!(a, b);
    assert!(a.is_some());
}

#[test]
fn the_server_outlives_the_thread_that_started_it() {
    let redis = std::thread::spawn(|| RedisServer::start().unwrap())
        .join()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        redis.command(&["PING"]).unwrap(),
        Resp::Simple("PONG".into())
    );
}
