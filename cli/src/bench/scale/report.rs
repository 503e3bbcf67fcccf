//! The tables `dlock bench --scale` prints, from its JSON report.

use std::fmt::Write;

use serde_json::Value;

use crate::bench::report::table;

/// A cell: the figure `key` of `entry` as it is (whole numbers without decimals), `-` if absent.
fn cell(entry: &Value, key: &str) -> String {
    match &entry[key] {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.fract() == 0.0 && x.abs() >= 1.0 {
                format!("{x:.0}")
            } else {
                format!("{x}")
            }
        }
        Value::Number(n) => n.to_string(),
        _ => "-".to_owned(),
    }
}

/// The rows of one phase: a header, then each entry's `keys`.
fn phase_table(entries: &Value, header: &[&str], keys: &[&str]) -> String {
    let mut rows = vec![header.iter().map(|&h| h.to_owned()).collect::<Vec<_>>()];
    for entry in entries.as_array().into_iter().flatten() {
        rows.push(keys.iter().map(|key| cell(entry, key)).collect());
    }
    table(&rows)
}

pub(super) fn render(report: &Value) -> String {
    let settings = &report["settings"];
    let mut out = format!(
        "dlock bench --scale against {} (TTL {} ms, {} tasks per client)\n",
        report["backend"].as_str().unwrap_or(""),
        cell(settings, "ttl_ms"),
        cell(settings, "tasks"),
    );
    let text = |key: &str| report[key].as_str().map(str::to_owned);
    if let Some(requests) = text("server_requests") {
        let _ = writeln!(out, "server requests: {requests}");
    }
    if let Some(op) = text("floor_op") {
        let _ = writeln!(out, "raw floor: {op}");
    }
    if report["held"].is_array() {
        let _ = writeln!(
            out,
            "\nheld: N locks on one client, held {} ms, then released",
            cell(settings, "hold_ms")
        );
        out.push_str(&phase_table(
            &report["held"],
            &[
                "locks",
                "acquire/s",
                "vs first",
                "release/s",
                "vs first",
                "pairs/s",
                "floor pairs/s",
                "vs floor",
                "CPU µs/lock·s",
                "requests/lock·s",
                "bytes/guard",
                "lost",
            ],
            &[
                "locks",
                "acquire_per_sec",
                "acquire_per_sec_vs_first",
                "release_per_sec",
                "release_per_sec_vs_first",
                "pairs_per_sec",
                "floor_pairs_per_sec",
                "pairs_vs_floor",
                "cpu_us_per_lock_s",
                "requests_per_lock_s",
                "bytes_per_guard",
                "lost",
            ],
        ));
    }
    if report["queue"].is_array() {
        let _ = writeln!(
            out,
            "\nqueue: W waiters on one name over {} clients, each release handing over",
            cell(settings, "queue_clients")
        );
        if let Some(op) = text("floor_handoff_op") {
            let _ = writeln!(out, "raw hand-off floor: {op} (connections as listed)");
        }
        out.push_str(&phase_table(
            &report["queue"],
            &[
                "waiters",
                "hand-offs",
                "p50 µs",
                "p99 µs",
                "p50 vs 1",
                "requests/hand-off",
                "floor conns",
                "floor p50 µs",
                "floor p99 µs",
            ],
            &[
                "waiters",
                "handoffs",
                "p50_us",
                "p99_us",
                "p50_vs_one",
                "requests_per_handoff",
                "floor_connections",
                "floor_p50_us",
                "floor_p99_us",
            ],
        ));
    }
    for entry in report["queue"].as_array().into_iter().flatten() {
        if let Some(failed) = entry["failed"].as_str() {
            let _ = writeln!(out, "{} waiters: {failed}", cell(entry, "waiters"));
        }
    }
    if report["names"].is_array() {
        out.push_str("\nnames: M distinct names, each acquired and released once\n");
        if let Some(stored) = text("server_stored") {
            let _ = writeln!(out, "stored on the server: {stored}, read after the TTL");
        }
        out.push_str(&phase_table(
            &report["names"],
            &[
                "names",
                "names/s",
                "CPU µs/name",
                "floor pairs/s",
                "vs floor",
                "stored before",
                "stored after",
                "stored/name",
                "no expiry/name",
                "bytes/name",
            ],
            &[
                "names",
                "per_sec",
                "cpu_us_per_name",
                "floor_pairs_per_sec",
                "vs_floor",
                "stored_before",
                "stored_after",
                "stored_per_name",
                "unexpiring_per_name",
                "bytes_per_name",
            ],
        ));
    }
    out.push_str(
        "\n(CPU: this process's, all threads; µs/lock·s: per held lock per second of holding. \
         Floor pairs/s: the raw pair in as many tasks, a key each.)\n",
    );
    out
}
