//! etcd-specific elections: a candidate's key that carries its value into the hand-over, and
//! faults: a candidate whose lease is revoked while it waits
//! (etcd-io/etcd #19597), a proclaim after the leader's lease was revoked, a deposed leader's
//! proclaim beside its successor's record, the record following its key to another lease, what
//! a resignation leaves, and an observer whose watch is cut off and whose history is compacted
//! meanwhile. Tests wait on events with generous bounds and never assert speed.

use crate::common;

use std::time::Duration;

use dlock_api::{
    DistributedLock, FencingToken, LeaderEvent, LeaderStream, LockError, LockName, LockOptions,
};
use dlock_conformance::wait_for;
use dlock_etcd::EtcdLock;
use dlock_test_servers::{Etcd, FaultProxy, ProxyMode};
use etcd_client::{Client, KeyValue};

const BOUND: Duration = Duration::from_secs(30);

fn name(test: &str) -> LockName {
    LockName::new(format!("dlock-election/{}/{test}", std::process::id())).unwrap()
}

fn wait() -> LockOptions {
    LockOptions::new().with_wait_timeout(BOUND)
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    wait_for::within(BOUND, what, future).await
}

/// The key of `name`'s leader record, as the backend lays it out: its range's `/` raised to `0`.
fn record_key(url: &str, name: &LockName) -> String {
    let mut range = common::name_range(url, name);
    range.pop();
    range.push('0');
    range
}

async fn record(raw: &mut Client, url: &str, name: &LockName) -> Option<KeyValue> {
    let found = raw.get(record_key(url, name), None).await.unwrap();
    found.kvs().first().cloned()
}

