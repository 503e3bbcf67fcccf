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
