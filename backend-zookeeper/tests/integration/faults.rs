//! ZooKeeper-specific faults: the server down for less and for more than the session timeout, an
//! ensemble member killed while a lock is held, a partition past the
//! session, a create whose reply is lost, a queued waiter killed, a pending acquire cancelled
//! mid-create (both for a lock and for a permit), a held node deleted by someone else, a connect whose first pass over the hosts
//! is refused. Each test that harms a server starts its own, and they run one at a time (the
//! servers are JVMs on a small machine). Tests wait on events with generous bounds and never
//! assert speed. A forced session expiry, with a waiter queued, is the conformance suite's
//! killed-holder case (the harness kills a holder by expiring its session).

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LockStatus, LostReason};
use dlock_conformance::wait_for;
use dlock_test_servers::{FaultProxy, ProxyMode, ZooKeeper, ZooKeeperEnsemble};
use dlock_zookeeper::{ZkConfig, ZkLock};

const BOUND: Duration = Duration::from_secs(45);

/// One harmful test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-faults/{}/{test}", std::process::id())).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

/// [`wait_for::within`] at this file's bound.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    wait_for::within(BOUND, what, future).await
}

/// [`wait_for::until`] at this file's bound.
async fn until(what: &str, check: impl FnMut() -> bool) {
    wait_for::until(BOUND, what, check).await
}

async fn start(
    start: impl FnOnce() -> dlock_test_servers::Result<ZooKeeper> + Send + 'static,
) -> ZooKeeper {
    tokio::task::spawn_blocking(start).await.unwrap().unwrap()
}

/// A server of the test's own, and a fault proxy in front of it.
async fn behind_a_proxy() -> (ZooKeeper, FaultProxy) {
    let zk = start(ZooKeeper::start).await;
    let proxy = FaultProxy::start(zk.addr()).unwrap();
    (zk, proxy)
}

async fn restart(server: &ZooKeeper) {
    tokio::task::block_in_place(|| server.restart()).unwrap();
}

/// The queue under `name` on the server: `(child, ephemeral owner)`.
async fn queue(hosts: &str, name: &LockName) -> Vec<(String, i64)> {
    common::queue_at(hosts, name).await
}

/// Waits until the queue under `name` is as `done` wants it, and returns it.
async fn until_queue(
    what: &str,
    hosts: &str,
    name: &LockName,
    done: impl Fn(&[(String, i64)]) -> bool + Send + Sync,
) -> Vec<(String, i64)> {
    common::until_queue(BOUND, what, hosts, name, done).await
}