/// Waits until `name` has `count` keys or more, and returns them oldest first.
async fn until_keys(raw: &mut Client, url: &str, name: &LockName, count: usize) -> Vec<KeyValue> {
    within(&format!("{count} keys under the name"), async {
        loop {
            let keys = common::queue_keys(raw, url, name).await.unwrap();
            if keys.len() >= count {
                break keys;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The next event of `stream` that `wanted` accepts; returns it with what came before, each as
/// its `Debug` text (an error as `error: …`).
async fn next_matching(
    what: &str,
    stream: &mut LeaderStream,
    wanted: impl FnMut(&LeaderEvent) -> bool,
) -> (LeaderEvent, Vec<String>) {
    let (event, seen) = wait_for::next_leader_event(BOUND, what, stream, wanted).await;
    let seen = seen
        .into_iter()
        .map(|item| match item {
            Ok(event) => format!("{event:?}"),
            Err(error) => format!("error: {error}"),
        })
        .collect();
    (event, seen)
}

fn leads(event: &LeaderEvent, term: FencingToken, value: &[u8]) -> bool {
    matches!(event, LeaderEvent::Leads(l) if l.term() == term && l.value() == value)
}

/// A candidate's queue key carries its campaign value, so the deletion of the key ahead of it
/// makes it lead with that value in the same revision: `leader()` names it at its term, an
/// observer goes from the old leader to the new one without a `Vacant` between, and neither
/// leader's campaign wrote the record (whether the name was free or not). A later proclaim
/// writes the record as before, and what is shown follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_candidates_key_leads_with_its_value_at_the_hand_over() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("value-in-key");
    let mut raw = common::raw_client(&url).await.unwrap();
    let first = a.campaign(&name, b"first", &wait()).await.unwrap();
    assert!(
        record(&mut raw, &url, &name).await.is_none(),
        "a campaign on a free name wrote the record"
    );
    let said = b.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (first.term(), &b"first"[..]));
    let mut changes = b.observe(&name).await.unwrap();
    next_matching("the first leader", &mut changes, |e| {
        leads(e, first.term(), b"first")
    })
    .await;

    let candidate = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.campaign(&name, b"second", &wait()).await })
    };
    let waiting = until_keys(&mut raw, &url, &name, 2).await[1].clone();
    assert_eq!(waiting.value(), b"lead:second", "the waiting key's value");
    // While it waits it leads nothing: the first leader is still the one shown.
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (first.term(), &b"first"[..]));

    let first_term = first.term();
    first.resign().await.unwrap();
    let second = within("the candidate's campaign", candidate)
        .await
        .unwrap()
        .unwrap();
    let term = u64::try_from(waiting.create_revision()).unwrap();
    assert_eq!(second.term(), FencingToken::new(term));
    assert!(second.term() > first_term);
    assert!(
        record(&mut raw, &url, &name).await.is_none(),
        "the new leader's campaign wrote the record"
    );
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (second.term(), &b"second"[..]));
    let (_, seen) = next_matching("the new leader", &mut changes, |e| {
        leads(e, second.term(), b"second")
    })
    .await;
    assert!(
        !seen.iter().any(|e| e.contains("Vacant")),
        "the hand-over showed nobody leading between the two: {seen:?}"
    );

    second.proclaim(b"second-again").await.unwrap();
    let kept = record(&mut raw, &url, &name).await.expect("the record");
    assert_eq!(
        kept.value(),
        format!("{term}:second-again").as_bytes(),
        "a later proclaim writes the record"
    );
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (second.term(), &b"second-again"[..])
    );
    next_matching("the proclaimed value", &mut changes, |e| {
        leads(e, second.term(), b"second-again")
    })
    .await;

    second.resign().await.unwrap();
    assert!(record(&mut raw, &url, &name).await.is_none());
    assert!(
        common::queue_keys(&mut raw, &url, &name)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(a.leader(&name).await.unwrap(), None);
    next_matching("nobody leading", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
}

/// etcd-io/etcd #19597: a candidate's lease is revoked while it waits (its queue key goes with
/// it). It is never told it leads: its campaign fails with `Lost` while the leader still holds,
/// `leader()` and an observer name only the leader meanwhile, and once the leader resigns nobody
/// leads. (A lock's waiter in its place joins the line again on a live lease: see the crate
/// docs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_whose_lease_is_revoked_while_it_waits_never_leads_on_it() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("revoked-candidate");
    let leader = a.campaign(&name, b"leader", &wait()).await.unwrap();
    let mut changes = a.observe(&name).await.unwrap();
    next_matching("the leader", &mut changes, |e| {
        leads(e, leader.term(), b"leader")
    })
    .await;
    let candidate = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.campaign(&name, b"candidate", &wait()).await })
    };
    let mut raw = common::raw_client(&url).await.unwrap();
    let waiting = until_keys(&mut raw, &url, &name, 2).await[1].clone();
    raw.lease_revoke(waiting.lease()).await.unwrap();
    // The revoked key is gone; the leader is still the only one.
    within("the revoked key to go", async {
        while common::queue_keys(&mut raw, &url, &name)
            .await
            .unwrap()
            .iter()
            .any(|kv| kv.key() == waiting.key())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let outcome = within("the revoked candidate's answer", candidate)
        .await
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "a candidate whose lease was revoked while it waited: {outcome:?}"
    );
    let said = b.leader(&name).await.unwrap();
    assert_eq!(said.map(|l| l.term()), Some(leader.term()));
    let revoked = u64::try_from(waiting.create_revision()).unwrap();
    leader.resign().await.unwrap();
    assert_eq!(a.leader(&name).await.unwrap(), None);
    let (_, seen) = next_matching("nobody leading", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
    assert!(
        !seen
            .iter()
            .any(|e| e.contains(&format!("term: {revoked},"))),
        "an observer saw the revoked key's term: {seen:?}"
    );
}

/// The leader's lease is revoked (the server ends its session): its record goes with it, a
/// proclaim is refused (`NotHeld`, or `Lost` once the guard has heard), and nobody leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_after_the_lease_was_revoked_is_refused() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let a = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("revoked-leader");
    let leadership = a.campaign(&name, b"campaign", &wait()).await.unwrap();
    // The campaign's value rides its key; a proclaim puts the record.
    leadership.proclaim(b"before").await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let kept = record(&mut raw, &url, &name).await.expect("the record");
    assert_eq!(
        kept.value(),
        format!("{}:before", leadership.term().get()).as_bytes()
    );
    common::revoke_holder(&url, &name).await.unwrap();
    assert!(
        record(&mut raw, &url, &name).await.is_none(),
        "the record outlived its lease"
    );
    let refused = leadership.proclaim(b"after").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{refused:?}"
    );
    assert!(record(&mut raw, &url, &name).await.is_none());
    assert_eq!(a.leader(&name).await.unwrap(), None);
    within("the leader's loss", leadership.lost()).await;
}

/// A deposed leader whose key an operator deleted (its lease lives on, and so does its record,
/// which now names a term that does not hold) while a successor leads: `leader()` names the
/// successor only (by the value its key carried, the stale record beside it), the deposed
/// leader's proclaim is refused without touching the record, and the successor's proclaim
/// replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_proclaim_never_replaces_its_successors_record() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("deposed");
    let old = a.campaign(&name, b"old", &wait()).await.unwrap();
    old.proclaim(b"old-record").await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let key = until_keys(&mut raw, &url, &name, 1).await[0].key().to_vec();
    raw.delete(key, None).await.unwrap();
    // Its record is still there, on its live lease, but names a term that no longer holds.
    assert!(record(&mut raw, &url, &name).await.is_some());
    assert_eq!(b.leader(&name).await.unwrap(), None);
    let new = b.campaign(&name, b"new", &wait()).await.unwrap();
    assert!(new.term() > old.term());
    let refused = old.proclaim(b"old-again").await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{refused:?}"
    );
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!((said.term(), said.value()), (new.term(), &b"new"[..]));
    let stale = record(&mut raw, &url, &name).await.expect("the record");
    assert_eq!(
        stale.value(),
        format!("{}:old-record", old.term().get()).as_bytes()
    );
    new.proclaim(b"new-record").await.unwrap();
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(
        (said.term(), said.value()),
        (new.term(), &b"new-record"[..])
    );
    let kept = record(&mut raw, &url, &name).await.expect("the record");
    assert_eq!(
        kept.value(),
        format!("{}:new-record", new.term().get()).as_bytes()
    );
    new.resign().await.unwrap();
    drop(old);
}

