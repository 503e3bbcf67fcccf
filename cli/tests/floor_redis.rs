//! `dlock bench`'s raw floors against a real Redis: pairs, the same pairs taking a fencing
//! token, the notified hand-off (`DEL`+`PUBLISH` to a subscriber's `SET NX`) and many tasks on
//! one connection.

mod common;

use dlock_test_servers::RedisServer;

#[test]
fn bench_measures_every_raw_floor_of_redis() {
    let redis = RedisServer::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&redis.url());
    common::assert_every_floor_measured(&report, "DEL+PUBLISH, waiters race SET NX");
    assert_eq!(
        report["raw_parallel_floor"]["client"], "one multiplexed connection",
        "{report}"
    );
    for round in report["rounds"]
        .as_array()
        .expect("rounds")
        .iter()
        .chain([&report])
    {
        for at in [
            "/raw_fenced_floor/samples",
            "/raw_fenced_floor/ops_per_sec",
            "/ratios/uncontended_throughput_vs_fenced_floor",
        ] {
            let figure = round.pointer(at).and_then(serde_json::Value::as_f64);
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
