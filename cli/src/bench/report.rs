//! The report of `dlock bench`: the rounds combined into medians and spreads, and the table
//! printed from them.

use std::time::Duration;

use serde_json::{Value, json};

/// What the table says of the run beside its figures.
pub(super) struct Run<'a> {
    /// The backend measured, as its client describes itself.
    pub(super) label: &'a str,
    pub(super) duration: Duration,
    pub(super) rounds: u32,
    /// Clients in the hand-off phase, and how long each held the lock.
    pub(super) waiters: usize,
    pub(super) hold: Duration,
}

/// Fields that describe the run rather than measure it: the same in every round, never spread.
const SETTINGS: &[&str] = &["tasks", "waiters", "hold_us"];

/// How the rounds' reports make one.
#[derive(Clone, Copy)]
pub(super) enum Combine {
    /// Each figure's median over the rounds (the mean of the middle two of an even count);
    /// settings and text as in the first round.
    Median,
    /// Each figure's `[min, max]` over the rounds; no settings, no text.
    Spread,
}

impl Combine {
    /// Combines the rounds' reports field by field; `None` when nothing is left.
    pub(super) fn rounds(self, rounds: &[Value]) -> Option<Value> {
        self.field(rounds, None)
    }

    fn field(self, values: &[Value], key: Option<&str>) -> Option<Value> {
        let first = values.first()?;
        match first {
            Value::Object(fields) => {
                let mut out = serde_json::Map::new();
                for k in fields.keys() {
                    let children: Vec<Value> = values.iter().map(|v| v[k].clone()).collect();
                    if let Some(child) = self.field(&children, Some(k)) {
                        out.insert(k.clone(), child);
                    }
                }
                (!out.is_empty()).then_some(Value::Object(out))
            }
            Value::Array(items) => Some(Value::Array(
                (0..items.len())
                    .map(|i| {
                        let children: Vec<Value> = values.iter().map(|v| v[i].clone()).collect();
                        self.field(&children, None).unwrap_or(Value::Null)
                    })
                    .collect(),
            )),
            Value::Number(_) if key.is_some_and(|k| SETTINGS.contains(&k)) => {
                matches!(self, Self::Median).then(|| first.clone())
            }
            Value::Number(_) | Value::Null => {
                let numbers: Vec<f64> = values.iter().filter_map(Value::as_f64).collect();
                if numbers.len() < values.len() {
                    // A figure some round could not measure (no samples).
                    return Some(Value::Null);
                }
                let integers = values.iter().all(|v| v.is_u64() || v.is_i64());
                Some(self.figure(numbers, integers))
            }
            _ => matches!(self, Self::Median).then(|| first.clone()),
        }
    }

    /// One figure from its per-round values: counts (`integers`) stay integers, whole figures
    /// whole, ratios keep two decimals.
    fn figure(self, mut numbers: Vec<f64>, integers: bool) -> Value {
        let whole = numbers.iter().all(|n| n.fract() == 0.0);
        let shown = |n: f64| {
            if integers {
                json!(n.round() as i64)
            } else if whole {
                json!(n.round())
            } else {
                json!((n * 100.0).round() / 100.0)
            }
        };
        numbers.sort_by(f64::total_cmp);
        match self {
            Self::Median => {
                let mid = numbers.len() / 2;
                if numbers.len() % 2 == 1 {
                    shown(numbers[mid])
                } else {
                    shown((numbers[mid.saturating_sub(1)] + numbers[mid]) / 2.0)
                }
            }
            Self::Spread => json!([
                shown(numbers[0]),
                shown(numbers[numbers.len().saturating_sub(1)])
            ]),
        }
    }
}

/// The table `dlock bench` prints: the figures (the medians over the rounds), with their spread
/// after several rounds.
pub(super) struct Report<'a> {
    pub(super) figures: &'a Value,
    pub(super) spread: Option<Value>,
}

/// How a figure is shown.
#[derive(Clone, Copy)]
pub(super) enum Unit {
    Whole,
    Ratio,
    /// A plain number with this many decimals.
    Decimals(usize),
}

