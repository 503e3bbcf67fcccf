//! The CLI against a real Redis: `dlock run` stops the command when the lock is lost,
//! `dlock conformance --faults` certifies a server it does not own, and `dlock status` shows the
//! holder, its token and the lease it has left.

use crate::common;
use crate::common::tempfile_path;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test_servers::{RedisCluster, RedisSentinel, RedisServer};

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
    until_started(&marker);
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

/// Waits (within 30 s) until the command under the lock has made `marker`.
fn until_started(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::path::Path::new(marker).exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command that cannot be started leaves the lock free when `dlock run` exits: the lock it took
/// for the command is released before the process ends, not left to its lease.
#[test]
fn run_of_a_missing_command_leaves_the_lock_free() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let missing = tempfile_path("dlock-missing-command");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args([
            "run",
            "--backend",
            &redis.url(),
            "cli-nostart",
            "--",
            &missing,
        ])
        .output()
        .expect("run dlock");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    let held = redis.command(&["EXISTS", "dlock:{cli-nostart}"]).unwrap();
    assert_eq!(
        held.as_text().as_deref(),
        Some("0"),
        "the lock outlived `dlock run`: {stderr}"
    );
}

/// SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGQUIT while `dlock run` waits ends the wait cleanly:
/// dlock exits 128 + the signal's number, as a shell reports a command killed by it, its place in the server's queue is
/// gone by the time it has exited, and the command never runs.
#[test]
fn run_interrupted_while_waiting_leaves_no_waiter() {
    use dlock_api::{LockName, LockOptions};
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let locks = runtime.block_on(dlock::connect(&redis.url())).unwrap();
    let name = LockName::new("cli-interrupted").unwrap();
    let opts = LockOptions::new();
    let holder = runtime.block_on(locks.acquire(&name, &opts)).unwrap();
    let waiters = || runtime.block_on(locks.inspect(&name)).unwrap().waiters;
    for (signal, code) in [
        (libc::SIGINT, 130),
        (libc::SIGTERM, 143),
        (libc::SIGHUP, 129),
        (libc::SIGQUIT, 131),
    ] {
        let marker = tempfile_path("dlock-interrupted-ran");
        let child = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["run", "--backend", &redis.url(), name.as_str()])
            .args(["--", "touch", &marker])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run dlock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while waiters() != Some(1) {
            assert!(Instant::now() < deadline, "dlock run never queued");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on the child we spawned and have not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let out = child.wait_with_output().expect("wait for dlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains("interrupted"), "{stderr}");
        assert_eq!(
            waiters(),
            Some(0),
            "an interrupted `dlock run` left its waiter: {stderr}"
        );
        assert!(
            !std::path::Path::new(&marker).exists(),
            "the command ran without the lock"
        );
    }
    // No ghost waiter is owed the lock: another client takes it at once after the release.
    runtime.block_on(holder.release()).unwrap();
    let next = runtime.block_on(locks.try_acquire(&name, &opts)).unwrap();
    assert!(next.is_some(), "the lock was not free after its release");
    runtime.block_on(next.unwrap().release()).unwrap();
}

/// `dlock conformance --faults` against a server it does not own: the worker-process cases run,
/// and so do the link-fault cases, through a fault proxy the CLI starts in front of the server;
/// the cases that need power over the server say so and do not run.
#[test]
fn conformance_with_faults_runs_the_proxy_cases_against_a_deployed_server() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let stdout = common::succeeds([
        "conformance",
        "--backend",
        &redis.url(),
        "--faults",
        "--filter",
        "faults::",
    ]);
    for case in [
        "faults::paused_holder_is_fenced_off",
        "faults::partitioned_holder_is_fenced_off",
        "faults::lost_acquire_reply_leaves_nothing",
        "faults::slow_link_keeps_exclusion",
    ] {
        assert!(
            stdout.contains(&format!("ok       {case} (")),
            "{case} did not pass:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("skipped  faults::frozen_server_holds_no_one_twice"),
        "{stdout}"
    );
}

/// `dlock conformance --faults` against a Sentinel deployment and a Redis Cluster: the CLI asks
/// each for the data nodes it announces, puts a proxy in front of every server, and its proxied
/// clients reach the announced nodes through `nat_map`, so the link cases cut what they must.
#[test]
fn conformance_with_faults_runs_the_link_cases_on_sentinel_and_cluster() {
    let sentinel = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let sentinels: Vec<String> = sentinel
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    let sentinel_url = format!(
        "redis+sentinel://{}/{}",
        sentinels.join(","),
        sentinel.master_name()
    );
    let cluster = RedisCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let nodes: Vec<String> = cluster.addrs().iter().map(ToString::to_string).collect();
    // One seed: the others are reached as the Cluster announces them.
    let cluster_url = format!("redis+cluster://{}", nodes[0]);
    for url in [sentinel_url, cluster_url] {
        let stdout = common::succeeds([
            "conformance",
            "--backend",
            &url,
            "--faults",
            "--filter",
            "faults::partitioned_holder_is_fenced_off",
            "--filter",
            "faults::lost_release_reply_spares_the_next_holder",
        ]);
        for case in [
            "faults::partitioned_holder_is_fenced_off",
            "faults::lost_release_reply_spares_the_next_holder",
        ] {
            assert!(
                stdout.contains(&format!("ok       {case} (")),
                "{case} did not pass on {url}:\n{stdout}"
            );
        }
    }
}

/// `dlock conformance --faults --long`: the long run goes through every fault in turn (here a
/// single round: the shortest run asked for still runs each once) and the checker passes it.
#[test]
fn conformance_long_run_passes_every_fault_in_turn() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let stdout = common::succeeds([
        "conformance",
        "--backend",
        &redis.url(),
        "--faults",
        "--long",
        "1s",
        "--workers",
        "6",
        "--filter",
        "faults::long_run",
    ]);
    assert!(
        stdout.contains("ok       faults::long_run_under_every_nemesis ("),
        "{stdout}"
    );
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
}

