//! Semaphores on ZooKeeper: what the server keeps of them and what ends them. Permits are the
//! ephemeral sequential nodes of the name's queue, so an expired session gives back every permit
//! it held and wakes a waiter on another client (the orphan lease nodes Curator met after a
//! reconnect, CURATOR-315, or an interrupt, CURATOR-462, must not appear); a release anywhere
//! among the holders wakes the waiter it lets in; a number of permits other than the name's
//! leaves nothing on the server; and the nodes are named and fenced as the crate's docs say.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LostReason};
use dlock_conformance::wait_for;
use dlock_zookeeper::ZkLock;

const BOUND: Duration = Duration::from_secs(45);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-semaphore/{}/{test}", std::process::id())).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

/// Whether `got` is the refusal of `asked` permits of `name`, in use with `in_use`.
fn refused<T>(got: &dlock_api::Result<T>, name: &LockName, asked: u32, in_use: u32) -> bool {
    let expected = dlock_api::raw::permits_mismatch(name, asked, in_use).to_string();
    matches!(got, Err(error) if error.to_string() == expected)
}

/// `asked` permits of `name`, in use with `in_use` and held once, are refused to a try and to a
/// wait (a lock's own calls when `asked` is 1), and the queue on the server is as it was.
async fn refused_leaving_nothing(client: &ZkLock, name: &LockName, asked: u32, in_use: u32) {
    let hosts = client.config().hosts.join(",");
    let before = common::queue_at(&hosts, name).await;
    let (tried, waited) = if asked == 1 {
        let tried = client.try_acquire(name, &LockOptions::new()).await;
        (
            tried.map(|_| ()),
            client.acquire(name, &wait()).await.map(|_| ()),
        )
    } else {
        let tried = client
            .try_acquire_permit(name, asked, &LockOptions::new())
            .await;
        let waited = client.acquire_permit(name, asked, &wait()).await;
        (tried.map(|_| ()), waited.map(|_| ()))
    };
    assert!(refused(&tried, name, asked, in_use), "{tried:?}");
    assert!(refused(&waited, name, asked, in_use), "{waited:?}");
    let after = common::queue_at(&hosts, name).await;
    assert_eq!(after, before, "a refused acquire left a node");
    assert_eq!(client.count_permits(name).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_gives_its_permits_back_and_wakes_a_waiter() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (url, hosts) = (zk.url(), zk.connect_string());
    let (a, b, c) = (
        ZkLock::connect_url(&url).await.unwrap(),
        ZkLock::connect_url(&url).await.unwrap(),
        ZkLock::connect_url(&url).await.unwrap(),
    );
    let name = name("expired");
    let opts = LockOptions::new();
    let first = a
        .try_acquire_permit(&name, 3, &opts)
        .await
        .unwrap()
        .unwrap();
    let second = a
        .try_acquire_permit(&name, 3, &opts)
        .await
        .unwrap()
        .unwrap();
    let third = c
        .try_acquire_permit(&name, 3, &opts)
        .await
        .unwrap()
        .unwrap();
    let waiter = common::spawned_place(BOUND, &b, &name, 3);
    common::until_queue(BOUND, "b to queue", &hosts, &name, |q| q.len() >= 4).await;
    let a_session = a.session_id().unwrap();

    a.expire_session(None).await.unwrap();
    let permit = wait_for::within(BOUND, "the waiter after a's session expired", waiter)
        .await
        .unwrap()
        .unwrap();
    for lost in [&first, &second] {
        let reason = wait_for::within(BOUND, "a's permits to be lost", lost.lost()).await;
        assert_eq!(reason, LostReason::SessionExpired);
    }
    let left = common::queue_at(&hosts, &name).await;
    assert!(
        left.iter().all(|(_, owner)| *owner != a_session),
        "the expired session left nodes: {left:?}"
    );
    assert_eq!(left.len(), 2, "{left:?}");
    assert_eq!(b.count_permits(&name).await.unwrap(), 2);
    assert!(permit.fencing_token() > third.fencing_token());
    // a's releases add nothing; a takes a permit again on its new session.
    assert!(matches!(
        first.release().await,
        Err(LockError::Lost { .. } | LockError::NotHeld { .. })
    ));
    let again = a
        .try_acquire_permit(&name, 3, &opts)
        .await
        .unwrap()
        .unwrap();
    assert!(
        a.try_acquire_permit(&name, 3, &opts)
            .await
            .unwrap()
            .is_none()
    );
    for permit in [again, permit, third] {
        permit.release().await.unwrap();
    }
    drop(second);
    common::until_empty(BOUND, &hosts, &name).await;
}

/// A waiter watches every one of the `permits` nodes just before its own, so the release of any
/// holder lets it in at once. Watching only the node `permits` places ahead (Curator's
/// `InterProcessSemaphore`) would leave it waiting for that one holder. The waiters' sessions
/// are long, so their fallback look (one session timeout) cannot be what wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_holder_released_lets_the_next_waiter_in() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (url, hosts) = (zk.url(), zk.connect_string());
    let holder = ZkLock::connect_url(&url).await.unwrap();
    let long = format!("{url}?session_timeout=60s");
    let (b, c) = (
        ZkLock::connect_url(&long).await.unwrap(),
        ZkLock::connect_url(&long).await.unwrap(),
    );
    let name = name("any-holder");
    let opts = LockOptions::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            holder
                .try_acquire_permit(&name, 3, &opts)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let b_waits = common::spawned_place(BOUND, &b, &name, 3);
    common::until_queue(BOUND, "b to queue", &hosts, &name, |q| q.len() >= 4).await;
    let c_waits = common::spawned_place(BOUND, &c, &name, 3);
    common::until_queue(BOUND, "c to queue", &hosts, &name, |q| q.len() >= 5).await;

    let soon = Duration::from_secs(30);
    // The middle holder goes: b (watching all three) comes in, c still waits.
    held.remove(1).release().await.unwrap();
    let b_permit = wait_for::within(soon, "b after the middle holder's release", b_waits)
        .await
        .unwrap()
        .unwrap();
    assert!(!c_waits.is_finished(), "c came in beyond the limit");
    // The last holder goes: c, which watched it, comes in.
    held.pop().unwrap().release().await.unwrap();
    let c_permit = wait_for::within(soon, "c after the last holder's release", c_waits)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b.count_permits(&name).await.unwrap(), 3);
    for permit in held.into_iter().chain([b_permit, c_permit]) {
        permit.release().await.unwrap();
    }
    common::until_empty(BOUND, &hosts, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_number_of_permits_leaves_nothing_on_the_server() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (url, hosts) = (zk.url(), zk.connect_string());
    let (a, b) = (
        ZkLock::connect_url(&url).await.unwrap(),
        ZkLock::connect_url(&url).await.unwrap(),
    );
    let opts = LockOptions::new();

    // A name held as a semaphore of 3.
    let sem = name("as-semaphore");
    let permit = a.try_acquire_permit(&sem, 3, &opts).await.unwrap().unwrap();
    for asked in [2, 4, 1] {
        refused_leaving_nothing(&b, &sem, asked, 3).await;
    }
    permit.release().await.unwrap();

    // A name held as a lock.
    let lock = name("as-lock");
    let guard = a.try_acquire(&lock, &opts).await.unwrap().unwrap();
    for asked in [3, 2] {
        refused_leaving_nothing(&b, &lock, asked, 1).await;
    }
    guard.release().await.unwrap();
    common::until_empty(BOUND, &hosts, &lock).await;
    common::until_empty(BOUND, &hosts, &sem).await;

    // Free again, the name takes any number.
    let permit = b
        .try_acquire_permit(&lock, 3, &opts)
        .await
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
}

