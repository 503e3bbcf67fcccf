//! `dlock bench`'s raw floors against a real MariaDB: `GET_LOCK` + `RELEASE_LOCK` pairs on a
//! held connection, the same pairs taking a token from a sequence, the server queue handing a
//! blocking `GET_LOCK` on, and many tasks on a pool as large as dlock's.

use crate::common;

use dlock_test_servers::MariaDb;

#[test]
fn bench_measures_every_raw_floor_of_mysql() {
    let server = MariaDb::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&server.url());
    common::assert_every_floor_measured(
        &report,
        "RELEASE_LOCK, then the next blocking GET_LOCK answers (raw connections contending as dlock's clients do)",
    );
    common::assert_fenced_floor_measured(&report);
    assert_no_counter_left(&server);
}

/// The fenced floor's sequences (or counter tables) are dropped after each measurement.
fn assert_no_counter_left(server: &MariaDb) {
    let left = server
        .query(
            "SELECT table_name FROM information_schema.tables \
             WHERE table_name LIKE 'dlock\\_fence\\_floor%'",
        )
        .unwrap();
    assert!(left.trim().is_empty(), "left behind: {left}");
}

/// `dlock bench --permits 1,3`: each number of permits measured against the raw floor of one of
/// N slot locks with its token. Waiters line up for a room, and the first in line tries every
/// slot each 5 ms; the floor's sequences are dropped.
#[test]
fn bench_measures_semaphores_against_their_raw_floor() {
    let server = MariaDb::start().unwrap_or_else(|e| panic!("{e}"));
    common::assert_permits_measured_against_their_floor(&server.url(), "1s");
    assert_no_counter_left(&server);
}
