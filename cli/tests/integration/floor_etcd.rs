//! `dlock bench`'s raw floors against a real etcd member: create + guarded delete pairs, the
//! hand-off through a synced watch on the predecessor, and many tasks on one client.

use crate::common;

use dlock_test_servers::Etcd;

#[test]
fn bench_measures_every_raw_floor_of_etcd() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let report = common::bench(&format!("etcd://{}", etcd.addr()));
    common::assert_every_floor_measured(
        &report,
        "guarded delete, then the waiter's watch (from the read's revision + 1) fires",
    );
}

/// `dlock bench --permits 1,3`: each number of permits measured against the raw floor of
/// the same line of keys, a waiter counting the deletions ahead of it on a watch of the
/// name's range.
#[test]
fn bench_measures_semaphores_against_their_raw_floor() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    common::assert_permits_measured_against_their_floor(
        &format!("etcd://{}", etcd.addr()),
        "300ms",
    );
}
