//! ZooKeeper elections beyond the shared cases: a proclaim after the session ended or the node
//! went is refused and leaves the successor's record alone; an observer sees an expired leader
//! go by itself, says `Missed` after its own session ends, and leaves no watch behind once
//! dropped; a leader cut off and back within its session stays the only one; a lock's holder
//! is no leader. Tests wait on events with generous bounds and never assert speed.

use crate::common;

use std::time::Duration;

use dlock_api::{
    DistributedLock, LeaderEvent, LeaderStream, LockError, LockName, LockOptions, LockStatus,
};
use dlock_conformance::wait_for;
use dlock_test_servers::{FaultProxy, ProxyMode};
use dlock_zookeeper::{ZkConfig, ZkLock};
use futures::StreamExt;

const BOUND: Duration = Duration::from_secs(45);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-election/{}/{test}", std::process::id())).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    wait_for::within(BOUND, what, future).await
}

/// The next state the observer reports that `wanted` accepts; the events skipped on the way.
async fn next_state(
    what: &str,
    stream: &mut LeaderStream,
    wanted: impl FnMut(&LeaderEvent) -> bool,
) -> (LeaderEvent, Vec<Result<LeaderEvent, String>>) {
    wait_for::next_leader_event(BOUND, what, stream, wanted).await
}

fn leads(event: &LeaderEvent, value: &[u8]) -> bool {
    matches!(event, LeaderEvent::Leads(leader) if leader.value() == value)
}

/// A leader whose session ended proclaims: refused (by the client once it heard of the end, by
/// the server's `NoNode` or the closing connection before), and the successor's record is
/// untouched. A leader whose node
/// was deleted under it, before its watch on the node noticed, is refused by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_term_ended_is_refused_and_spares_the_successor() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (a, b) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("stale-proclaim");
    let first = a.campaign(&name, b"a", &wait()).await.unwrap();
    a.expire_session(None).await.unwrap();
    // Before the client has heard: the server refuses (`NotHeld`), or the request finds the
    // connection being closed (`Unavailable`); never accepted.
    let refused = first.proclaim(b"stale").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. } | LockError::Unavailable { .. })
        ),
        "a proclaim after the session expired returned {refused:?}"
    );
    let second = within("the next leader", b.campaign(&name, b"b", &wait()))
        .await
        .unwrap();
    assert!(second.term() > first.term());
    within("the expired leader's loss", first.lost()).await;
    let refused = first.proclaim(b"stale").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "a deposed leader's proclaim returned {refused:?}"
    );
    let said = b.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (second.term(), &b"b"[..]));

    // The node deleted by someone else at once after the grant (the guard's watch on its node
    // starts 250 ms later): the server refuses the write.
    second.resign().await.unwrap();
    let leadership = b.campaign(&name, b"c", &wait()).await.unwrap();
    let hosts = zk.connect_string();
    let queue = common::queue_at(&hosts, &name).await;
    let path = format!(
        "{}/{}",
        ZkConfig::from_url(&zk.url()).unwrap().name_path(&name),
        queue[0].0
    );
    let admin = common::raw_client(&hosts).await.unwrap();
    admin.delete(&path, None).await.unwrap();
    let refused = leadership.proclaim(b"gone").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "a proclaim on a deleted node returned {refused:?}"
    );
    assert!(!leadership.is_held(), "refused, yet it still leads");
    assert_eq!(b.leader(&name).await.unwrap(), None);
    common::until_empty(BOUND, &hosts, &name).await;
}

