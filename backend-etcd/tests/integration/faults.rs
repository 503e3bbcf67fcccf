//! etcd-specific faults: two tasks of one client on one name, a partition past the lease, the
//! leader killed while a lock is held, compaction and defragmentation while waiters wait, a
//! waiter giving up between the holder and the next, a waiter's key revoked just before the
//! release. Each test that harms a server starts its own. Tests wait on events with generous
//! bounds and never assert speed. A holder's lease revoked with a waiter queued is the
//! conformance suite's killed-holder case (the harness kills a holder by revoking its lease).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LockStatus, LostReason};
use dlock_conformance::wait_for;
use dlock_etcd::EtcdLock;
use dlock_test_servers::{Etcd, EtcdCluster, FaultProxy, ProxyMode};
use etcd_client::{Client, KeyValue};

const BOUND: Duration = Duration::from_secs(30);

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

/// Waits until `name` has `count` keys or more (its holder's and its waiters'), and returns them
/// oldest first.
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

/// Deletion events lost by the server (etcd 3.4 before 3.4.31 can lose them after a compaction;
/// here both clients drop every deletion their watch stream receives): the holder still learns
/// that its key was deleted, and the waiter that its predecessor went, from the fallback
/// re-reads alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_watch_events_are_caught_by_the_fallback_rereads() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    a.lose_watch_deletions(true);
    b.lose_watch_deletions(true);
    let name = name("lost-events");
    let guard = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let waiter = wait_for::spawned_acquire(BOUND, &b, &name);
    let mut raw = common::raw_client(&url).await.unwrap();
    let holder_key = until_keys(&mut raw, &url, &name, 2).await[0].key().to_vec();
    // An operator deletes the holder's key: only that key, its lease lives on.
    raw.delete(holder_key, None).await.unwrap();
    let reason = within("the holder's lost signal without an event", guard.lost()).await;
    assert_eq!(reason, LostReason::TakenOver);
    let next = within("the waiter without an event", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    assert!(guard.release().await.is_err());
    next.release().await.unwrap();
}

/// The oldest key under `name` (its holder's): key, lease, create revision.
async fn holder_key(raw: &mut Client, url: &str, name: &LockName) -> (Vec<u8>, i64, i64) {
    let queue = common::queue_keys(raw, url, name).await.unwrap();
    let kv = &queue[0];
    (kv.key().to_vec(), kv.lease(), kv.create_revision())
}