/// `extend` to another TTL class moves the leader's key onto another lease: the record moves
/// with it, so it lives exactly as long as the key. A resignation deletes both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_follows_its_key_and_goes_with_the_resignation() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let a = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("record-moves");
    let options = wait().with_ttl(Duration::from_secs(3));
    let leadership = a.campaign(&name, b"moving", &options).await.unwrap();
    leadership.proclaim(b"recorded").await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let before = until_keys(&mut raw, &url, &name, 1).await[0].lease();
    assert_eq!(record(&mut raw, &url, &name).await.unwrap().lease(), before);
    leadership
        .guard()
        .extend(Duration::from_secs(7))
        .await
        .unwrap();
    let after = until_keys(&mut raw, &url, &name, 1).await[0].lease();
    assert_ne!(after, before, "the key did not move");
    assert_eq!(record(&mut raw, &url, &name).await.unwrap().lease(), after);
    leadership.proclaim(b"moved").await.unwrap();
    let said = a.leader(&name).await.unwrap().expect("a leader");
    assert_eq!(said.value(), b"moved");
    leadership.resign().await.unwrap();
    assert!(
        record(&mut raw, &url, &name).await.is_none(),
        "a resigned leader's record stayed"
    );
    assert!(
        common::queue_keys(&mut raw, &url, &name)
            .await
            .unwrap()
            .is_empty()
    );
}

/// An observer cut off from the server (its connection closed, so its watch must be made
/// again) while the leader resigns, another leads, and the history its watch would resume from
/// is compacted: when the link heals, it says `Missed`, then the leader now. And an observer
/// whose stream was only broken misses nothing: the watch resumes where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_through_a_compaction_says_missed_then_the_leader_now() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let observer = EtcdLock::connect_url(&format!("etcd://{}", proxy.addr()))
        .await
        .unwrap();
    let name = name("observer-cut");
    let first = a.campaign(&name, b"first", &wait()).await.unwrap();
    let mut changes = observer.observe(&name).await.unwrap();
    next_matching("the first leader", &mut changes, |e| {
        leads(e, first.term(), b"first")
    })
    .await;

    // A broken stream, healed before anything was compacted: every change comes through.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    first.proclaim(b"first-again").await.unwrap();
    proxy.heal();
    let (_, seen) = next_matching("the proclaim made while cut off", &mut changes, |e| {
        leads(e, first.term(), b"first-again")
    })
    .await;
    assert!(!seen.iter().any(|e| e.contains("Missed")), "{seen:?}");

    // Cut off through a hand-over and a compaction.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    first.resign().await.unwrap();
    let second = b.campaign(&name, b"second", &wait()).await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    common::compact_history(&mut raw, "dlock-election-filler/cut").await;
    proxy.heal();
    let (_, seen) = next_matching("the leader after the gap", &mut changes, |e| {
        leads(e, second.term(), b"second")
    })
    .await;
    assert!(
        seen.iter().any(|e| e == "Missed"),
        "no Missed before the state after a compacted gap: {seen:?}"
    );
    assert!(
        observer.compacted_watches() > 0,
        "the watch was not compacted"
    );
    // Then it goes on being woken by the server.
    second.resign().await.unwrap();
    next_matching("nobody leading", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
}

/// The server's count of watchers (`etcd_debugging_mvcc_watcher_total` on its `/metrics`).
async fn watchers_on(addr: std::net::SocketAddr) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page.lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|count| count.trim().parse::<f64>().ok())
        .map(|count| count as u64)
        .expect("the watcher gauge on /metrics")
}

async fn until_watchers(addr: std::net::SocketAddr, what: &str, count: u64) {
    within(what, async {
        while watchers_on(addr).await != count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// An observer is one watch on the server while its stream lives, and none once it is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_observer_leaves_no_watch_on_the_server() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let url = common::etcd_url(&etcd.endpoints());
    let observer = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("dropped-observer");
    until_watchers(etcd.addr(), "no watcher before observing", 0).await;
    let mut changes = observer.observe(&name).await.unwrap();
    next_matching("nobody leading", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await;
    until_watchers(etcd.addr(), "the observer's watch", 1).await;
    drop(changes);
    until_watchers(etcd.addr(), "no watcher after the drop", 0).await;
}
