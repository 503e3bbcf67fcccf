//! What the CLI's tests against real servers share: running `dlock` and checking it succeeded,
//! and `dlock bench`, checked to have measured every raw floor it compares dlock with (the
//! uncontended pairs, the hand-offs and the many-names ceiling) in every round.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

/// Runs `dlock ARGS` (without the caller's `DLOCK_URL`), checks that it succeeded, and returns
/// its standard output.
pub(crate) fn succeeds<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("DLOCK_URL")
        .output()
        .expect("run dlock");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `dlock bench --backend URL --json`, two short rounds and two task counts; the report.
pub(crate) fn bench(url: &str) -> Value {
    let stdout = succeeds([
        "bench",
        "--backend",
        url,
        "--duration",
        "300ms",
        "--rounds",
        "2",
        "--parallel",
        "1,4",
        "--json",
    ]);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Every round measured each floor (samples, pairs per second) and each ratio, and the report
/// gives their medians and spreads; the hand-off floor is the one `handoff_op` names.
pub(crate) fn assert_every_floor_measured(report: &Value, handoff_op: &str) {
    let rounds = report["rounds"].as_array().expect("rounds");
    assert_eq!(rounds.len(), 2, "{report}");
    for round in rounds.iter().chain([report]) {
        for samples in ["/raw_floor/samples", "/raw_handoff_floor/samples"] {
            let n = round.pointer(samples).and_then(Value::as_f64);
            assert!(n.is_some_and(|n| n > 0.0), "no {samples}: {round}");
        }
        assert!(
            round["raw_floor"]["ops_per_sec"]
                .as_f64()
                .is_some_and(|n| n > 0.0),
            "{round}"
        );
        assert!(
            round["raw_handoff_floor"]["p50_us"]
                .as_f64()
                .is_some_and(|n| n > 0.0),
            "{round}"
        );
        let parallel = round["parallel_names"].as_array().expect("parallel_names");
        assert_eq!(parallel.len(), 2, "{round}");
        for entry in parallel {
            for field in ["ops_per_sec", "floor_ops_per_sec", "vs_floor"] {
                assert!(
                    entry[field].as_f64().is_some_and(|n| n > 0.0),
                    "{field}: {round}"
                );
            }
        }
        for ratio in [
            "uncontended_throughput_vs_floor",
            "handoff_p50_vs_raw_handoff_floor",
            "handoff_p50_vs_floor_round_trip",
        ] {
            assert!(
                round["ratios"][ratio].as_f64().is_some(),
                "{ratio}: {round}"
            );
        }
    }
    assert_eq!(report["raw_handoff_floor"]["op"], handoff_op, "{report}");
    for at in [
        "/raw_floor/ops_per_sec",
        "/raw_handoff_floor/p50_us",
        "/parallel_names/1/floor_ops_per_sec",
        "/ratios/handoff_p50_vs_raw_handoff_floor",
    ] {
        let spread = report["spread"].pointer(at).and_then(Value::as_array);
        assert!(
            spread.is_some_and(|s| s.len() == 2 && s[0].as_f64() <= s[1].as_f64()),
            "spread of {at}: {report}"
        );
    }
}

/// Every round also measured the fenced floor (the plain pair taking a fencing token as dlock
/// does), uncontended and at every task count, with dlock's ratios to it.
pub(crate) fn assert_fenced_floor_measured(report: &Value) {
    for round in report["rounds"]
        .as_array()
        .expect("rounds")
        .iter()
        .chain([report])
    {
        for at in [
            "/raw_fenced_floor/samples",
            "/raw_fenced_floor/ops_per_sec",
            "/ratios/uncontended_throughput_vs_fenced_floor",
        ] {
            let figure = round.pointer(at).and_then(Value::as_f64);
            assert!(figure.is_some_and(|n| n > 0.0), "no {at}: {round}");
        }
        for entry in round["parallel_names"].as_array().expect("parallel_names") {
            for field in ["fenced_floor_ops_per_sec", "vs_fenced_floor"] {
                let figure = entry[field].as_f64();
                assert!(figure.is_some_and(|n| n > 0.0), "no {field}: {round}");
            }
        }
    }
}

/// `dlock bench --backend URL --permits 1,3 --json`, each phase running `duration`: each
/// number of permits measured, pairs and hand-off of the last free permit, by dlock and by the
/// backend's raw floor of the same algorithm, with both ratios.
pub(crate) fn assert_permits_measured_against_their_floor(url: &str, duration: &str) {
    let stdout = succeeds([
        "bench",
        "--backend",
        url,
        "--duration",
        duration,
        "--permits",
        "1,3",
        "--json",
    ]);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let rows = report["permits"].as_array().expect("permits");
    assert_eq!(rows.len(), 2, "{report}");
    for (row, permits) in rows.iter().zip([1, 3]) {
        assert_eq!(row["permits"], permits, "{report}");
        for figure in [
            "pairs_per_sec",
            "floor_pairs_per_sec",
            "pairs_vs_floor",
            "handoff_p50_us",
            "floor_handoff_p50_us",
            "handoff_p50_vs_floor",
            "cpu_us_per_pair",
            "floor_cpu_us_per_pair",
        ] {
            assert!(
                row[figure].as_f64().is_some_and(|n| n > 0.0),
                "no {figure}: {report}"
            );
        }
    }
}

/// A fresh path under the temporary directory, unique to this process and call.
pub(crate) fn tempfile_path(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    let unique = RandomState::new().hash_one(std::time::Instant::now());
    format!(
        "{}/{prefix}-{}-{unique}",
        std::env::temp_dir().display(),
        std::process::id(),
    )
}
