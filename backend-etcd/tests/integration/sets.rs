//! Sets of locks on etcd: a free set is taken in one transaction whose compares say every name's
//! range is empty (a `CREATE` compare over an empty range holds, checked here on the server
//! itself first), each member a key of the client's as a single try puts it, all of one
//! revision; a set with a member held writes nothing; a member in use as a semaphore leaves the
//! single try to answer; a set dropped mid-flight leaves no key; a set of more names than one
//! transaction takes goes one by one.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions, Renewal};
use etcd_client::{Client, Compare, CompareOp, GetOptions, KeyValue, Txn, WatchOptions};

use dlock_etcd::EtcdLock;

fn names(test: &str, count: usize) -> Vec<LockName> {
    (0..count)
        .map(|i| LockName::new(format!("dlock-sets/{}/{test}/{i}", std::process::id())).unwrap())
        .collect()
}

/// Two clients of the shared server, its URL and a raw client.
async fn setup() -> (EtcdLock, EtcdLock, String, Client) {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let a = EtcdLock::connect_url(&url).await.unwrap();
    let b = EtcdLock::connect_url(&url).await.unwrap();
    let raw = common::raw_client(&url).await.unwrap();
    (a, b, url, raw)
}

/// The keys under `name` now, oldest first.
async fn keys_of(raw: &mut Client, url: &str, name: &LockName) -> Vec<KeyValue> {
    let range = common::name_range(url, name);
    let options = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    raw.get(range, Some(options)).await.unwrap().take_kvs()
}

