//! `dlock run --read` and `--write` against a real etcd member, as on several machines: readers
//! run together, a writer runs alone, and a waiting writer keeps later readers out.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test_servers::Etcd;

use crate::common::tempfile_path;

/// How long a step may take on a loaded machine before the test gives up.
const BOUND: Duration = Duration::from_secs(60);

fn dlock_run(url: &str, mode: &[&str], command: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["run", "--backend", url])
        .args(mode)
        .args(["config", "--", "sh", "-c", command])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dlock")
}

fn exits_with(child: Child, code: i32) {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
}

fn running(dir: &str) -> usize {
    std::fs::read_dir(format!("{dir}/running")).unwrap().count()
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: nothing after {BOUND:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `dlock bench --read-mostly`: the readers' grants against the same clients taking the lock,
/// and the writer's wait, all measured.
#[test]
fn bench_measures_a_read_mostly_mix() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("etcd://{}", etcd.addr());
    let stdout = crate::common::succeeds([
        "bench",
        "--backend",
        &url,
        "--read-mostly",
        "3",
        "--duration",
        "500ms",
        "--rounds",
        "1",
        "--json",
    ]);
    let report: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let mix = &report["read_mostly"];
    for figure in [
        "reads_per_sec",
        "mutex_per_sec",
        "reads_vs_mutex",
        "writer_wait_p50_us",
        "writer_wait_p99_us",
    ] {
        assert!(
            mix[figure].as_f64().is_some_and(|n| n > 0.0),
            "no {figure}: {report}"
        );
    }
}

#[test]
fn readers_run_together_and_a_waiting_writer_keeps_later_readers_out() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let url = format!("etcd://{}", etcd.addr());
    let dir = tempfile_path("dlock-rw");
    std::fs::create_dir_all(format!("{dir}/running")).unwrap();
    let release = format!("{dir}/release");
    let hold = format!(
        "touch {dir}/running/$$; while [ ! -e {release} ]; do sleep 0.05; done; rm {dir}/running/$$"
    );
    let wait = ["--read", "--wait", "120s"];
    let readers: Vec<Child> = (0..3).map(|_| dlock_run(&url, &wait, &hold)).collect();
    until("three readers running together", || running(&dir) == 3);

    // A writer finds the readers there; one that waits goes in after them.
    exits_with(dlock_run(&url, &["--write", "-n"], "true"), 75);
    let wrote = format!("{dir}/wrote");
    let writer = dlock_run(
        &url,
        &["--write", "--wait", "120s"],
        &format!("[ $(ls {dir}/running | wc -l) -eq 0 ] && touch {wrote}"),
    );
    // Once the writer waits, a new reader is refused, though only readers hold: asked until
    // it is, so the test holds whenever the writer's place reaches the server.
    until("a reader refused behind the waiting writer", || {
        let reader = dlock_run(&url, &["--read", "-n"], "true");
        reader.wait_with_output().unwrap().status.code() == Some(75)
    });
    std::fs::write(&release, "").unwrap();
    for reader in readers {
        exits_with(reader, 0);
    }
    exits_with(writer, 0);
    assert!(
        std::path::Path::new(&wrote).exists(),
        "the writer ran while a reader still did"
    );
    std::fs::remove_dir_all(&dir).ok();
}
