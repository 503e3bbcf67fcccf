//! `dlock bench`'s raw floors against a real member: they run and give samples.

mod common;

use std::time::Duration;

/// The raw hand-off floor: two clients hand a key back and forth through the synced-watch
/// recipe, and each hand-off gives a sample.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_handoff_floor_hands_off_through_a_synced_watch() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let samples = dlock_etcd::raw_handoff_floor(&url, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(!samples.is_empty(), "no hand-off was measured");
}