/// `dlock status` against a server that needs a password: the line of a held name shows the
/// holder's token and a lease at most the TTL, a free name shows free, `--json` carries the
/// same, `--watch --count` refreshes, and the password is never printed.
#[test]
fn status_shows_the_holder_token_and_lease_left() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    redis
        .command(&["CONFIG", "SET", "requirepass", "s3cret"])
        .unwrap();
    let url = format!("redis://:s3cret@{}", redis.addr());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ttl = Duration::from_secs(20);
    let (locks, guard) = runtime.block_on(async {
        use dlock_api::DistributedLockExt;
        let locks = dlock::connect(&url).await.unwrap();
        let opts = dlock_api::LockOptions::new().with_ttl(ttl);
        let guard = locks
            .try_acquire_str("cli-status/held", &opts)
            .await
            .unwrap()
            .unwrap();
        (locks, guard)
    });
    let status = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["status", "--backend", &url])
            .args(extra)
            .args(["cli-status/held", "cli-status/free"])
            .env_remove("DLOCK_URL")
            .output()
            .expect("run dlock");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(
            !stdout.contains("s3cret") && !stderr.contains("s3cret"),
            "{stdout}{stderr}"
        );
        stdout
    };

    let table = status(&[]);
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name}: {table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(table.starts_with("dlock status: redis://:***@"), "{table}");
    let held = line("cli-status/held");
    assert_eq!(held[1], "held", "{table}");
    assert_eq!(held[2], guard.fencing_token().to_string(), "{table}");
    let left: f64 = held[3].trim_end_matches('s').parse().unwrap();
    assert!(left > 0.0 && left <= ttl.as_secs_f64(), "{table}");
    assert_eq!(held[4], "0", "{table}");
    assert_eq!(held[5].len(), 32, "the owner value: {table}");
    assert_eq!(
        line("cli-status/free"),
        ["cli-status/free", "free", "-", "-", "0", "-"]
    );

    let json: serde_json::Value = serde_json::from_str(&status(&["--json"])).unwrap();
    assert_eq!(json["lease"], "ttl");
    let held = &json["locks"][0];
    assert_eq!(held["name"], "cli-status/held");
    assert_eq!(held["held"], true);
    assert_eq!(held["token"], guard.fencing_token().get());
    let left = held["remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 20_000, "{json}");
    assert_eq!(held["waiters"], 0);
    assert_eq!(json["locks"][1]["held"], false);

    let watched = status(&["--json", "--watch", "--interval", "50ms", "--count", "3"]);
    assert_eq!(watched.lines().count(), 3, "{watched}");

    runtime.block_on(guard.release()).unwrap();
    drop(locks);
}

/// `dlock status --watch` started while the server is down waits for it (as it rides out an
/// outage once running) instead of exiting at once; without `--watch` it exits 69.
#[test]
fn status_watch_waits_for_a_server_that_is_down_at_start() {
    use std::io::{BufRead, BufReader};
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("{}?connect_timeout=200ms", redis.url());
    redis.stop();
    let once = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["status", "--backend", &url, "cli-status/down"])
        .output()
        .expect("run dlock");
    assert_eq!(once.status.code(), Some(69), "{once:?}");

    let mut watch = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["status", "--watch", "--interval", "100ms", "--count", "1"])
        .args(["--backend", &url, "cli-status/down"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock");
    let stderr = watch.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let waiting = lines
        .next()
        .expect("a line on stderr")
        .expect("readable stderr");
    assert!(waiting.contains("trying again"), "{waiting}");
    redis.restart().unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = watch.try_wait().expect("wait for dlock") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "dlock status --watch never reported"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut watch.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{stdout}");
    assert!(stdout.contains("cli-status/down"), "{stdout}");
}

/// A lock lost because its server froze (`SIGSTOP`: connections stay open, nothing answers):
/// `dlock run` stops the command, and exits soon after, instead of waiting on the frozen server
/// for the release of a lock that is no longer its own (it waited out the release's command
/// timeout, 2 s).
#[test]
fn run_exits_soon_after_stopping_the_command_when_its_server_froze() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let marker = tempfile_path("dlock-run-frozen");
    let stopped = format!("{marker}.stopped");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["run", "--backend", &redis.url(), "--ttl", "2s"])
        .args(["--kill-after", "5s", "cli-frozen", "--"])
        // The command notes when it is told to stop, then stops.
        .args([
            "sh",
            "-c",
            &format!("trap 'touch {stopped}; exit 143' TERM; touch {marker}; while :; do sleep 0.05; done"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock");
    until_started(&marker);
    let deadline = Instant::now() + Duration::from_secs(30);
    redis.pause();
    let (status, told_to_stop) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, None);
        }
        if std::path::Path::new(&stopped).exists() {
            let told = Instant::now();
            let status = child.wait().unwrap();
            break (status, Some(told.elapsed()));
        }
        assert!(Instant::now() < deadline, "dlock did not stop the command");
        std::thread::sleep(Duration::from_millis(10));
    };
    redis.resume();
    let stderr = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert_eq!(status.code(), Some(74), "{stderr}");
    let exited_after = told_to_stop.expect("the command was told to stop");
    // The command stops at once; dlock then gives the release at most half a second. The bound
    // leaves room for a loaded machine, and is below the 2 s the frozen server used to cost.
    assert!(
        exited_after < Duration::from_millis(1500),
        "dlock exited {exited_after:?} after telling the command to stop: {stderr}"
    );
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_file(&stopped);
}