/// The leader's session expires with a candidate waiting: an observer on a third client sees
/// the term end and the next leader by itself, and nothing in between but vacancy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_an_expired_leader_go_by_itself() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (a, b, c) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("expired-leader");
    let first = a.campaign(&name, b"a", &wait()).await.unwrap();
    let mut changes = c.observe(&name).await.unwrap();
    next_state("the first leader", &mut changes, |e| leads(e, b"a")).await;
    let next = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.campaign(&name, b"b", &wait()).await })
    };
    common::until_queue(
        BOUND,
        "the candidate to queue",
        &zk.connect_string(),
        &name,
        |q| q.len() == 2,
    )
    .await;
    a.expire_session(None).await.unwrap();
    let (_, between) = next_state("the next leader", &mut changes, |e| leads(e, b"b")).await;
    assert!(
        between
            .iter()
            .all(|e| matches!(e, Ok(LeaderEvent::Vacant | LeaderEvent::Missed))),
        "the observer saw {between:?} between the terms"
    );
    let second = within("the candidate", next).await.unwrap().unwrap();
    assert!(second.term() > first.term());
    within("the expired leader's loss", first.lost()).await;
    second.resign().await.unwrap();
    next_state("nobody after the resignation", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
}

/// The observer's own session expires: it opens a new one by itself, says `Missed`, and
/// reports the leader that came meanwhile, unseen by its old watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_session_expired_says_missed_then_the_leader() {
    let zk = dlock_test_servers::shared_zookeeper();
    let (a, observer) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("observer-expired");
    let mut changes = observer.observe(&name).await.unwrap();
    next_state("the first state", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
    let old = observer.session_id().unwrap();
    observer.expire_session(None).await.unwrap();
    let leadership = a.campaign(&name, b"a", &wait()).await.unwrap();
    let (_, before) =
        next_state("the leader after the gap", &mut changes, |e| leads(e, b"a")).await;
    assert!(
        before.iter().any(|e| matches!(e, Ok(LeaderEvent::Missed))),
        "no Missed before the state read on a new session: {before:?}"
    );
    assert_ne!(observer.session_id(), Some(old), "still on the old session");
    leadership.proclaim(b"again").await.unwrap();
    next_state("the proclaim on the new watch", &mut changes, |e| {
        leads(e, b"again")
    })
    .await;
    leadership.resign().await.unwrap();
}

/// An observer dropped leaves no watch on the server (its persistent watch is removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_observer_leaves_no_watch() {
    let zk = dlock_test_servers::shared_zookeeper();
    let observer = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("dropped-observer");
    let path = ZkConfig::from_url(&zk.url()).unwrap().name_path(&name);
    let session = observer.session_id().unwrap();
    let mut changes = observer.observe(&name).await.unwrap();
    next_state("the first state", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
    assert!(common::watched_by(zk, &path, session), "no watch on {path}");
    drop(changes);
    wait_for::until(BOUND, "the watch to be removed", || {
        !common::watched_by(zk, &path, session)
    })
    .await;
}

/// A lock's holder (no campaign, no record) is nobody's leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_holder_is_not_a_leader() {
    let zk = dlock_test_servers::shared_zookeeper();
    let client = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("lock-holder");
    let guard = client.acquire(&name, &LockOptions::new()).await.unwrap();
    assert_eq!(client.leader(&name).await.unwrap(), None);
    guard.release().await.unwrap();
}

/// A leader whose link is cut within its session is suspended, no rival leads meanwhile and
/// observers see no change; once back (its node checked: this session's, its term's) it
/// leads on, proclaims, and is still the one `leader` names (CURATOR-696).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_and_resumed_leader_stays_the_only_leader() {
    let zk = dlock_test_servers::shared_zookeeper();
    let proxy = FaultProxy::start(zk.addr()).unwrap();
    let leader = ZkLock::connect_url(&format!(
        "zk://{}?session_timeout=15s&command_timeout=1s",
        proxy.addr()
    ))
    .await
    .unwrap();
    let (rival, watcher) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("suspended-leader");
    let leadership = leader.campaign(&name, b"cut", &wait()).await.unwrap();
    let term = leadership.term();
    let mut changes = watcher.observe(&name).await.unwrap();
    next_state("the leader", &mut changes, |e| leads(e, b"cut")).await;
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    wait_for::until(BOUND, "the leader to be suspended", || {
        matches!(leadership.status(), LockStatus::Suspended { .. })
    })
    .await;
    let short = LockOptions::new().with_wait_timeout(Duration::from_millis(500));
    let refused = rival.campaign(&name, b"rival", &short).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "a rival campaign while the leader was cut off returned {refused:?}"
    );
    let said = rival.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(said.term(), term);
    proxy.heal();
    wait_for::until(BOUND, "the leader to be back", || {
        matches!(leadership.status(), LockStatus::Held { .. })
    })
    .await;
    leadership.proclaim(b"back").await.unwrap();
    let (_, between) = next_state("the proclaim after the reconnect", &mut changes, |e| {
        leads(e, b"back")
    })
    .await;
    assert!(
        between.is_empty(),
        "the observer saw {between:?} while the leader was cut off"
    );
    let said = rival.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (term, &b"back"[..]));
    leadership.resign().await.unwrap();
    next_state("nobody after the resignation", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
}