/// `extend` to another TTL class on a renewed guard moves its key onto the client's kept-alive
/// lease of that class, keeping its create revision (fence and queue place), and the guard
/// follows the new lease from then on: the old lease's end spares it, the new one's loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_to_another_ttl_class_moves_the_key_and_the_guard_follows_its_new_lease() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let (name, neighbour) = (name("extend-class"), name("extend-class-neighbour"));
    let short = LockOptions::new().with_ttl(Duration::from_secs(3));
    let guard = a.acquire(&name, &short).await.unwrap();
    let stays = a.acquire(&neighbour, &short).await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let (key, old_lease, revision) = holder_key(&mut raw, &url, &name).await;
    guard.extend(Duration::from_secs(10)).await.unwrap();
    let (moved_key, new_lease, moved_revision) = holder_key(&mut raw, &url, &name).await;
    assert_eq!(
        (moved_key, moved_revision),
        (key, revision),
        "the key or its place changed"
    );
    assert_ne!(new_lease, old_lease, "the key stayed on the 3 s lease");
    let granted = raw
        .lease_time_to_live(new_lease, None)
        .await
        .unwrap()
        .granted_ttl();
    assert_eq!(granted, 10);
    assert_eq!(
        holder_key(&mut raw, &url, &neighbour).await.1,
        old_lease,
        "the neighbour moved too"
    );
    // The 3 s lease ends: the guard left on it is lost, the moved one is not.
    raw.lease_revoke(old_lease).await.unwrap();
    let reason = within("the guard left on the old lease to be lost", stays.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    assert!(
        matches!(guard.status(), LockStatus::Held { .. }),
        "the moved guard followed its old lease: {:?}",
        guard.status()
    );
    let waiter = wait_for::spawned_acquire(BOUND, &b, &name);
    until_keys(&mut raw, &url, &name, 2).await;
    // The 10 s lease ends: now the moved guard is lost, and its waiter moves up.
    raw.lease_revoke(new_lease).await.unwrap();
    let reason = within("the moved guard to be lost", guard.lost()).await;
    assert_eq!(reason, LostReason::SessionExpired);
    let next = within("the waiter", waiter).await.unwrap().unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_of_one_client_on_one_name_are_never_both_held() {
    let etcd = dlock_test_servers::shared_etcd();
    let client = Arc::new(
        EtcdLock::connect_url(&common::etcd_url(&etcd.endpoints()))
            .await
            .unwrap(),
    );
    let name = name("two-tasks");
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (client, name, inside) = (client.clone(), name.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let guard = client.acquire(&name, &wait()).await.unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "both tasks held");
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        within("the two tasks", task).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_past_the_lease_suspends_then_loses_and_the_stale_release_spares_the_new_key() {
    let etcd = Etcd::start().unwrap();
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    let cut_off = EtcdLock::connect_url(&format!("etcd://{}?command_timeout=500ms", proxy.addr()))
        .await
        .unwrap();
    let direct = EtcdLock::connect_url(&common::etcd_url(&etcd.endpoints()))
        .await
        .unwrap();
    let name = name("partition");
    let ttl = LockOptions::new().with_ttl(Duration::from_secs(2));
    let stale = cut_off.acquire(&name, &ttl).await.unwrap();
    proxy.set_mode(ProxyMode::Blackhole);
    wait_for::partitioned_holder_spares_the_next(BOUND, stale, || proxy.heal(), &direct, &name)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_while_held_keeps_the_lock_and_admits_no_second_holder() {
    let cluster = EtcdCluster::start().unwrap();
    let url = common::etcd_url(&cluster.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("leader");
    // A lease that outlasts an election plus the keep-alive stream's move to a survivor with
    // room to spare on a loaded 2-core machine (3 s was lost there once, during a full run).
    let lease = Duration::from_secs(10);
    let ttl = LockOptions::new().with_ttl(lease);
    let guard = a.acquire(&name, &ttl).await.unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let leader_id = raw.status().await.unwrap().leader();
    let members = raw.member_list().await.unwrap();
    let leader_url = members
        .members()
        .iter()
        .find(|m| m.id() == leader_id)
        .and_then(|m| m.client_urls().first().cloned())
        .unwrap();
    let leader = cluster
        .members()
        .iter()
        .find(|m| m.url() == leader_url)
        .unwrap();
    leader.kill();
    // Long enough for an election and several keep-alives on the survivors.
    let mut probe_ok = false;
    for _ in 0..50 {
        match b.try_acquire(&name, &LockOptions::new()).await {
            Ok(Some(_)) => panic!("a second holder while the first one's lease is kept alive"),
            Ok(None) => {
                probe_ok = true;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    assert!(probe_ok, "the survivors never answered");
    // Past a whole lease: only keep-alives on the survivors can have kept it.
    tokio::time::sleep(lease + Duration::from_secs(2)).await;
    assert!(
        guard.is_held(),
        "the lock did not survive: {:?}",
        guard.status()
    );
    assert!(
        b.try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    within("the lock after release", b.acquire(&name, &wait()))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Waiters keep waiting through a compaction of the history their watches started from, and a
/// defragmentation: each is granted in turn with a higher token, none stranded. (A watch whose
/// start revision was compacted is answered "compacted"; the waiter must re-read, not hang.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_and_defragmentation_strand_no_waiter() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let url = common::etcd_url(&etcd.endpoints());
    let holder = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("compacted");
    let guard = holder.acquire(&name, &LockOptions::new()).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let client = EtcdLock::connect_url(&url).await.unwrap();
        let name = name.clone();
        waiters.push(tokio::spawn(async move {
            let next = client.acquire(&name, &wait()).await?;
            let token = next.fencing_token();
            next.release().await?;
            Ok::<_, LockError>(token)
        }));
    }
    let mut raw = common::raw_client(&url).await.unwrap();
    // Wait until all three are queued (four keys under the name), then move the revision on and
    // compact everything before it, physically, and defragment.
    until_keys(&mut raw, &url, &name, 4).await;
    common::compact_history(&mut raw, "dlock-faults-filler").await;
    raw.defragment().await.unwrap();
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let mut tokens = Vec::new();
    for waiter in waiters {
        tokens.push(
            within("a waiter after compaction", waiter)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    tokens.sort();
    assert!(tokens[0] > first, "{tokens:?} after {first}");
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "each waiter its own token");
}

/// Waiters cut off from the server while the holder releases and the history their watches
/// started from is compacted: when the link heals, their watches are re-created from revisions
/// that no longer exist and answered "compacted". Each must re-read rather than hang: all are
/// granted, in queue order, each with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cut_off_through_a_release_and_a_compaction_are_not_stranded() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let proxy = FaultProxy::start(etcd.addr()).unwrap();
    let url = common::etcd_url(&etcd.endpoints());
    let holder = EtcdLock::connect_url(&url).await.unwrap();
    let name = name("cut-compacted");
    let guard = holder.acquire(&name, &LockOptions::new()).await.unwrap();
    let granted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let client = EtcdLock::connect_url(&format!("etcd://{}", proxy.addr()))
            .await
            .unwrap();
        clients.push(client.clone());
        let (name, granted) = (name.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let next = client.acquire(&name, &wait()).await?;
            granted.lock().unwrap().push(next.fencing_token());
            next.release().await
        }));
    }
    let mut raw = common::raw_client(&url).await.unwrap();
    until_keys(&mut raw, &url, &name, 4).await;
    // Cut the waiters off, and close their connections so that their watch streams must be
    // opened again, and every watch re-created from where it was.
    proxy.set_mode(ProxyMode::Blackhole);
    proxy.reset();
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    common::compact_history(&mut raw, "dlock-faults-filler/cut").await;
    proxy.heal();
    for waiter in waiters {
        within("a cut-off waiter after the compaction", waiter)
            .await
            .unwrap()
            .unwrap();
    }
    let granted = granted.lock().unwrap().clone();
    assert_eq!(granted.len(), 3, "{granted:?}");
    assert!(granted[0] > first, "{granted:?} after {first}");
    assert!(
        granted.windows(2).all(|w| w[0] < w[1]),
        "granted out of queue order: {granted:?}"
    );
    let compacted: u64 = clients.iter().map(EtcdLock::compacted_watches).sum();
    assert!(
        compacted > 0,
        "no watch was re-created from a compacted revision"
    );
}

/// Authentication tokens that go bad while a lock is held, renewed and waited for: tokens live
/// 5 s unless used, and every token is invalidated mid-hold (authentication disabled and enabled
/// again, which drops the server's tokens). The keep-alive stream, the watch stream and later
/// unary calls all meet a refused token; a client must take a new one rather than lose the lock
/// or strand the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_tokens_invalidated_during_a_long_hold_change_nothing() {
    let token_ttl = Duration::from_secs(5);
    let etcd = Etcd::start_with_auth("secret", token_ttl)
        .unwrap_or_else(|e| panic!("cannot start etcd for the tests: {e}"));
    let url = format!("etcd://root:secret@{}", etcd.addr());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("auth");
    let options = LockOptions::new().with_ttl(Duration::from_secs(2));
    let guard = a.acquire(&name, &options).await.unwrap();
    let waiter = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.acquire(&name, &LockOptions::new().with_wait_timeout(BOUND * 2))
                .await
        }
    });
    for act in [["auth", "disable"], ["auth", "enable"]] {
        let mut args = vec!["--user", "root:secret"];
        args.extend(act);
        etcd.etcdctl(&args).unwrap();
    }
    // The time itself is under test: more than a token's life, six lease TTLs of renewals.
    tokio::time::sleep(token_ttl + Duration::from_secs(7)).await;
    assert!(
        guard.is_held() && matches!(guard.status(), LockStatus::Held { .. }),
        "the holder must keep its lock across token expiries: {:?}",
        guard.status()
    );
    assert!(!waiter.is_finished(), "the waiter must still wait");
    let other = a
        .try_acquire(&LockName::new(format!("{name}-other")).unwrap(), &options)
        .await
        .expect("a new call after the token expired must work")
        .expect("nobody holds the other name");
    other.release().await.unwrap();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let next = within("the waiter after the release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

/// A waiter that watches every key ahead of it takes the lock on its predecessor's deletion
/// without reading the queue again, but only once every older key is gone too: a predecessor
/// that gives up while the holder still holds must not hand the lock on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ahead_giving_up_does_not_pass_the_lock_while_it_is_held() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b, c) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("waiter-ahead-gives-up");
    let waiters = |a: &EtcdLock| {
        let (a, name) = (a.clone(), name.clone());
        async move { a.inspect(&name).await.unwrap().waiters.unwrap_or(0) }
    };
    let holder = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let (give_up, gave_up) = tokio::sync::oneshot::channel::<()>();
    let ahead = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            let options = wait();
            tokio::select! {
                acquired = b.acquire(&name, &options) => Some(acquired),
                _ = gave_up => None,
            }
        }
    });
    within("the first waiter in the queue", async {
        while waiters(&a).await < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let (acquired, mut behind_done) = tokio::sync::mpsc::unbounded_channel();
    let behind = tokio::spawn({
        let (c, name) = (c.clone(), name.clone());
        async move {
            let guard = c.acquire(&name, &wait()).await;
            let _ = acquired.send(());
            guard
        }
    });
    within("the second waiter in the queue", async {
        while waiters(&a).await < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The waiter in between gives up: its key goes while the holder still holds.
    give_up.send(()).unwrap();
    assert!(
        within("the first waiter giving up", ahead)
            .await
            .unwrap()
            .is_none()
    );
    within("the first waiter's key gone", async {
        while waiters(&a).await > 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The waiter behind sees its predecessor's deletion within milliseconds; give it a second
    // to take the lock wrongly (a wait for something that must not happen has no event).
    let wrongly = tokio::time::timeout(Duration::from_secs(1), behind_done.recv()).await;
    assert!(
        wrongly.is_err(),
        "the waiter behind took the lock while it was held"
    );
    assert!(holder.is_held());
    let holder_token = holder.fencing_token();
    holder.release().await.unwrap();
    let next = within("the waiter behind", behind).await.unwrap().unwrap();
    assert!(next.fencing_token() > holder_token);
    next.release().await.unwrap();
}

/// A waiter's own key deleted just before the holder's (its lease revoked, then the lock
/// released): the waiter sees its own deletion first, since one watch delivers both in revision
/// order. It held nothing, so it loses nothing: it joins the line again on a new lease and takes
/// the lock there, on a key of its own that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_goes_just_before_the_release_queues_again() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("waiter-key-revoked");
    let holder = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let waiter = wait_for::spawned_acquire(BOUND, &b, &name);
    let mut raw = common::raw_client(&url).await.unwrap();
    let waiter_lease = until_keys(&mut raw, &url, &name, 2).await[1].lease();
    raw.lease_revoke(waiter_lease).await.unwrap();
    let holder_token = holder.fencing_token();
    holder.release().await.unwrap();
    let guard = within("the waiter's answer", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(guard.fencing_token() > holder_token);
    assert_grant_stands_on_its_own_key(&mut raw, &url, &name, &guard, waiter_lease).await;
    assert!(
        a.try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
}

/// The lease of a client holding a name and waiting for it too is revoked: etcd deletes both
/// keys in one revision. The waiter must not take the holder's deletion for its turn (it read
/// that deletion before its own, and answered with a guard on a key that no longer existed,
/// while another client took the lock at once): it queues again on a new lease, and its guard
/// stands on a key that exists, which no other client can take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_with_a_holder_and_a_waiter_grants_only_on_a_live_key() {
    let etcd = dlock_test_servers::shared_etcd();
    let url = common::etcd_url(&etcd.endpoints());
    let (a, other) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("lease-revoked-with-waiter");
    let holder = a.acquire(&name, &LockOptions::new()).await.unwrap();
    let waiter = wait_for::spawned_acquire(BOUND, &a, &name);
    let mut raw = common::raw_client(&url).await.unwrap();
    let keys = until_keys(&mut raw, &url, &name, 2).await;
    assert_eq!(
        keys[0].lease(),
        keys[1].lease(),
        "one client, one session lease"
    );
    let revoked = keys[0].lease();
    raw.lease_revoke(revoked).await.unwrap();
    let guard = within("the waiter's answer", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_grant_stands_on_its_own_key(&mut raw, &url, &name, &guard, revoked).await;
    assert!(
        other
            .try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "another client took the lock the waiter was granted"
    );
    within("the holder's loss", holder.lost()).await;
    guard.release().await.unwrap();
}

/// `guard`'s lock is the oldest key of `name`, created at its token's revision, on a lease other
/// than `revoked`.
async fn assert_grant_stands_on_its_own_key(
    raw: &mut Client,
    url: &str,
    name: &LockName,
    guard: &dlock_api::LockGuard,
    revoked: i64,
) {
    let keys = common::queue_keys(raw, url, name).await.unwrap();
    let oldest = keys.first().expect("the granted key exists");
    assert_eq!(
        u64::try_from(oldest.create_revision()).unwrap(),
        guard.fencing_token().get(),
        "the oldest key of the name is not the grant's"
    );
    assert_ne!(oldest.lease(), revoked);
}

/// A cluster whose election timeout is 3 s has a shortest lease of 5 s (`ceil(1.5 × 3 s)`) and
/// lengthens shorter ones to it without a word. The client learns it at connect: its `min_ttl`
/// says 5 s, a 3 s TTL is refused before any request, and a 5 s lock rides a 5 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_shortest_lease_is_the_minimum_ttl() {
    let etcd = Etcd::start_with_timing(100, 3000).expect(
        "etcd starts (install it with scripts/install-servers: Debian's etcd-server package)",
    );
    let url = common::etcd_url(&etcd.endpoints());
    let locks = EtcdLock::connect_url(&url).await.unwrap();
    assert_eq!(
        locks.capabilities().min_ttl,
        Some(Duration::from_secs(5)),
        "the cluster's shortest lease"
    );
    let name = name("shortest-lease");
    let short = LockOptions::new().with_ttl(Duration::from_secs(3));
    let refused = locks.acquire(&name, &short).await;
    assert!(
        matches!(refused, Err(LockError::InvalidArgument { what: "ttl", .. })),
        "a TTL below the cluster's shortest lease: {refused:?}"
    );
    let guard = locks
        .acquire(&name, &LockOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    let mut raw = common::raw_client(&url).await.unwrap();
    let lease = until_keys(&mut raw, &url, &name, 1).await[0].lease();
    let granted = raw
        .lease_time_to_live(lease, None)
        .await
        .unwrap()
        .granted_ttl();
    assert_eq!(granted, 5);
    guard.release().await.unwrap();
}

/// A waiter through a server restart longer than its lease (Curator's waiting-through-a-restart
/// test): its lease ends with the session, and it held nothing, so it joins the line again once
/// the server is back and takes the lock within its wait; it got `Lost`, which `acquire` does not
/// answer, for a lock it never held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_through_a_server_restart_longer_than_its_lease_acquires_within_its_wait() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("{e}"));
    let url = format!(
        "{}?command_timeout=500ms",
        common::etcd_url(&etcd.endpoints())
    );
    let (a, b) = (
        EtcdLock::connect_url(&url).await.unwrap(),
        EtcdLock::connect_url(&url).await.unwrap(),
    );
    let name = name("waiter-through-restart");
    let short = LockOptions::new().with_ttl(Duration::from_secs(2));
    let holder = a.acquire(&name, &short).await.unwrap();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        let options = short.clone().with_wait_timeout(BOUND);
        tokio::spawn(async move { b.acquire(&name, &options).await })
    };
    let mut raw = common::raw_client(&url).await.unwrap();
    until_keys(&mut raw, &url, &name, 2).await;
    drop(raw);
    tokio::task::block_in_place(|| etcd.stop());
    within("the holder's loss", holder.lost()).await;
    tokio::task::block_in_place(|| etcd.restart()).unwrap();
    let guard = within("the waiter's answer", waiter)
        .await
        .unwrap()
        .expect("the waiter acquires once the server is back");
    assert!(guard.fencing_token() > holder.fencing_token());
    let _ = holder.release().await;
    guard.release().await.unwrap();
}