/// Checks that the node `child` under `name`, owned by `owner`, is `guard`'s: named
/// `_c_<uuid><part><sequence>`, of `client`'s session, its `czxid` the guard's token.
async fn is_the_node_of(
    client: &ZkLock,
    guard: &dlock_api::LockGuard,
    (name, part): (&LockName, &str),
    (child, owner): &(String, i64),
) {
    assert_eq!(Some(*owner), client.session_id());
    let (head, seq) = child.rsplit_once(part).unwrap();
    assert!(head.starts_with("_c_") && head.len() == 39, "{child}");
    let digits = seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit());
    assert!(digits, "{child}");
    let hosts = client.config().hosts.join(",");
    let raw = common::raw_client(&hosts).await.unwrap();
    let path = format!("{}/{child}", client.config().name_path(name));
    let stat = raw.check_stat(&path).await.unwrap().unwrap();
    assert_eq!(
        guard.fencing_token().get(),
        u64::try_from(stat.czxid).unwrap()
    );
}

/// `PREFIX/NAME/_c_<uuid>-permits<N>-lock-<sequence>` for a permit, `…-lock-<sequence>` for a
/// lock; each guard's token is its node's `czxid`, rising with every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_named_and_fenced_as_documented() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (url, hosts) = (zk.url(), zk.connect_string());
    let a = ZkLock::connect_url(&url).await.unwrap();
    let opts = LockOptions::new();

    let sem = name("layout-semaphore");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(a.try_acquire_permit(&sem, 2, &opts).await.unwrap().unwrap());
    }
    let nodes = common::queue_at(&hosts, &sem).await;
    assert_eq!(nodes.len(), 2);
    for (node, permit) in nodes.iter().zip(&held) {
        is_the_node_of(&a, permit, (&sem, "-permits2-lock-"), node).await;
    }
    assert!(held[1].fencing_token() > held[0].fencing_token());

    let lock = name("layout-lock");
    let guard = a.try_acquire(&lock, &opts).await.unwrap().unwrap();
    let nodes = common::queue_at(&hosts, &lock).await;
    let [node] = nodes.as_slice() else {
        panic!("{nodes:?}");
    };
    is_the_node_of(&a, &guard, (&lock, "-lock-"), node).await;
    guard.release().await.unwrap();
    for permit in held {
        permit.release().await.unwrap();
    }
}