/// An observer made on a runtime that then shuts down (its client's connection and its watch
/// were tasks of it) goes on on the runtime that polls it: the session is attached again, the
/// watch set again, and after a `Missed` it reports the leader that came meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_outlives_the_runtime_it_was_made_on() {
    let zk = dlock_test_servers::shared_zookeeper();
    let url = format!("{}?session_timeout=30s", zk.url());
    let name = name("observer-runtime");
    let (observer, mut changes) = dlock_conformance::on_a_runtime_of_its_own({
        let name = name.clone();
        move || async move {
            let observer = ZkLock::connect_url(&url).await.unwrap();
            let mut changes = observer.observe(&name).await.unwrap();
            next_state("the first state", &mut changes, |e| {
                *e == LeaderEvent::Vacant
            })
            .await;
            (observer, changes)
        }
    })
    .await;
    let a = ZkLock::connect_url(&zk.url()).await.unwrap();
    let leadership = a.campaign(&name, b"a", &wait()).await.unwrap();
    next_state("the leader, seen on this runtime", &mut changes, |e| {
        leads(e, b"a")
    })
    .await;
    leadership.proclaim(b"again").await.unwrap();
    next_state("the proclaim", &mut changes, |e| leads(e, b"again")).await;
    leadership.resign().await.unwrap();
    next_state("nobody", &mut changes, |e| *e == LeaderEvent::Vacant).await;
    drop(changes);
    drop(observer);
}

/// An observer cut off past its session: its session ends, it reports the failure to open a
/// new one once (not once per attempt), and once the link is back it says `Missed` and the
/// leader that came meanwhile. A cut shorter than the session: no error, and the state read
/// again after the reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_reports_once_then_missed_then_the_leader() {
    let zk = dlock_test_servers::shared_zookeeper();
    let proxy = FaultProxy::start(zk.addr()).unwrap();
    let observer = ZkLock::connect_url(&format!(
        "zk://{}?session_timeout=4s&command_timeout=1s&connect_timeout=1s",
        proxy.addr()
    ))
    .await
    .unwrap();
    let a = ZkLock::connect_url(&zk.url()).await.unwrap();
    let name = name("observer-cut-off");
    let mut changes = observer.observe(&name).await.unwrap();
    next_state("the first state", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;

    // Shorter than the session: the watch comes back with it.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    wait_for::until(BOUND, "the observer's session to be suspended", || {
        matches!(
            observer.session_status(),
            Some(dlock_api::raw::SessionStatus::Suspended { .. })
        )
    })
    .await;
    let first = a.campaign(&name, b"a", &wait()).await.unwrap();
    proxy.heal();
    let (_, before) = next_state("the leader after a short cut", &mut changes, |e| {
        leads(e, b"a")
    })
    .await;
    assert!(
        before.iter().all(|e| matches!(e, Ok(LeaderEvent::Missed))),
        "the observer saw {before:?} across a short cut"
    );
    first.resign().await.unwrap();
    next_state("nobody", &mut changes, |e| *e == LeaderEvent::Vacant).await;

    // Past the session: it ends, and no new one opens until the link is back.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    wait_for::until(BOUND, "the observer's session to end", || {
        observer.session_id().is_none()
    })
    .await;
    let second = a.campaign(&name, b"b", &wait()).await.unwrap();
    // Errors meanwhile: at most one per failure, however long it lasts.
    let mut during = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        while let Some(item) = changes.next().await {
            during.push(item.map_err(|e| e.to_string()));
        }
    })
    .await;
    let errors = during.iter().filter(|item| item.is_err()).count();
    assert!(errors <= 1, "{errors} errors for one failure: {during:?}");
    proxy.heal();
    let (_, before) = next_state("the leader after a long cut", &mut changes, |e| {
        leads(e, b"b")
    })
    .await;
    assert!(
        before.iter().any(|e| matches!(e, Ok(LeaderEvent::Missed))),
        "no Missed after a new session: {before:?}"
    );
    second.resign().await.unwrap();
}

