//! `dlock bench --scale` on the memory backend at tiny sizes: the report's shape and the plot.
//! Nothing here asserts a speed; the sizes only have to run in seconds.

use serde_json::Value;

use crate::common;

/// The tiny run every test here starts from: two sizes per phase, a short TTL and hold.
const TINY: &[&str] = &[
    "bench",
    "--backend",
    "memory://scale-bench",
    "--duration",
    "200ms",
    "--scale-held",
    "10,20",
    "--scale-queue",
    "2,3",
    "--scale-names",
    "10,30",
    "--scale-ttl",
    "300ms",
    "--scale-hold",
    "700ms",
];

fn positive(entry: &Value, figure: &str) -> bool {
    entry[figure].as_f64().is_some_and(|n| n > 0.0)
}

#[test]
fn scale_reports_each_phase_at_each_size_and_plots_the_curves() {
    let svg = std::env::temp_dir().join(format!("dlock-scale-{}.svg", std::process::id()));
    let mut args = TINY.to_vec();
    let plot = svg.display().to_string();
    args.extend(["--scale", "--json", "--plot", &plot]);
    let stdout = common::succeeds(&args);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let scale = &report["scale"];

    let held = scale["held"].as_array().expect("held entries");
    assert_eq!(held.len(), 2, "{report}");
    for (entry, locks) in held.iter().zip([10, 20]) {
        assert_eq!(entry["locks"], locks, "{report}");
        assert_eq!(entry["lost"], 0, "a held lock was lost: {report}");
        for figure in [
            "acquire_per_sec",
            "release_per_sec",
            "pairs_per_sec",
            "held_s",
        ] {
            assert!(positive(entry, figure), "no {figure}: {report}");
        }
        assert!(entry["cpu_us_per_lock_s"].is_number(), "{report}");
        assert!(entry["bytes_per_guard"].is_number(), "{report}");
    }
    assert!(positive(&held[1], "acquire_per_sec_vs_first"), "{report}");

    // One waiter first, the base of the others.
    let queue = scale["queue"].as_array().expect("queue entries");
    let waiters: Vec<_> = queue.iter().map(|e| e["waiters"].as_u64()).collect();
    assert_eq!(waiters, [Some(1), Some(2), Some(3)], "{report}");
    for entry in queue {
        assert!(positive(entry, "handoffs"), "no hand-offs: {report}");
        assert!(positive(entry, "p50_us"), "{report}");
    }
    assert!(positive(&queue[2], "p50_vs_one"), "{report}");

    let names = scale["names"].as_array().expect("names entries");
    assert_eq!(names.len(), 2, "{report}");
    for (entry, count) in names.iter().zip([10, 30]) {
        assert_eq!(entry["names"], count, "{report}");
        assert!(positive(entry, "per_sec"), "{report}");
    }

    let drawn = std::fs::read_to_string(&svg).expect("the plot was written");
    let _ = std::fs::remove_file(&svg);
    assert!(drawn.contains("<svg"), "{drawn}");
    for title in [
        "held: acquire + release",
        "queue: hand-off p50",
        "names: each used once",
    ] {
        assert!(drawn.contains(title), "no panel {title}");
    }
    assert!(drawn.contains("<polyline"), "no curve: {drawn}");
}

#[test]
fn scale_runs_only_the_phases_listed_and_prints_their_tables() {
    let mut args = TINY.to_vec();
    args.extend(["--scale", "queue,names"]);
    let text = common::succeeds(&args);
    assert!(
        text.starts_with("dlock bench --scale against memory"),
        "{text}"
    );
    assert!(
        text.contains("\nqueue: ") && text.contains("\nnames: "),
        "{text}"
    );
    assert!(!text.contains("\nheld: "), "{text}");
    assert!(text.contains("p50 vs 1"), "{text}");
}

#[test]
fn scale_refuses_a_size_of_zero_before_measuring() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["bench", "--scale", "held", "--scale-held", "0"])
        .output()
        .expect("run dlock");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--scale-held"), "{stderr}");
}