/// Whether a transaction comparing `range`'s create revision to 0 over the whole range holds.
async fn range_compares_empty(raw: &mut Client, range: &str) -> bool {
    let txn = Txn::new().when([Compare::create_revision(range, CompareOp::Equal, 0).with_prefix()]);
    raw.txn(txn).await.unwrap().succeeded()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_compare_over_a_range_holds_only_while_it_is_empty() {
    let (_, _, url, mut raw) = setup().await;
    let name = &names("compare", 1)[0];
    let range = common::name_range(&url, name);
    assert!(range_compares_empty(&mut raw, &range).await);
    // The key right after the range (where a leader record lives) is not in it.
    let record = format!("{}0", range.trim_end_matches('/'));
    raw.put(record.as_str(), "outside", None).await.unwrap();
    assert!(range_compares_empty(&mut raw, &range).await);
    let key = format!("{range}inside");
    raw.put(key.as_str(), "", None).await.unwrap();
    assert!(!range_compares_empty(&mut raw, &range).await);
    raw.delete(key.as_str(), None).await.unwrap();
    assert!(range_compares_empty(&mut raw, &range).await);
    raw.delete(record.as_str(), None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_set_is_one_transaction_of_single_lock_keys() {
    let (a, b, url, mut raw) = setup().await;
    let names = names("free", 4);
    let set = a
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("a free set");
    let tokens = set.fencing_tokens();
    let token = tokens[0].1;
    assert!(
        tokens.iter().all(|(_, t)| *t == token),
        "one transaction, one revision: {tokens:?}"
    );
    let mut leases = Vec::new();
    for name in &names {
        let keys = keys_of(&mut raw, &url, name).await;
        assert_eq!(keys.len(), 1, "{name}: {keys:?}");
        let key = &keys[0];
        assert_eq!(u64::try_from(key.create_revision()).ok(), Some(token.get()));
        assert!(key.value().is_empty(), "a lock's key carries no value");
        assert_ne!(key.lease(), 0);
        leases.push(key.lease());
        assert!(
            b.try_acquire(name, &LockOptions::new())
                .await
                .unwrap()
                .is_none()
        );
    }
    assert!(
        leases.iter().all(|l| *l == leases[0]),
        "one session lease for the set: {leases:?}"
    );
    set.release().await.unwrap();
    for name in &names {
        assert!(keys_of(&mut raw, &url, name).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_without_renewal_rides_a_lease_per_member() {
    let (a, _, url, mut raw) = setup().await;
    let names = names("own-leases", 3);
    let options = LockOptions::new().with_renewal(Renewal::Off);
    let set = a
        .try_acquire_all(&names, &options)
        .await
        .unwrap()
        .expect("a free set");
    let mut leases = Vec::new();
    for name in &names {
        let keys = keys_of(&mut raw, &url, name).await;
        assert_eq!(keys.len(), 1, "{name}: {keys:?}");
        leases.push(keys[0].lease());
    }
    leases.sort_unstable();
    leases.dedup();
    assert_eq!(leases.len(), names.len(), "each member its own lease");
    set.release().await.unwrap();
    for name in &names {
        assert!(keys_of(&mut raw, &url, name).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_with_a_member_held_writes_nothing() {
    let (a, b, url, mut raw) = setup().await;
    let names = names("busy", 3);
    let held = a.acquire(&names[1], &LockOptions::new()).await.unwrap();
    let holder = keys_of(&mut raw, &url, &names[1]).await;
    let range = common::name_range(&url, &names[0]);
    let before = raw.get(range.as_str(), None).await.unwrap();
    let before = before.header().expect("a header").revision();
    let tried = b
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap();
    assert!(tried.is_none(), "a set with a held member was granted");
    // Taken one by one, the free member before the held one would have been put and deleted
    // again: the first event under its range since the try began must be a marker put after.
    let marker = format!("{range}marker");
    raw.put(marker.as_str(), "", None).await.unwrap();
    let watch = WatchOptions::new()
        .with_prefix()
        .with_start_revision(before.saturating_add(1));
    let mut events = raw.watch(range.as_str(), Some(watch)).await.unwrap();
    let first = loop {
        // The first answer may only say the watch was created.
        let answer = events.message().await.unwrap().expect("an event");
        if let Some(event) = answer.events().first() {
            break event.kv().map(|kv| kv.key().to_vec());
        }
    };
    assert_eq!(first, Some(marker.clone().into_bytes()));
    raw.delete(marker.as_str(), None).await.unwrap();
    for name in [&names[0], &names[2]] {
        assert!(keys_of(&mut raw, &url, name).await.is_empty(), "{name}");
    }
    // Only the holder's key, untouched: no key of the set joined its line, even for a moment.
    let seen = |kvs: &[KeyValue]| -> Vec<(Vec<u8>, i64, i64)> {
        kvs.iter()
            .map(|kv| (kv.key().to_vec(), kv.create_revision(), kv.mod_revision()))
            .collect()
    };
    let now = keys_of(&mut raw, &url, &names[1]).await;
    assert_eq!(seen(&now), seen(&holder));
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_in_use_as_a_semaphore_is_left_to_the_single_try() {
    let (a, b, url, mut raw) = setup().await;
    let names = names("semaphore", 2);
    let permit = a
        .try_acquire_permit(&names[1], 2, &LockOptions::new())
        .await
        .unwrap()
        .expect("a free permit");
    let tried = b.try_acquire_all(&names, &LockOptions::new()).await;
    assert!(
        matches!(tried, Err(LockError::InvalidArgument { .. })),
        "a set over a semaphore's name answered {tried:?}"
    );
    dlock_api::settle().await;
    assert!(keys_of(&mut raw, &url, &names[0]).await.is_empty());
    assert_eq!(keys_of(&mut raw, &url, &names[1]).await.len(), 1);
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_dropped_mid_flight_leaves_no_key() {
    let (a, _, url, mut raw) = setup().await;
    let names = names("dropped", 3);
    for micros in [0u64, 50, 200, 500, 1_000, 2_000, 5_000] {
        let _ = tokio::time::timeout(
            Duration::from_micros(micros),
            a.try_acquire_all(&names, &LockOptions::new()),
        )
        .await;
    }
    dlock_api::settle().await;
    for name in &names {
        assert!(keys_of(&mut raw, &url, name).await.is_empty(), "{name}");
    }
    let set = a
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("the set, free again");
    set.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_too_large_for_one_transaction_goes_one_by_one() {
    let (a, _, url, mut raw) = setup().await;
    let names = names("large", 65);
    let set = a
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("a free set");
    let tokens = set.fencing_tokens();
    assert!(
        tokens.windows(2).all(|t| t[0].1 < t[1].1),
        "members taken one after another: {tokens:?}"
    );
    set.release().await.unwrap();
    for name in &names {
        assert!(keys_of(&mut raw, &url, name).await.is_empty(), "{name}");
    }
}
