//! `close` ends what an etcd client keeps on the server: its session lease is revoked at once, not
//! left to run out its TTL (24 `dlock run` processes that exited cleanly once left 24 leases).

use std::time::Duration;

use crate::common;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_etcd::EtcdLock;
use etcd_client::GetOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_revokes_the_clients_lease() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let lock = EtcdLock::connect_url(&url).await.unwrap();
    let name = LockName::new(format!("dlock-close/{}/lease", std::process::id())).unwrap();
    let guard = lock.acquire(&name, &LockOptions::new()).await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let held = raw
        .get(
            common::name_range(&url, &name),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let lease = held.kvs()[0].lease();
    assert_ne!(lease, 0, "the held key rides no lease");

    let report = lock.close(Duration::from_secs(10)).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    let left = raw.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(left.ttl(), -1, "the lease outlived close: {left:?}");
    assert!(guard.release().await.is_err());
}