impl Report<'_> {
    /// The figure at JSON pointer `at`: its median, and `[min–max]` after several rounds.
    pub(super) fn fig(&self, at: &str, unit: Unit) -> String {
        let show = |value: &Value, suffix: &str| match (value.as_f64(), unit) {
            (Some(n), Unit::Whole) => format!("{n:.0}"),
            (Some(n), Unit::Ratio) => format!("{n:.2}{suffix}"),
            (Some(n), Unit::Decimals(places)) => format!("{n:.places$}"),
            (None, _) => "-".to_owned(),
        };
        let median = self
            .figures
            .pointer(at)
            .map_or_else(|| "-".to_owned(), |v| show(v, "x"));
        match self.spread.as_ref().and_then(|s| s.pointer(at)) {
            Some(Value::Array(range)) if range.len() == 2 => {
                format!("{median} [{}–{}]", show(&range[0], ""), show(&range[1], ""))
            }
            _ => median,
        }
    }

    fn has(&self, at: &str) -> bool {
        self.figures.pointer(at).is_some()
    }

    pub(super) fn render(&self, run: &Run<'_>) -> String {
        use std::fmt::Write;
        let whole = |at: &str| self.fig(at, Unit::Whole);
        let text = |at: &str| {
            self.figures
                .pointer(at)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let mut out = format!(
            "dlock bench against {} ({:?} per phase",
            run.label, run.duration
        );
        if run.rounds > 1 {
            let _ = write!(
                out,
                "; {} rounds: medians, [min–max] over the rounds",
                run.rounds
            );
        }
        out.push_str(")\n\n");
        // A row of uncontended pairs: dlock's or a floor's, at JSON pointer `at`.
        let pairs_row = |label: String, at: &str| {
            let fig = |key: &str, unit| self.fig(&format!("{at}/{key}"), unit);
            vec![
                label,
                fig("ops_per_sec", Unit::Whole),
                fig("p50_us", Unit::Whole),
                fig("p99_us", Unit::Whole),
                fig("cpu_us_per_op", Unit::Decimals(1)),
                fig("context_switches_per_op", Unit::Decimals(2)),
            ]
        };
        let mut rows = vec![row([
            "phase",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "CPU µs/op",
            "switches/op",
        ])];
        rows.push(pairs_row(
            "uncontended acquire+release".to_owned(),
            "/uncontended",
        ));
        for (at, what) in [
            ("/raw_floor", "raw floor"),
            ("/raw_fenced_floor", "raw fenced floor"),
            ("/peer", "peer"),
        ] {
            if self.has(at) {
                rows.push(pairs_row(
                    format!("{what}: {}", text(&format!("{at}/op"))),
                    at,
                ));
            }
        }
        rows.push(vec![
            format!("hand-off ({} clients, hold {:?})", run.waiters, run.hold),
            whole("/handoff/acquisitions_per_sec"),
            whole("/handoff/p50_us"),
            whole("/handoff/p99_us"),
        ]);
        if self.has("/election_handoff") {
            rows.push(vec![
                "election hand-over (resign → next leads)".to_owned(),
                String::new(),
                whole("/election_handoff/p50_us"),
                whole("/election_handoff/p99_us"),
            ]);
        }
        if self.has("/raw_handoff_floor") {
            rows.push(vec![
                format!("raw hand-off floor: {}", text("/raw_handoff_floor/op")),
                String::new(),
                whole("/raw_handoff_floor/p50_us"),
                whole("/raw_handoff_floor/p99_us"),
            ]);
        }
        out.push_str(&table(&rows));
        out.push_str(
            "(CPU and switches: this process's CPU time and context switches, all threads, per \
             uncontended pair)\n",
        );
        let floor = self.has("/raw_parallel_floor");
        let fenced = self.has("/parallel_names/0/vs_fenced_floor");
        let peer = self.has("/parallel_names/0/vs_peer");
        let mut header = vec!["many names, one client", "dlock pairs/s"];
        if floor {
            header.extend(["raw floor pairs/s", "dlock / floor"]);
        }
        if fenced {
            header.extend(["fenced floor pairs/s", "dlock / fenced"]);
        }
        if peer {
            header.extend(["peer pairs/s", "dlock / peer"]);
        }
        header.push("dlock CPU µs/pair");
        if floor {
            header.push("floor CPU µs/pair");
        }
        let mut rows = vec![header.into_iter().map(str::to_owned).collect::<Vec<_>>()];
        let entries = self
            .figures
            .pointer("/parallel_names")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        for i in 0..entries {
            let tasks = self.figures["parallel_names"][i]["tasks"]
                .as_u64()
                .unwrap_or(0);
            let at = |key: &str| format!("/parallel_names/{i}/{key}");
            let mut line = vec![
                format!("{tasks} {}", if tasks == 1 { "task" } else { "tasks" }),
                whole(&at("ops_per_sec")),
            ];
            if floor {
                line.push(whole(&at("floor_ops_per_sec")));
                line.push(self.fig(&at("vs_floor"), Unit::Ratio));
            }
            if fenced {
                line.push(whole(&at("fenced_floor_ops_per_sec")));
                line.push(self.fig(&at("vs_fenced_floor"), Unit::Ratio));
            }
            if peer {
                line.push(whole(&at("peer_ops_per_sec")));
                line.push(self.fig(&at("vs_peer"), Unit::Ratio));
            }
            line.push(self.fig(&at("cpu_us_per_op"), Unit::Decimals(1)));
            if floor {
                line.push(self.fig(&at("floor_cpu_us_per_op"), Unit::Decimals(1)));
            }
            rows.push(line);
        }
        out.push('\n');
        out.push_str(&table(&rows));
        if floor {
            let _ = writeln!(
                out,
                "(raw floor: {} pairs, a key per task, the tasks sharing {})",
                text("/raw_parallel_floor/op"),
                text("/raw_parallel_floor/client")
            );
        }
        out.push_str(
            "(CPU µs/pair: this process's CPU time while the tasks ran, all threads, over the \
             pairs they finished)\n",
        );
        if self.has("/ratios") {
            let ratio = |at: &str| self.fig(at, Unit::Ratio);
            let _ = writeln!(
                out,
                "\nuncontended throughput = {} the floor",
                ratio("/ratios/uncontended_throughput_vs_floor")
            );
            if self.has("/ratios/uncontended_throughput_vs_fenced_floor") {
                let _ = writeln!(
                    out,
                    "uncontended throughput = {} the fenced floor",
                    ratio("/ratios/uncontended_throughput_vs_fenced_floor")
                );
            }
            if self.has("/ratios/uncontended_throughput_vs_peer") {
                let _ = writeln!(
                    out,
                    "uncontended throughput = {} the peer ({})",
                    ratio("/ratios/uncontended_throughput_vs_peer"),
                    text("/peer/op").split(':').next().unwrap_or_default()
                );
            }
            let _ = write!(
                out,
                "hand-off p50 = {} the raw hand-off floor\n\
                 hand-off p50 = {} the floor's round trip (pair p50 / 2)\n",
                ratio("/ratios/handoff_p50_vs_raw_handoff_floor"),
                ratio("/ratios/handoff_p50_vs_floor_round_trip"),
            );
            if self.has("/ratios/election_handoff_p50_vs_raw_handoff_floor") {
                let _ = writeln!(
                    out,
                    "election hand-over p50 = {} the raw hand-off floor",
                    ratio("/ratios/election_handoff_p50_vs_raw_handoff_floor")
                );
            }
        }
        if let Some(verdict) = super::verdict::verdict(self.figures) {
            let _ = writeln!(out, "{verdict}");
        }
        out
    }
}

fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|&c| c.to_owned()).collect()
}

/// Lays `rows` out in columns: the first left-aligned, the others right-aligned.
pub(super) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in rows {
        let mut line = String::new();
        for (c, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[c].saturating_sub(cell.chars().count()));
            if c == 0 {
                line.push_str(cell);
                line.push_str(&pad);
            } else {
                line.push_str("  ");
                line.push_str(&pad);
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ops: f64, samples: u64, ratio: f64, tasks_ops: f64) -> Value {
        json!({
            "uncontended": {"ops_per_sec": ops, "p50_us": 100.0, "samples": samples},
            "handoff": {"waiters": 4, "hold_us": 2000, "p50_us": 300.0},
            "parallel_names": [{"tasks": 16, "ops_per_sec": tasks_ops, "vs_floor": ratio}],
            "raw_floor": {"op": "SET NX PX", "ops_per_sec": 2.0 * ops},
            "ratios": {"uncontended_throughput_vs_floor": ratio},
        })
    }

    #[test]
    fn rounds_make_medians_and_spreads_of_every_figure_and_ratio() {
        let rounds = [
            round(300.0, 30, 0.9, 3000.0),
            round(100.0, 10, 0.5, 1000.0),
            round(200.0, 21, 0.77, 2000.0),
        ];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["ops_per_sec"], json!(200.0));
        assert_eq!(median["uncontended"]["samples"], json!(21));
        assert_eq!(median["raw_floor"]["ops_per_sec"], json!(400.0));
        assert_eq!(
            median["ratios"]["uncontended_throughput_vs_floor"],
            json!(0.77)
        );
        assert_eq!(median["parallel_names"][0]["tasks"], json!(16));
        assert_eq!(median["parallel_names"][0]["vs_floor"], json!(0.77));
        // Settings and text as given.
        assert_eq!(median["handoff"]["waiters"], json!(4));
        assert_eq!(median["raw_floor"]["op"], json!("SET NX PX"));

        let spread = Combine::Spread.rounds(&rounds).unwrap();
        assert_eq!(spread["uncontended"]["ops_per_sec"], json!([100.0, 300.0]));
        assert_eq!(spread["uncontended"]["samples"], json!([10, 30]));
        assert_eq!(
            spread["ratios"]["uncontended_throughput_vs_floor"],
            json!([0.5, 0.9])
        );
        assert_eq!(
            spread["parallel_names"][0]["ops_per_sec"],
            json!([1000.0, 3000.0])
        );
        // No spread of what does not vary by nature.
        assert!(spread["handoff"].get("waiters").is_none(), "{spread}");
        assert!(spread["raw_floor"].get("op").is_none(), "{spread}");
        assert!(
            spread["parallel_names"][0].get("tasks").is_none(),
            "{spread}"
        );
    }

    #[test]
    fn an_even_count_of_rounds_takes_the_mean_of_the_middle_two() {
        let rounds = [round(100.0, 10, 0.5, 1.0), round(201.0, 11, 0.6, 2.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["ops_per_sec"], json!(151.0));
        assert_eq!(median["uncontended"]["samples"], json!(11));
        assert_eq!(
            median["ratios"]["uncontended_throughput_vs_floor"],
            json!(0.55)
        );
    }

    #[test]
    fn a_figure_a_round_could_not_measure_has_no_median() {
        let mut empty = round(100.0, 0, 0.5, 1.0);
        empty["uncontended"]["p50_us"] = Value::Null;
        let rounds = [empty, round(100.0, 10, 0.5, 1.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        assert_eq!(median["uncontended"]["p50_us"], Value::Null);
    }

    #[test]
    fn the_table_shows_medians_with_their_spread_after_several_rounds() {
        let rounds = [round(100.0, 10, 0.5, 1000.0), round(300.0, 30, 0.9, 3000.0)];
        let median = Combine::Median.rounds(&rounds).unwrap();
        let report = Report {
            figures: &median,
            spread: Combine::Spread.rounds(&rounds),
        };
        assert_eq!(
            report.fig("/uncontended/ops_per_sec", Unit::Whole),
            "200 [100–300]"
        );
        assert_eq!(
            report.fig("/ratios/uncontended_throughput_vs_floor", Unit::Ratio),
            "0.70x [0.50–0.90]"
        );
        let single = Report {
            figures: &rounds[0],
            spread: None,
        };
        assert_eq!(single.fig("/uncontended/ops_per_sec", Unit::Whole), "100");
        assert_eq!(single.fig("/handoff/p99_us", Unit::Whole), "-");
    }

    #[test]
    fn the_fenced_floor_has_its_rows_and_ratios_only_where_it_was_measured() {
        let run = Run {
            label: "redis(test)",
            duration: Duration::from_secs(1),
            rounds: 1,
            waiters: 4,
            hold: Duration::from_millis(2),
        };
        let mut figures = round(100.0, 10, 0.9, 1000.0);
        let plain = Report {
            figures: &figures,
            spread: None,
        }
        .render(&run);
        assert!(plain.contains("= 0.90x the floor"), "{plain}");
        assert!(!plain.contains("fenced"), "{plain}");

        figures["raw_fenced_floor"] = json!({"op": "SET NX PX + token", "ops_per_sec": 110.0});
        figures["ratios"]["uncontended_throughput_vs_fenced_floor"] = json!(0.91);
        figures["parallel_names"][0]["vs_fenced_floor"] = json!(0.97);
        let fenced = Report {
            figures: &figures,
            spread: None,
        }
        .render(&run);
        assert!(
            fenced.contains("raw fenced floor: SET NX PX + token"),
            "{fenced}"
        );
        assert!(fenced.contains("= 0.91x the fenced floor"), "{fenced}");
        assert!(fenced.contains("dlock / fenced"), "{fenced}");
        assert!(fenced.contains("0.97x"), "{fenced}");
    }

    #[test]
    fn the_peer_has_its_row_column_and_ratio_only_where_it_was_measured() {
        let run = Run {
            label: "redlock(test)",
            duration: Duration::from_secs(1),
            rounds: 1,
            waiters: 4,
            hold: Duration::from_millis(2),
        };
        let mut figures = round(100.0, 10, 0.9, 1000.0);
        let without = Report {
            figures: &figures,
            spread: None,
        }
        .render(&run);
        assert!(!without.contains("peer"), "{without}");

        figures["peer"] = json!({"op": "rslock 0.10: lock + unlock", "ops_per_sec": 80.0});
        figures["ratios"]["uncontended_throughput_vs_peer"] = json!(1.25);
        figures["parallel_names"][0]["vs_peer"] = json!(1.31);
        let with = Report {
            figures: &figures,
            spread: None,
        }
        .render(&run);
        assert!(with.contains("peer: rslock 0.10: lock + unlock"), "{with}");
        assert!(with.contains("= 1.25x the peer (rslock 0.10)"), "{with}");
        assert!(with.contains("dlock / peer"), "{with}");
        assert!(with.contains("1.31x"), "{with}");
    }
}
