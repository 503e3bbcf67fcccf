//! Semaphores on named locks, on a server of their own: each permit is a slot lock other code
//! can read (`IS_USED_LOCK('<key> <N>/<slot>')`), and a holder whose connection is killed gives
//! its permit back at once, to a waiter, while the other holders keep theirs.

use crate::common;

use std::time::Duration;

use common::{holder, kill_connection, own_server};
use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LostReason};
use dlock_mysql::MySqlLock;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_killed_holder_gives_its_permit_to_a_waiter_and_the_others_keep_theirs() {
    let server = own_server();
    let url = server.url();
    let a = MySqlLock::connect_url(&url).await.unwrap();
    let b = MySqlLock::connect_url(&url).await.unwrap();
    let name = LockName::new(format!("sem-{:08x}", rand::random::<u32>())).unwrap();
    let opts = LockOptions::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            a.try_acquire_permit(&name, 2, &opts)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // A short lower-case name is its own key: the slots are `<name> 2/0` and `<name> 2/1`,
    // each on a connection of its own (a connection holds one permit of a semaphore).
    let key = a.key(&name);
    let mut ids = Vec::new();
    for slot in 0..2 {
        ids.push(
            holder(&url, &format!("{key} 2/{slot}"))
                .await
                .expect("every slot held"),
        );
    }
    assert_ne!(ids[0], ids[1]);
    assert_eq!(holder(&url, &key).await, None, "the name's lock stays free");
    assert!(
        b.try_acquire_permit(&name, 2, &opts)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(b.count_permits(&name).await.unwrap(), 2);

    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.acquire_permit(&name, 2, &opts.with_wait_timeout(BOUND))
                .await
        })
    };
    kill_connection(&url, ids[0]).await.unwrap();
    let lost = timeout(BOUND, async {
        tokio::select! {
            reason = held[0].lost() => (0, reason),
            reason = held[1].lost() => (1, reason),
        }
    })
    .await
    .expect("the killed holder's guard is lost within the bound");
    assert_eq!(lost.1, LostReason::SessionClosed);
    let permit = timeout(BOUND, waiter)
        .await
        .expect("the waiter gets the freed permit within the bound")
        .unwrap()
        .unwrap();
    assert_eq!(b.count_permits(&name).await.unwrap(), 2);

    let kept = held.remove(1usize.saturating_sub(lost.0));
    let gone = held.remove(0);
    assert!(kept.is_held(), "the other holder keeps its permit");
    assert!(matches!(gone.release().await, Err(LockError::Lost { .. })));
    kept.release().await.unwrap();
    permit.release().await.unwrap();
    assert_eq!(b.count_permits(&name).await.unwrap(), 0);
}

/// On each token source (the sequence, the counter table, none), a permit's token is drawn
/// after its slot's grant, tried or waited for: tokens rise (0 without fencing), and a fresh
/// server's missing counter table is created by the first permit.
#[tokio::test]
async fn permits_draw_rising_tokens_from_every_fence() {
    let server = own_server();
    for option in ["fencing=true", "fencing=table", "fencing=false"] {
        let url = format!("{}?{option}", server.url());
        let (a, b) = (
            MySqlLock::connect_url(&url).await.unwrap(),
            MySqlLock::connect_url(&url).await.unwrap(),
        );
        let name = LockName::new(format!("sem-{:08x}", rand::random::<u32>())).unwrap();
        let opts = LockOptions::new();
        let first = a
            .try_acquire_permit(&name, 2, &opts)
            .await
            .unwrap()
            .unwrap();
        let second = a
            .try_acquire_permit(&name, 2, &opts)
            .await
            .unwrap()
            .unwrap();
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                b.acquire_permit(&name, 2, &opts.with_wait_timeout(BOUND))
                    .await
            })
        };
        let (t1, t2) = (first.fencing_token(), second.fencing_token());
        first.release().await.unwrap();
        let third = timeout(BOUND, waiter).await.unwrap().unwrap().unwrap();
        let t3 = third.fencing_token();
        if option == "fencing=false" {
            assert_eq!((t1.get(), t2.get(), t3.get()), (0, 0, 0), "{option}");
        } else {
            assert!(t1 < t2 && t2 < t3, "{option}: {t1:?} {t2:?} {t3:?}");
        }
        second.release().await.unwrap();
        third.release().await.unwrap();
    }
}
