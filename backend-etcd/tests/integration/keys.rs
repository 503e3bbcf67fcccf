//! The keys an etcd client puts: each acquire names the first key of its name and lease that the
//! client does not use, so acquire after acquire reuses the same few keys. etcd keeps a deleted
//! key in its index until compaction, and every queue read walks the name's range there: a
//! fresh key per acquire made a busy name slower with every acquire.

use crate::common;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_etcd::EtcdLock;
use etcd_client::GetOptions;

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-keys/{}/{test}", std::process::id())).unwrap()
}

/// The keys under `name` now.
async fn keys_of(url: &str, name: &LockName) -> Vec<String> {
    let mut raw = common::raw_client(url).await.unwrap();
    let range = raw
        .get(
            common::name_range(url, name),
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    range
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_one_after_another_reuse_one_key_and_tasks_at_once_get_their_own() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let lock = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("reuse");
    let mut seen = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = lock.acquire(&name, &LockOptions::new()).await.unwrap();
        seen.push(keys_of(&url, &name).await);
        tokens.push(guard.fencing_token());
        guard.release().await.unwrap();
    }
    assert_eq!(seen[0].len(), 1);
    assert!(seen.iter().all(|keys| *keys == seen[0]), "{seen:?}");
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{tokens:?}");
    assert!(keys_of(&url, &name).await.is_empty());

    // Two tasks of one client at once: two keys, and the second one waits on the first.
    let first = lock.acquire(&name, &LockOptions::new()).await.unwrap();
    let second = tokio::spawn({
        let (lock, name) = (lock.clone(), name.clone());
        async move {
            lock.acquire(
                &name,
                &LockOptions::new().with_wait_timeout(std::time::Duration::from_secs(30)),
            )
            .await
        }
    });
    dlock_conformance::wait_for::within(
        std::time::Duration::from_secs(30),
        "the second key",
        async {
            while keys_of(&url, &name).await.len() < 2 {
                tokio::task::yield_now().await;
            }
        },
    )
    .await;
    let both = keys_of(&url, &name).await;
    assert!(both.contains(&seen[0][0]), "{both:?}");
    first.release().await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert!(second.fencing_token() > tokens[2]);
    second.release().await.unwrap();
}
