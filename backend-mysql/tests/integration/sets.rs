//! A set of locks taken together on one connection against a real MariaDB: every member a
//! `GET_LOCK` of its own on one connection, nothing left when a member is busy or the acquire
//! is dropped, each member released alone, every member lost with the connection.

use crate::common;

use std::time::Duration;

use common::{MySqlHarness, holder, kill_connection};
use dlock_api::{AtOnce, DistributedLock, DistributedLockExt, LockName, LockOptions};
use dlock_mysql::MySqlLock;

fn names(tag: &str, count: usize) -> Vec<LockName> {
    let tag = format!("{tag}-{}-{:08x}", std::process::id(), rand::random::<u32>());
    (0..count)
        .map(|i| LockName::new(format!("{tag}-{i}")).unwrap())
        .collect()
}

async fn client(url: &str) -> MySqlLock {
    MySqlLock::connect_url(url).await.unwrap()
}

/// `IS_USED_LOCK` of each name's key: the connection holding it.
async fn holders(url: &str, locks: &MySqlLock, names: &[LockName]) -> Vec<Option<u64>> {
    let mut ids = Vec::new();
    for name in names {
        ids.push(holder(url, &locks.key(name)).await);
    }
    ids
}

/// Fails unless no connection holds any of `names`, as the server says.
async fn assert_nothing_held(url: &str, locks: &MySqlLock, names: &[LockName]) {
    let left = holders(url, locks, names).await;
    assert!(left.iter().all(Option::is_none), "left held: {left:?}");
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not true after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_set_is_taken_on_one_connection() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let locks = client(url).await;
    let names = names("setone", 4);
    let AtOnce::Taken(set) = locks
        .try_acquire_at_once(&names, &LockOptions::new())
        .await
        .unwrap()
    else {
        panic!("a free set was not taken in one step");
    };
    let held = holders(url, &locks, &names).await;
    assert!(held[0].is_some(), "{held:?}");
    assert!(
        held.iter().all(|id| *id == held[0]),
        "not one connection: {held:?}"
    );
    let mut tokens: Vec<_> = set.fencing_tokens().into_iter().map(|(_, t)| t).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 4, "each member has a token of its own");
    set.release().await.unwrap();
    assert_nothing_held(url, &locks, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_member_leaves_nothing_held() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let (locks, other) = (client(url).await, client(url).await);
    let names = names("setbusy", 4);
    let held = other
        .try_acquire(&names[2], &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let tried = locks
        .try_acquire_at_once(&names, &LockOptions::new())
        .await
        .unwrap();
    assert!(matches!(tried, AtOnce::Busy), "{tried:?}");
    let left = holders(url, &locks, &names).await;
    let holder_of_busy = left[2];
    assert!(holder_of_busy.is_some());
    for (i, id) in left.iter().enumerate() {
        assert!(i == 2 || id.is_none(), "member {i} left held: {left:?}");
    }
    held.release().await.unwrap();
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("the set is free once the member is released");
    set.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_member_is_released_alone() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let (locks, other) = (client(url).await, client(url).await);
    let names = names("setalone", 3);
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let mut guards = set.into_guards();
    let middle = guards.remove(1);
    middle.release().await.unwrap();
    let left = holders(url, &locks, &names).await;
    assert!(
        left[1].is_none() && left[0].is_some() && left[2] == left[0],
        "{left:?}"
    );
    let probe = other
        .try_acquire(&names[1], &LockOptions::new())
        .await
        .unwrap()
        .expect("the released member is free");
    assert!(guards.iter().all(|g| g.is_held()));
    probe.release().await.unwrap();
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_nothing_held(url, &locks, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_loses_every_member() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let locks = client(url).await;
    let names = names("setkill", 3);
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let id = locks.holder_connection_id(&names[0]).expect("a holder");
    kill_connection(url, id).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), set.lost())
        .await
        .expect("the set learns it is lost");
    let guards = set.into_guards();
    eventually("every member lost", || async {
        guards.iter().all(|g| !g.is_held())
    })
    .await;
    let again = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("the set again after the connection ended");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_attempt_leaves_nothing() {
    let harness = MySqlHarness::shared();
    let url = harness.url();
    let locks = client(url).await;
    let names = names("setdrop", 4);
    let options = LockOptions::new();
    for yields in 0..24 {
        let attempt = locks.try_acquire_all(&names, &options);
        tokio::select! {
            biased;
            () = yield_times(yields) => {}
            taken = attempt => drop(taken.unwrap()),
        }
    }
    dlock_api::settle().await;
    eventually("nothing left held by the dropped attempts", || async {
        holders(url, &locks, &names)
            .await
            .iter()
            .all(Option::is_none)
    })
    .await;
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("the names are free after the dropped attempts");
    set.release().await.unwrap();
}

async fn yield_times(count: u32) {
    for _ in 0..count {
        tokio::task::yield_now().await;
    }
}

/// The counter rows (one statement per member on the one connection) and no fencing (one
/// statement of `GET_LOCK`s alone) take a set on one connection too, and leave nothing when a
/// member is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fence_takes_a_set_on_one_connection() {
    let harness = MySqlHarness::shared();
    for option in ["fencing=table", "fencing=false"] {
        let url = format!("{}?{option}", harness.url());
        let (locks, other) = (client(&url).await, client(&url).await);
        let names = names("setfence", 3);
        let set = locks
            .try_acquire_all(&names, &LockOptions::new())
            .await
            .unwrap()
            .expect("a free set is granted");
        let held = holders(&url, &locks, &names).await;
        assert!(
            held[0].is_some() && held.iter().all(|id| *id == held[0]),
            "{option}: {held:?}"
        );
        let tokens: Vec<_> = set.fencing_tokens().into_iter().map(|(_, t)| t).collect();
        assert!(
            option == "fencing=false" || tokens.windows(2).all(|t| t[0] != t[1]),
            "{option}: {tokens:?}"
        );
        let mut guards = set.into_guards();
        let busy = guards.pop().unwrap();
        for guard in guards {
            guard.release().await.unwrap();
        }
        let tried = other
            .try_acquire_at_once(&names, &LockOptions::new())
            .await
            .unwrap();
        assert!(matches!(tried, AtOnce::Busy), "{option}: {tried:?}");
        let left = holders(&url, &locks, &names).await;
        assert!(
            left[0].is_none() && left[1].is_none() && left[2].is_some(),
            "{option}: {left:?}"
        );
        busy.release().await.unwrap();
    }
}
