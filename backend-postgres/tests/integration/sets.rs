//! A set of locks taken together on one session against a real Postgres: every member an
//! advisory lock of its own on one backend, nothing left when a member is busy or the acquire
//! is dropped, each member released alone, every member lost with the session.

use crate::common;

use std::time::Duration;

use common::{
    advisory_locks, client, eventually, holder_pid, shared_url, terminate_holder, unique,
};
use dlock_api::{AtOnce, DistributedLock, DistributedLockExt, LockName, LockOptions};
use dlock_postgres::AdvisoryKey;

fn names(tag: &str, count: usize) -> Vec<LockName> {
    let tag = unique(tag);
    (0..count)
        .map(|i| LockName::new(format!("{tag}-{i}")).unwrap())
        .collect()
}

async fn pids(names: &[LockName]) -> Vec<Option<i32>> {
    let mut pids = Vec::new();
    for name in names {
        pids.push(holder_pid(&shared_url(), &AdvisoryKey::Name(name.clone())).await);
    }
    pids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_set_is_taken_on_one_session() {
    let app = unique("setone");
    let locks = client(&app).await;
    let names = names("setone", 4);
    let AtOnce::Taken(set) = locks
        .try_acquire_at_once(&names, &LockOptions::new())
        .await
        .unwrap()
    else {
        panic!("a free set was not taken in one step");
    };
    let held = pids(&names).await;
    assert!(held[0].is_some(), "{held:?}");
    assert!(
        held.iter().all(|pid| *pid == held[0]),
        "not one session: {held:?}"
    );
    assert_eq!(advisory_locks(&shared_url(), &app).await, (4, 0));
    let mut tokens: Vec<_> = set.fencing_tokens().into_iter().map(|(_, t)| t).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 4, "each member has a token of its own");
    set.release().await.unwrap();
    assert_eq!(advisory_locks(&shared_url(), &app).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_member_leaves_nothing_held() {
    let app = unique("setbusy");
    let (locks, other) = (client(&app).await, client(&unique("setother")).await);
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
    assert!(
        locks
            .try_acquire_all(&names, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(advisory_locks(&shared_url(), &app).await, (0, 0));
    assert!(held.is_held());
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
    let app = unique("setalone");
    let (locks, other) = (client(&app).await, client(&unique("setprobe")).await);
    let names = names("setalone", 3);
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let mut guards = set.into_guards();
    let middle = guards.remove(1);
    middle.release().await.unwrap();
    assert_eq!(advisory_locks(&shared_url(), &app).await, (2, 0));
    let probe = other
        .try_acquire(&names[1], &LockOptions::new())
        .await
        .unwrap()
        .expect("the released member is free");
    for name in [&names[0], &names[2]] {
        assert!(
            other
                .try_acquire(name, &LockOptions::new())
                .await
                .unwrap()
                .is_none()
        );
    }
    assert!(guards.iter().all(|g| g.is_held()));
    probe.release().await.unwrap();
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(advisory_locks(&shared_url(), &app).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_loses_every_member() {
    let locks = client(&unique("setkill")).await;
    let names = names("setkill", 3);
    let set = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    let killed = terminate_holder(&shared_url(), &AdvisoryKey::Name(names[0].clone()))
        .await
        .unwrap();
    assert_eq!(killed, 1);
    tokio::time::timeout(Duration::from_secs(30), set.lost())
        .await
        .expect("the set learns it is lost");
    let guards = set.into_guards();
    eventually("every member lost", || async {
        guards.iter().all(|g| !g.is_held())
    })
    .await;
    // The same client takes the set again, on a new session.
    let again = locks
        .try_acquire_all(&names, &LockOptions::new())
        .await
        .unwrap()
        .expect("the set again after the session ended");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_attempt_leaves_nothing() {
    let app = unique("setdrop");
    let locks = client(&app).await;
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
        advisory_locks(&shared_url(), &app).await == (0, 0)
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
