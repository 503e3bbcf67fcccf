//! `dlock bench`'s raw floors against a real Postgres: advisory-lock pairs on a held
//! connection, the server handing a blocking `pg_advisory_lock` on, and many tasks on a pool as
//! large as dlock's.

use crate::common;

use dlock_test_servers::Postgres;

#[test]
fn bench_measures_every_raw_floor_of_postgres() {
    let server = Postgres::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&server.url());
    common::assert_every_floor_measured(
        &report,
        "pg_advisory_unlock, then the next blocking pg_advisory_lock answers (raw connections contending as dlock's clients do)",
    );
}

/// `dlock bench --permits 1,3`: each number of permits measured against the raw floor of one
/// of N slot advisory locks with its token. A waiter blocks on one slot and tries them all
/// every 500 ms, so the phases run two seconds to see hand-offs on both sides; the floor's fence
/// sequence is dropped.
#[test]
fn bench_measures_semaphores_against_their_raw_floor() {
    let server = Postgres::start().unwrap_or_else(|e| panic!("{e}"));
    common::assert_permits_measured_against_their_floor(&server.url(), "2s");
    let left = server
        .query("SELECT count(*) FROM pg_class WHERE relname LIKE 'dlock_bench_%'")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(left.trim(), "0", "floor sequences left");
}

/// `dlock bench --profile dlock|floor --profile-permits 3 --pairs N`: one side's semaphore
/// pairs alone, the given number of them, for a profiler.
#[test]
fn bench_profiles_either_side_of_a_semaphore() {
    let server = Postgres::start().unwrap_or_else(|e| panic!("{e}"));
    for (side, label) in [("dlock", "Dlock: 20 pairs"), ("floor", "Floor: 20 pairs")] {
        let stdout = common::succeeds([
            "bench",
            "--backend",
            &server.url(),
            "--profile",
            side,
            "--profile-permits",
            "3",
            "--pairs",
            "20",
        ]);
        assert!(stdout.contains(label), "{side}: {stdout}");
    }
}