/// `client` acquires `name` (waiting within this file's bound) and releases it.
async fn takes_and_releases(what: &str, client: &ZkLock, name: &LockName) {
    within(what, client.acquire(name, &wait()))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

async fn is_free(client: &ZkLock, name: &LockName) -> bool {
    match client.try_acquire(name, &LockOptions::new()).await.unwrap() {
        Some(guard) => {
            guard.release().await.unwrap();
            true
        }
        None => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_shorter_than_the_session_suspends_then_resumes_with_the_lock_kept() {
    let _one = SERIAL.lock().await;
    let zk = start(ZooKeeper::start).await;
    let holder = ZkLock::connect_url(&format!("{}?session_timeout=15s", zk.url()))
        .await
        .unwrap();
    let name = name("down-short");
    let guard = holder.acquire(&name, &LockOptions::new()).await.unwrap();
    zk.kill();
    until("the guard to report suspension", || {
        matches!(guard.status(), LockStatus::Suspended { .. })
    })
    .await;
    restart(&zk).await;
    until("the guard to be held again", || guard.is_held()).await;
    assert_eq!(guard.lost_reason(), None);
    let other = ZkLock::connect_url(&zk.url()).await.unwrap();
    assert!(!is_free(&other, &name).await, "the resumed lock was free");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = within("the lock after release", other.acquire(&name, &wait()))
        .await
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_longer_than_the_session_loses_the_lock_and_the_next_token_is_higher() {
    let _one = SERIAL.lock().await;
    let zk = start(ZooKeeper::start).await;
    let holder = ZkLock::connect_url(&format!("{}?session_timeout=3s", zk.url()))
        .await
        .unwrap();
    let name = name("down-long");
    let guard = holder.acquire(&name, &LockOptions::new()).await.unwrap();
    zk.kill();
    let reason = within("the guard to be lost", guard.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    restart(&zk).await;
    let other = ZkLock::connect_url(&zk.url()).await.unwrap();
    let next = within("another client's acquire", other.acquire(&name, &wait()))
        .await
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    // The client whose session expired takes locks again, on a new session.
    next.release().await.unwrap();
    takes_and_releases("the old client on a new session", &holder, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_member_killed_while_held_loses_nothing() {
    let _one = SERIAL.lock().await;
    let ensemble = tokio::task::spawn_blocking(ZooKeeperEnsemble::start)
        .await
        .unwrap()
        .unwrap();
    let url = format!("zk://{}?session_timeout=15s", ensemble.connect_string());
    let (a, b) = (
        ZkLock::connect_url(&url).await.unwrap(),
        ZkLock::connect_url(&url).await.unwrap(),
    );
    let name = name("member-killed");
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let leader = ensemble.leader().expect("a leader");
    ensemble.node(leader).kill();
    // The survivors elect a leader and answer again; meanwhile the lock is never free.
    let mut answered = false;
    for _ in 0..200 {
        match b.try_acquire(&name, &LockOptions::new()).await {
            Ok(Some(_)) => panic!("a second holder after a member was killed"),
            Ok(None) => {
                answered = true;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(answered, "the survivors never answered");
    until("the guard to be held", || guard.is_held()).await;
    assert_eq!(guard.lost_reason(), None, "the guard was lost");
    assert!(!is_free(&b, &name).await);
    guard.release().await.unwrap();
    within("the lock after release", b.acquire(&name, &wait()))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_past_the_session_suspends_then_loses_and_the_stale_release_spares_the_new_holder()
 {
    let _one = SERIAL.lock().await;
    let (zk, proxy) = behind_a_proxy().await;
    let cut_off = ZkLock::connect_url(&format!(
        "zk://{}?session_timeout=3s&command_timeout=500ms",
        proxy.addr()
    ))
    .await
    .unwrap();
    let direct = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("partition");
    let stale = cut_off.acquire(&name, &LockOptions::new()).await.unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    wait_for::partitioned_holder_spares_the_next(BOUND, stale, || proxy.heal(), &direct, &name)
        .await;
    // The cut-off client takes locks again once its link is back, on a new session.
    takes_and_releases("the cut-off client after the heal", &cut_off, &name).await;
}

/// The client library gives up after one pass over the hosts; a server that refuses connections
/// for a moment (restarting, or a handshake too slow on a loaded machine) must not fail a connect
/// that still has time left: it passes over the hosts again until the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_refused_at_first_passes_again_until_the_server_answers() {
    let _one = SERIAL.lock().await;
    let (_server, proxy) = behind_a_proxy().await;
    proxy.set_mode(ProxyMode::Refuse);
    let url = format!("zk://{}?connect_timeout=40s", proxy.addr());
    let connecting = tokio::spawn(async move { ZkLock::connect_url(&url).await });
    // One host, so each pass makes one connection: the third refusal is the third pass.
    until("three passes over the hosts to be refused", || {
        proxy.refused() >= 3
    })
    .await;
    assert!(
        !connecting.is_finished(),
        "the connect gave up while it had time left"
    );
    proxy.heal();
    let client = within("the connect once the server answers", connecting)
        .await
        .unwrap()
        .unwrap();
    let name = name("connect-refused");
    takes_and_releases("an acquire on the new session", &client, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_reply_is_lost_is_found_again_and_leaves_no_orphan() {
    a_create_whose_reply_is_lost(1).await;
}

/// A permit's node after a reconnect (Curator's CURATOR-315 left it, holding a permit for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_create_whose_reply_is_lost_is_found_again_and_leaves_no_orphan() {
    a_create_whose_reply_is_lost(2).await;
}

async fn a_create_whose_reply_is_lost(permits: u32) {
    let _one = SERIAL.lock().await;
    let (zk, proxy) = behind_a_proxy().await;
    let hosts = zk.connect_string();
    let client = ZkLock::connect_url(&format!(
        "zk://{}?session_timeout=15s&command_timeout=5s",
        proxy.addr()
    ))
    .await
    .unwrap();
    let name = name("lost-reply");
    // Another client holds every place, so the one request that matters below is our create.
    let direct = ZkLock::connect_url(&zk.url()).await.unwrap();
    let held = common::take_all(&direct, &name, permits).await;
    let places = held.len();
    proxy.set_mode(ProxyMode::DropReplies);
    let acquire = common::spawned_place(BOUND, &client, &name, permits);
    let session = client.session_id().unwrap();
    let created = until_queue("the create to reach the server", &hosts, &name, |q| {
        q.len() > places
    })
    .await;
    assert_eq!(created[places].1, session);
    // The reply is gone for good: the connection breaks and the client reconnects.
    proxy.reset();
    proxy.heal();
    // The client finds its node again and keeps its place: nothing else appears.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(queue(&hosts, &name).await, created, "the queue changed");
    for guard in held {
        guard.release().await.unwrap();
    }
    let guard = within("the acquire after the lost reply", acquire)
        .await
        .unwrap()
        .unwrap();
    let nodes = queue(&hosts, &name).await;
    assert_eq!(
        nodes,
        created[places..],
        "an orphan was left, or another node is held"
    );
    guard.release().await.unwrap();
    until_empty(&hosts, &name).await;
}

async fn until_empty(hosts: &str, name: &LockName) {
    common::until_empty(BOUND, hosts, name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_acquire_cancelled_mid_create_leaves_no_orphan() {
    cancelled_mid_create(1).await;
}

/// A permit's wait cancelled mid-create (Curator's CURATOR-462 left its node after an
/// interrupt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_permit_cancelled_mid_create_leaves_no_orphan() {
    cancelled_mid_create(2).await;
}

async fn cancelled_mid_create(permits: u32) {
    let _one = SERIAL.lock().await;
    let (zk, proxy) = behind_a_proxy().await;
    let hosts = zk.connect_string();
    let client = ZkLock::connect_url(&format!("zk://{}?session_timeout=15s", proxy.addr()))
        .await
        .unwrap();
    let name = name("cancelled-create");
    let direct = ZkLock::connect_url(&zk.url()).await.unwrap();
    let held = common::take_all(&direct, &name, permits).await;
    let places = held.len();
    proxy.set_mode(ProxyMode::HoldReplies);
    let acquire = common::spawned_place(BOUND, &client, &name, permits);
    until_queue("the create to reach the server", &hosts, &name, |q| {
        q.len() > places
    })
    .await;
    // Cancelled while the create's reply is on its way.
    acquire.abort();
    assert!(acquire.await.unwrap_err().is_cancelled());
    proxy.heal();
    until_queue("the cancelled acquire's node to go", &hosts, &name, |q| {
        q.len() <= places
    })
    .await;
    for guard in held {
        guard.release().await.unwrap();
    }
    until_empty(&hosts, &name).await;
    // The session lives on, and the client takes every place at once.
    for guard in common::take_all(&client, &name, permits).await {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_killed_lets_its_successor_move_up() {
    let zk = dlock_test_servers::shared_zookeeper();
    let url = zk.url();
    let connect = || ZkLock::connect_url(&url);
    let (a, b, c) = (
        connect().await.unwrap(),
        connect().await.unwrap(),
        connect().await.unwrap(),
    );
    let name = name("waiter-killed");
    let hosts = zk.connect_string();
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let b_waits = wait_for::spawned_acquire(BOUND, &b, &name);
    until_queue("b to queue", &hosts, &name, |q| q.len() >= 2).await;
    let c_waits = wait_for::spawned_acquire(BOUND, &c, &name);
    until_queue("c to queue", &hosts, &name, |q| q.len() >= 3).await;
    let b_session = b.session_id().unwrap();
    // b's session ends on the server: its node goes, and c now waits for a.
    b.expire_session(None).await.unwrap();
    until_queue("b's node to go", &hosts, &name, |q| {
        q.iter().all(|(_, owner)| *owner != b_session)
    })
    .await;
    // b queues again on a new session, behind c.
    until_queue("b to queue again", &hosts, &name, |q| q.len() >= 3).await;
    guard.release().await.unwrap();
    let c_guard = within("c after a's release", c_waits)
        .await
        .unwrap()
        .unwrap();
    assert!(!b_waits.is_finished(), "b overtook c");
    c_guard.release().await.unwrap();
    within("b after c", b_waits)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_node_deleted_by_someone_else_loses_the_guard_at_once() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (a, b) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("node-deleted");
    let hosts = zk.connect_string();
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let waiter = wait_for::spawned_acquire(BOUND, &b, &name);
    let nodes = until_queue("the waiter to queue", &hosts, &name, |q| q.len() >= 2).await;
    let session = a.session_id().unwrap();
    assert_eq!(nodes[0].1, session);
    // An operator deletes the holder's node with a client of their own; the holder's session
    // stays healthy throughout, so only a watch on the node can tell.
    let admin = common::raw_client(&hosts).await.unwrap();
    let config = ZkConfig::from_url(&zk.url()).unwrap();
    let path = format!("{}/{}", config.name_path(&name), nodes[0].0);
    admin.delete(&path, None).await.unwrap();
    let reason = within("the holder's lost signal", guard.lost()).await;
    assert_eq!(reason, LostReason::TakenOver);
    // Lost on the node's account, the session untouched (a late heartbeat on a busy machine may
    // suspend it for a moment, which is not what this is about).
    assert_eq!(a.session_id(), Some(session));
    let next = within("the waiter", waiter).await.unwrap().unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(matches!(
        guard.release().await,
        Err(LockError::Lost {
            reason: LostReason::TakenOver,
            ..
        })
    ));
    assert!(!is_free(&a, &name).await, "the new holder's lock was free");
    next.release().await.unwrap();
    // The holder's session lives on: it takes the name again at once.
    assert!(is_free(&a, &name).await);
    until_empty(&hosts, &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_a_held_node_keeps_the_guard_and_the_watch_is_set_again() {
    let zk = dlock_test_servers::shared_zookeeper();
    let a = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("node-touched");
    let hosts = zk.connect_string();
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let nodes = queue(&hosts, &name).await;
    let config = ZkConfig::from_url(&zk.url()).unwrap();
    let path = format!("{}/{}", config.name_path(&name), nodes[0].0);
    let session = a.session_id().unwrap();
    until("the holder to watch its node", || {
        common::watched_by(zk, &path, session)
    })
    .await;
    // The server fires and drops the watch before it answers the write, so the watch seen
    // after the answer is one the holder set again.
    let admin = common::raw_client(&hosts).await.unwrap();
    admin.set_data(&path, b"touched", None).await.unwrap();
    until("the holder to watch its node again", || {
        common::watched_by(zk, &path, session)
    })
    .await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "a change to the node lost the guard"
    );
    admin.delete(&path, None).await.unwrap();
    let reason = within("the lost signal through the re-set watch", guard.lost()).await;
    assert_eq!(reason, LostReason::TakenOver);
    until_empty(&hosts, &name).await;
}

/// An acquire against a stopped server (Redisson's server-failed test): the outage reads as
/// `Unavailable`, within the wait and a command's timeout, never as a `Timeout`, which says that
/// somebody held the lock (it took 8 s and said `Timeout` for a 5 s wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_against_a_stopped_server_is_unavailable_within_its_wait() {
    let _one = SERIAL.lock().await;
    let zk = start(ZooKeeper::start).await;
    let locks = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("server-stopped");
    tokio::task::block_in_place(|| zk.stop());
    let wait = Duration::from_secs(5);
    let started = tokio::time::Instant::now();
    let result = within(
        "the acquire's answer",
        locks.acquire(&name, &LockOptions::new().with_wait_timeout(wait)),
    )
    .await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Unavailable { .. })),
        "an outage answered {result:?}"
    );
    let bound = wait + locks.config().command_timeout;
    assert!(took <= bound, "answered after {took:?}, past {bound:?}");
    // Back up: the same client acquires again.
    restart(&zk).await;
    takes_and_releases("the lock once the server is back", &locks, &name).await;
}
