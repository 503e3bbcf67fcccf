//! The one-line verdict under `dlock bench`'s table: whose is the gap between dlock's
//! uncontended pair and the floor's. A pair that runs slower than the floor's while this process
//! spends as much more CPU on it as the pair takes longer is slowed by the client's own work;
//! one whose CPU is the floor's is slowed by the server or the wire (on a machine whose cores
//! the server shares, every microsecond of client CPU is one the server did not get).

use serde_json::Value;

/// Throughput at or above this share of the floor's is the floor's, within a run's noise.
const AT_FLOOR: f64 = 0.95;

/// The verdict from the report's figures (medians): against the fenced floor where one was
/// measured (the floor that hands out a token as dlock does), else the plain one; `None`
/// without a floor or its CPU figures.
pub(super) fn verdict(figures: &Value) -> Option<String> {
    let floor_at = if figures.pointer("/raw_fenced_floor/ops_per_sec").is_some() {
        "/raw_fenced_floor"
    } else {
        "/raw_floor"
    };
    let number = |at: String| figures.pointer(&at).and_then(Value::as_f64);
    let ours = Side {
        per_sec: number("/uncontended/ops_per_sec".to_owned())?,
        cpu_us: number("/uncontended/cpu_us_per_op".to_owned())?,
    };
    let floor = Side {
        per_sec: number(format!("{floor_at}/ops_per_sec"))?,
        cpu_us: number(format!("{floor_at}/cpu_us_per_op"))?,
    };
    let fenced = floor_at == "/raw_fenced_floor";
    // The ratio the report prints above (the median of each round's), where there is one.
    let ratio_at = match fenced {
        true => "/ratios/uncontended_throughput_vs_fenced_floor",
        false => "/ratios/uncontended_throughput_vs_floor",
    };
    let throughput = number(ratio_at.to_owned()).unwrap_or(ours.per_sec / floor.per_sec);
    Some(judge(&ours, &floor, throughput, fenced))
}

/// One side's uncontended pairs: how many per second, and this process's CPU on each.
struct Side {
    per_sec: f64,
    cpu_us: f64,
}

fn judge(ours: &Side, floor: &Side, throughput: f64, fenced: bool) -> String {
    let cpu = ours.cpu_us / floor.cpu_us;
    let which = if fenced { "fenced floor" } else { "floor" };
    let head = format!(
        "verdict: throughput {throughput:.2}x the {which}, client CPU per pair {cpu:.2}x its"
    );
    if throughput >= AT_FLOOR {
        return format!("{head}: at the floor");
    }
    // How much longer dlock's pair takes, and how much of that is this process's extra CPU.
    let longer_us = 1e6 / ours.per_sec - 1e6 / floor.per_sec;
    let extra_cpu_us = ours.cpu_us - floor.cpu_us;
    let whose = if extra_cpu_us >= longer_us / 2.0 {
        "mostly the client's own work"
    } else {
        "mostly the server's or the wire's"
    };
    format!(
        "{head}: the pair takes {longer_us:.1} µs longer, {extra_cpu_us:.1} µs of it more client \
         CPU: {whose}"
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_gap_paid_in_client_cpu_is_the_clients() {
        let figures = json!({
            "uncontended": {"ops_per_sec": 8000.0, "cpu_us_per_op": 70.0},
            "raw_floor": {"ops_per_sec": 10000.0, "cpu_us_per_op": 50.0},
        });
        let line = verdict(&figures).unwrap();
        assert!(line.contains("throughput 0.80x the floor"), "{line}");
        assert!(line.contains("1.40x"), "{line}");
        assert!(line.contains("25.0 µs longer, 20.0 µs of it"), "{line}");
        assert!(line.ends_with("the client's own work"), "{line}");
    }

    #[test]
    fn a_gap_at_the_same_cpu_is_the_servers_and_the_fenced_floor_is_the_reference() {
        let figures = json!({
            "uncontended": {"ops_per_sec": 8000.0, "cpu_us_per_op": 51.0},
            "raw_floor": {"ops_per_sec": 20000.0, "cpu_us_per_op": 40.0},
            "raw_fenced_floor": {"ops_per_sec": 10000.0, "cpu_us_per_op": 50.0},
        });
        let line = verdict(&figures).unwrap();
        assert!(line.contains("the fenced floor"), "{line}");
        assert!(line.ends_with("the server's or the wire's"), "{line}");
    }

    #[test]
    fn at_the_floor_or_without_one() {
        let mut figures = json!({
            "uncontended": {"ops_per_sec": 9600.0, "cpu_us_per_op": 52.0},
            "raw_floor": {"ops_per_sec": 10000.0, "cpu_us_per_op": 50.0},
        });
        assert!(verdict(&figures).unwrap().ends_with("at the floor"));
        figures["raw_floor"] = Value::Null;
        assert_eq!(verdict(&figures), None);
    }
}
