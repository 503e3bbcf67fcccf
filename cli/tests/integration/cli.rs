//! The `dlock` command, run as a user would, on the memory backend.

use crate::common;

use std::process::Command;

/// Runs `dlock ARGS` on memory:// (`DLOCK_URL`, which `run` and `status` need).
fn dlock(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env("DLOCK_URL", "memory://")
        .output()
        .expect("run dlock")
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn demo_shows_lost_updates_without_the_lock_and_none_with_it() {
    let text = common::succeeds(["demo", "--workers", "50", "--stock", "50"]);
    let locked = text
        .lines()
        .find(|l| l.contains("with dlock"))
        .expect("locked line");
    assert!(
        locked.contains(" 0 left") && locked.contains(" 0 lost updates"),
        "{locked}"
    );
    let unlocked = text
        .lines()
        .find(|l| l.contains("without a lock"))
        .expect("unlocked line");
    assert!(
        !unlocked.contains(" 0 lost updates"),
        "the unlocked run should lose updates: {unlocked}"
    );
}

#[test]
fn run_passes_the_token_and_the_exit_status() {
    let out = dlock(&[
        "run",
        "--ttl",
        "5s",
        "cli-test",
        "--",
        "sh",
        "-c",
        "echo $DLOCK_LOCK_NAME:$DLOCK_FENCING_TOKEN; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7));
    let text = stdout(&out);
    assert!(
        text.starts_with("cli-test:") && text.trim_end().len() > "cli-test:".len(),
        "{text}"
    );
}

/// `dlock run NAME NAME…` takes every name before the command starts and passes each name's
/// token, sorted, in `DLOCK_FENCING_TOKENS`; the first (sorted) name and its token are
/// `DLOCK_LOCK_NAME` and `DLOCK_FENCING_TOKEN`.
#[test]
fn run_of_several_names_passes_every_token_in_order() {
    let out = dlock(&[
        "run",
        "account:7",
        "account:3",
        "account:7",
        "--",
        "sh",
        "-c",
        "printf '%s=%s|%s' \"$DLOCK_LOCK_NAME\" \"$DLOCK_FENCING_TOKEN\" \"$DLOCK_FENCING_TOKENS\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    let (first, all) = text.split_once('|').expect("two fields");
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("account:3="), "{text}");
    assert!(lines[1].starts_with("account:7="), "{text}");
    assert_eq!(
        lines[0], first,
        "the first name's token is the sorted first's: {text}"
    );
}

/// A command that cannot be started exits as `env(1)` and shells do (127 not found, 126 not
/// runnable), and dlock releases the lock it took for it rather than leaving the dropped guard
/// to release it in the background.
#[test]
fn run_of_a_command_that_cannot_start_releases_and_exits_127_or_126() {
    let dir = std::env::temp_dir().join(format!("dlock-cli-nostart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_runnable = dir.join("not-runnable");
    std::fs::write(&not_runnable, "#!/bin/sh\nexit 0\n").unwrap();
    let missing = dir.join("missing");
    for (command, code) in [(&missing, 127), (&not_runnable, 126)] {
        let out = dlock(&["run", "cli-nostart", "--", command.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(stderr.contains("cannot start"), "{stderr}");
        assert!(!stderr.contains("without release"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A signal sent to `dlock run` while the command runs goes to the command (it is in its own
/// process group, out of the terminal's reach), and dlock exits with the command's status: a
/// hangup or Ctrl-\ does not kill dlock and leave the command running on without the lock.
#[test]
fn run_passes_signals_on_to_the_command() {
    let dir = std::env::temp_dir().join(format!("dlock-cli-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (signal, name) in [
        (libc::SIGINT, "INT"),
        (libc::SIGTERM, "TERM"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGQUIT, "QUIT"),
    ] {
        let ready = dir.join(format!("{name}.ready"));
        let caught = dir.join(format!("{name}.caught"));
        let script = format!(
            "trap 'echo {name} > {caught}; exit 3' {name}; touch {ready}; while :; do sleep 0.05; done",
            caught = caught.display(),
            ready = ready.display(),
        );
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["run", "cli-signals", "--", "sh", "-c", &script])
            .env("DLOCK_URL", "memory://")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run dlock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !ready.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the command never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // SAFETY: kill(2) on the child we spawned and have not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        let out = child.wait_with_output().expect("wait for dlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "SIG{name}: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&caught).unwrap_or_default().trim(),
            name,
            "the command did not get SIG{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `dlock ARGS` as the job of a shell on a terminal (a pseudo-terminal `script(1)` makes),
/// typing `keys` into it once its output shows `after`.
fn dlock_on_a_terminal(args: &str, after: &str, keys: &[u8]) -> (Option<i32>, String) {
    use std::io::{Read, Write};
    // `exec`: script(1) runs the line with $SHELL, and a shell that stays (dash does not exec a
    // `-c` command) would share the terminal's foreground with dlock and die of its Ctrl-C.
    let line = format!("exec {} {args}", env!("CARGO_BIN_EXE_dlock"));
    let mut script = Command::new("script")
        .args(["--quiet", "--return", "--command", &line, "/dev/null"])
        .env("DLOCK_URL", "memory://")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux (Debian's bsdutils) runs commands on a pseudo-terminal");
    // Kept open until the end: a closed input would end the terminal session.
    let mut stdin = script.stdin.take().expect("stdin");
    let mut stdout = script.stdout.take().expect("stdout");
    let (chunks, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 256];
        while let Ok(n @ 1..) = stdout.read(&mut chunk) {
            if chunks.send(chunk[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    // A command stopped for reading the terminal would hang the session: bounded, it fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (mut seen, mut typed) = (String::new(), false);
    loop {
        if !typed && seen.contains(after) {
            stdin.write_all(keys).expect("type into the terminal");
            typed = true;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match output.recv_timeout(left) {
            Ok(chunk) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = script.kill();
                panic!("`dlock {args}` on a terminal did not finish; its output: {seen}");
            }
        }
    }
    let status = script.wait().expect("wait for script");
    (status.code(), seen)
}

#[test]
fn run_on_a_terminal_lets_the_command_read_it_and_take_ctrl_c() {
    // As under flock(1): the command is in the terminal's foreground, not stopped for reading it.
    let (code, out) = dlock_on_a_terminal(
        "run cli-terminal -- sh -c 'echo ready; read line; echo got $line'",
        "ready",
        b"hello\n",
    );
    assert!(out.contains("got hello"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    // Ctrl-C on the terminal reaches the command once, and dlock exits as the command did.
    let (code, out) = dlock_on_a_terminal(
        "run cli-terminal -- sh -c 'trap \"echo caught; exit 3\" INT; echo ready; while :; do sleep 0.05; done'",
        "ready",
        b"\x03",
    );
    assert_eq!(out.matches("caught").count(), 1, "{out}");
    assert_eq!(code, Some(3), "{out}");
}

#[test]
fn bad_input_is_a_usage_error_before_connecting() {
    let out = dlock(&["run", "--ttl", "0s", "x", "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid ttl"));
    // A value the argument parser refuses is an invalid value too, not a malformed line.
    let out = dlock(&["run", "--ttl", "5", "x", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let out = dlock(&["run", "--no-such-flag", "x", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = dlock(&["demo", "--backend", "ftp://nowhere"]);
    assert_eq!(out.status.code(), Some(64));
    let out = dlock(&["demo", "--backend", "redis://:secret@127.0.0.1:1"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("secret"));
}

#[test]
fn conformance_on_memory_ends_with_the_summary_line() {
    let out = dlock(&["conformance", "--filter", "exclusion::"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.lines().last(), Some("4 passed, 0 failed"), "{text}");
}

#[test]
fn conformance_runs_the_cases_any_filter_selects() {
    let out = dlock(&[
        "conformance",
        "--filter",
        "exclusion::",
        "--filter",
        "fencing::tokens_strictly_increase",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("fencing::tokens_strictly_increase"), "{text}");
    assert_eq!(text.lines().last(), Some("5 passed, 0 failed"), "{text}");
}

#[test]
fn bench_prints_json_with_the_documented_fields() {
    let out = dlock(&["bench", "--duration", "200ms", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    for field in [
        "\"backend\"",
        "\"uncontended\"",
        "\"ops_per_sec\"",
        "\"p50_us\"",
        "\"p99_us\"",
        "\"handoff\"",
        "\"waiters\"",
    ] {
        assert!(text.contains(field), "missing {field}: {text}");
    }
}

#[test]
fn bench_rounds_report_medians_each_round_and_the_spread() {
    let text = common::succeeds([
        "bench",
        "--duration",
        "120ms",
        "--rounds",
        "2",
        "--parallel",
        "1,3",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(report["rounds"].as_array().map(Vec::len), Some(2), "{text}");
    assert!(
        report["uncontended"]["ops_per_sec"].as_f64().is_some(),
        "{text}"
    );
    let spread = &report["spread"]["uncontended"]["ops_per_sec"];
    assert!(
        spread
            .as_array()
            .is_some_and(|s| s.len() == 2 && s[0].as_f64() <= s[1].as_f64()),
        "{text}"
    );
    assert_eq!(report["parallel_names"][1]["tasks"], 3, "{text}");
    // The memory backend has no raw floors.
    assert!(report.get("raw_floor").is_none(), "{text}");

    // The table gives the spread after the medians.
    let out = dlock(&[
        "bench",
        "--duration",
        "120ms",
        "--rounds",
        "2",
        "--parallel",
        "2",
    ]);
    let text = stdout(&out);
    assert!(text.contains("2 rounds: medians, [min–max]"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("uncontended acquire+release"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains('[') && line.contains('–'), "{line}");

    // At least one round: zero is an invalid value.
    let out = dlock(&["bench", "--rounds", "0"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

#[test]
fn extreme_duration_flags_never_panic() {
    // A wait too long to reach means "no limit" (the free lock is taken at once); any grace
    // period before SIGKILL is fine.
    for (flag, value) in [
        ("--wait", "999999999999s"),
        ("--kill-after", "18446744073709551615s"),
    ] {
        let out = dlock(&["run", flag, value, "cli-extreme", "--", "true"]);
        assert!(
            out.status.success(),
            "{flag} {value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Too short a lease, or one past the limit: a clear refusal (exit 64), never a panic.
    for ttl in ["1ns", "0s", "999999999999s"] {
        let out = dlock(&["run", "--ttl", ttl, "cli-extreme", "--", "true"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "--ttl {ttl}: {stderr}");
        assert!(!stderr.contains("panicked"), "--ttl {ttl}: {stderr}");
    }
    // humantime has no fractions: a refused value, exit 64, never a panic.
    let out = dlock(&["run", "--ttl", "0.0000001s", "cli-extreme", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn bench_flood_reports_acquired_and_timed_out() {
    let text = common::succeeds([
        "bench",
        "--backend",
        "memory://flood-test",
        "--flood",
        "300",
        "--waiters",
        "3",
        "--names",
        "4",
        "--flood-wait",
        "20s",
        "--hold",
        "1ms",
    ]);
    assert!(
        text.contains("acquired 300, timed out 0, failed 0"),
        "{text}"
    );
}

/// `dlock bench --set`: a set taken with `acquire_all` against its names taken one by one, both
/// measured in the same run.
#[test]
fn bench_set_measures_acquire_all_against_single_acquires() {
    let stdout = common::succeeds([
        "bench",
        "--backend",
        "memory://set-bench",
        "--set",
        "4",
        "--duration",
        "300ms",
        "--json",
    ]);
    let report: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let set = &report["set"];
    assert_eq!(set["names"], 4, "{report}");
    for figure in [
        "/acquire_all_sets_per_sec",
        "/one_by_one_sets_per_sec",
        "/acquire_all_vs_one_by_one",
        "/acquire_all/p50_us",
        "/one_by_one/p99_us",
    ] {
        assert!(
            set.pointer(figure)
                .and_then(serde_json::Value::as_f64)
                .is_some_and(|n| n > 0.0),
            "no {figure}: {report}"
        );
    }
}

#[test]
fn status_on_memory_prints_a_line_per_name_and_json() {
    // A new process has a new memory store: every name is free.
    let out = dlock(&["status", "cli-a", "cli-b"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("dlock status: memory:// at "),
        "{text}"
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "NAME", "STATE", "TOKEN", "LEASE", "LEFT", "WAITERS", "HOLDER"
        ]
    );
    for (line, name) in lines[2..].iter().zip(["cli-a", "cli-b"]) {
        assert_eq!(
            line.split_whitespace().collect::<Vec<_>>(),
            [name, "free", "-", "-", "0", "-"],
            "{text}"
        );
    }

    let out = dlock(&["status", "--json", "cli-a"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    for field in [
        "\"backend\":\"memory://\"",
        "\"held\":false",
        "\"token\":null",
        "\"remaining_ms\":null",
        "\"waiters\":0",
    ] {
        assert!(text.contains(field), "missing {field}: {text}");
    }

    // --watch refreshes (bounded by --count); without --watch, --count is a usage error.
    let out = dlock(&[
        "status",
        "--watch",
        "--interval",
        "10ms",
        "--count",
        "2",
        "cli-a",
    ]);
    assert!(out.status.success());
    assert_eq!(stdout(&out).matches("dlock status: ").count(), 2);
    let out = dlock(&["status", "--count", "2", "cli-a"]);
    assert_eq!(out.status.code(), Some(2));
    let out = dlock(&["status", ""]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn run_and_status_need_a_backend_other_processes_see() {
    // memory:// by default would be a lock no other `dlock run` sees: two would both run.
    for args in [
        &["run", "cli-nobackend", "--", "true"][..],
        &["status", "cli-nobackend"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(args)
            .env_remove("DLOCK_URL")
            .env_remove("DLOCK_CONFIG")
            .output()
            .expect("run dlock");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains("needs a backend"), "{args:?}: {stderr}");
    }
    // Named explicitly, memory:// is taken at its word.
    let out = dlock(&[
        "run",
        "--backend",
        "memory://",
        "cli-nobackend",
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn conformance_refuses_a_filter_that_matches_no_case() {
    let out = dlock(&["conformance", "--filter", "fencnig::"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("matches no case"), "{stderr}");
}