/// The head node of `name`'s queue: its data and its version (how many writes followed its
/// create).
async fn head_node(
    admin: &zookeeper_client::Client,
    zk_url: &str,
    hosts: &str,
    name: &LockName,
) -> (Vec<u8>, i32) {
    let queue = common::queue_at(hosts, name).await;
    let parent = ZkConfig::from_url(zk_url).unwrap().name_path(name);
    let (data, stat) = admin
        .get_data(&format!("{parent}/{}", queue[0].0))
        .await
        .unwrap();
    (data, stat.version)
}

/// A candidate's node is created with its campaign value as its data (`lead:VALUE`), so it
/// leads with that value, its `czxid` the term, from the moment it heads the queue: neither a
/// campaign on a free name nor the waiting candidate that takes over writes its node after the
/// create (version 0), yet `leader()` and an observer show each with its value at once. A later
/// proclaim writes the record, and the resignation ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_leads_with_the_value_its_node_was_created_with() {
    let zk = dlock_test_servers::shared_zookeeper();
    let hosts = zk.connect_string();
    let admin = common::raw_client(&hosts).await.unwrap();
    let (a, b) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let name = name("created-leading");
    let first = a.campaign(&name, b"first", &wait()).await.unwrap();
    let said = b.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (first.term(), &b"first"[..]));
    assert_eq!(
        head_node(&admin, &zk.url(), &hosts, &name).await,
        (b"lead:first".to_vec(), 0)
    );
    let mut observer = a.observe(&name).await.unwrap();
    next_state("the first leader", &mut observer, |e| leads(e, b"first")).await;

    let candidate = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.campaign(&name, b"second", &wait()).await })
    };
    common::until_queue(BOUND, "the candidate to queue", &hosts, &name, |q| {
        q.len() == 2
    })
    .await;
    first.resign().await.unwrap();
    let second = within("the hand-over", candidate).await.unwrap().unwrap();
    let (event, _) = next_state("the second leader", &mut observer, |e| {
        matches!(e, LeaderEvent::Leads(_))
    })
    .await;
    let LeaderEvent::Leads(shown) = event else {
        unreachable!()
    };
    assert_eq!(
        (shown.term(), shown.value()),
        (second.term(), &b"second"[..])
    );
    assert_eq!(
        head_node(&admin, &zk.url(), &hosts, &name).await,
        (b"lead:second".to_vec(), 0),
        "the new leader wrote its node after the create"
    );

    second.proclaim(b"second-later").await.unwrap();
    next_state("the later value", &mut observer, |e| {
        leads(e, b"second-later")
    })
    .await;
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (second.term(), &b"second-later"[..])
    );
    assert_eq!(head_node(&admin, &zk.url(), &hosts, &name).await.1, 1);
    second.resign().await.unwrap();
    assert_eq!(a.leader(&name).await.unwrap(), None);
    common::until_empty(BOUND, &hosts, &name).await;
}