/// `dlock run --permits 3 backups -- CMD` started five times at once, as on five machines: never
/// more than three commands run together, all five run in the end, each with its own fencing
/// token and `DLOCK_PERMITS=3`; with every permit taken, `-n` exits 75 at once.
#[test]
fn run_with_permits_never_lets_four_of_five_run_together() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile_path("dlock-permits");
    std::fs::create_dir_all(format!("{dir}/running")).unwrap();
    // Each command marks itself running, records how many are running (itself included: of
    // four running together, the last to mark itself sees four), holds a moment, and unmarks.
    let script = format!(
        "touch {dir}/running/$$; ls {dir}/running | wc -l >> {dir}/seen; \
         echo \"$DLOCK_PERMITS $DLOCK_FENCING_TOKEN\" >> {dir}/tokens; sleep 0.3; \
         rm {dir}/running/$$"
    );
    let run = |extra: &[&str], command: &str| {
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["run", "--backend", &redis.url(), "--permits", "3"])
            .args(extra)
            .args(["backups", "--", "sh", "-c", command])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run dlock")
    };
    let children: Vec<_> = (0..5).map(|_| run(&["--wait", "120s"], &script)).collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
    let seen = std::fs::read_to_string(format!("{dir}/seen")).unwrap();
    let most = seen
        .lines()
        .map(|n| n.trim().parse::<u32>().unwrap())
        .max()
        .unwrap();
    assert!(most <= 3, "{most} ran at once: {seen}");
    let tokens = std::fs::read_to_string(format!("{dir}/tokens")).unwrap();
    let mut distinct: Vec<&str> = tokens.lines().collect();
    assert_eq!(distinct.len(), 5, "{tokens}");
    assert!(
        distinct.iter().all(|line| line.starts_with("3 ")),
        "{tokens}"
    );
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 5, "two commands shared a token: {tokens}");

    // Three holders that wait for a file; a fourth with -n finds every permit taken.
    let release = format!("{dir}/release");
    let hold = format!(
        "touch {dir}/running/$$; while [ ! -e {release} ]; do sleep 0.05; done; rm {dir}/running/$$"
    );
    let holders: Vec<_> = (0..3).map(|_| run(&["--wait", "120s"], &hold)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(format!("{dir}/running")).unwrap().count() < 3 {
        assert!(Instant::now() < deadline, "three holders never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = run(&["-n"], "true").wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("all 3 permits of `backups` are taken"),
        "{stderr}"
    );
    std::fs::write(&release, "").unwrap();
    for holder in holders {
        let out = holder.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
