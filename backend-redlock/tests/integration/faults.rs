//! Redlock under faults on five nodes of its own per test: a minority killed (still acquires), a
//! majority killed (fails within the connect timeout, nothing left held), two nodes frozen
//! during an acquire (granted and released on the live nodes' answers, no key left in the
//! end), a failed renewal (nothing deleted, suspended, then lost), a grant's key on every node
//! although the grant is decided at the quorum, every subset of nodes clogged by a foreign
//! value, many clients contending for one name, a replicated node refused, and nodes whose
//! clocks jump.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{redlock_url, start_nodes};
use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LockStatus, LostReason};
use dlock_redlock::{Redlock, RedlockConfig};
use dlock_test_servers::RedisNodes;
use tokio::time::{Instant, timeout};

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(format!("redlock-faults/{s}")).unwrap()
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new()
        .with_ttl(ttl)
        .with_wait_timeout(Duration::from_secs(20))
}

async fn client(nodes: &RedisNodes, query: &str) -> Redlock {
    Redlock::connect_url(&redlock_url(nodes, query))
        .await
        .expect("a quorum of nodes answers")
}

/// The lock key's value on node `i` (`None`: no key), read on a fresh connection.
async fn value_on(nodes: &RedisNodes, i: usize, name: &LockName) -> Option<String> {
    let key = common::keys(&redlock_url(nodes, ""), name).lock;
    let client = redis::Client::open(nodes.node(i).url()).unwrap();
    let mut conn = timeout(BOUND, client.get_multiplexed_async_connection())
        .await
        .expect("the node answers")
        .unwrap();
    redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Waits (within the bound) until no live node among `live` has the lock key of `name`.
async fn settles_empty(nodes: &RedisNodes, live: &[usize], name: &LockName) {
    let give_up = Instant::now() + BOUND;
    loop {
        let mut left = Vec::new();
        for &i in live {
            if let Some(value) = value_on(nodes, i, name).await {
                left.push(format!("node {i}: {value}"));
            }
        }
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < give_up, "keys left: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_five_killed_still_acquires() {
    let nodes = start_nodes(5);
    let a = client(&nodes, "").await;
    nodes.node(0).kill();
    nodes.node(3).kill();
    // A client started now connects to the three that are left.
    let b = client(&nodes, "").await;
    let lock = name("minority-down");
    let ttl = Duration::from_secs(10);
    for _ in 0..3 {
        let guard = timeout(BOUND, a.acquire(&lock, &opts(ttl)))
            .await
            .expect("no hang")
            .expect("three of five nodes are a quorum");
        assert!(
            b.try_acquire(&lock, &opts(ttl)).await.unwrap().is_none(),
            "a second client got the lock while it was held"
        );
        guard.release().await.unwrap();
        let guard = b.acquire(&lock, &opts(ttl)).await.unwrap();
        guard.release().await.unwrap();
    }
    settles_empty(&nodes, &[1, 2, 4], &lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_of_five_killed_fails_fast_and_leaves_nothing() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    for i in [0, 2, 4] {
        nodes.node(i).kill();
    }
    let lock = name("majority-down");
    let tried = timeout(
        BOUND,
        locks.try_acquire(&lock, &opts(Duration::from_secs(10))),
    )
    .await
    .expect("no hang");
    assert!(
        matches!(tried, Err(LockError::Unavailable { .. })),
        "{tried:?}"
    );
    let waited = timeout(BOUND, locks.acquire(&lock, &opts(Duration::from_secs(10))))
        .await
        .expect("a wait does not outlast the missing quorum");
    assert!(
        matches!(waited, Err(LockError::Unavailable { .. })),
        "{waited:?}"
    );
    // The two nodes that answered took the key and were released again.
    settles_empty(&nodes, &[1, 3], &lock).await;
    // A new client cannot start without a quorum either.
    let connected = Redlock::connect_url(&redlock_url(&nodes, "?connect_timeout=500ms")).await;
    assert!(
        matches!(connected, Err(LockError::Unavailable { .. })),
        "{connected:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_frozen_nodes_hold_up_no_grant_extend_or_release_and_keep_no_key() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "?node_timeout=2s").await;
    let config = locks.config().clone();
    let lock = name("frozen");
    let ttl = Duration::from_secs(10);
    nodes.node(1).pause();
    nodes.node(2).pause();
    let called = Instant::now();
    let guard = timeout(BOUND, locks.acquire(&lock, &opts(ttl)))
        .await
        .expect("no hang")
        .expect("three answering nodes are a quorum");
    let returned = Instant::now();
    let valid_until = guard.valid_until().expect("a TTL lease");
    // Validity counts from before the first request (so not before the call, nor after the
    // return), less the drift.
    let lease = ttl - config.drift_for(ttl);
    assert!(valid_until >= called + lease && valid_until <= returned + lease);
    // The grant came with the three live nodes' yes: the frozen ones were not waited for.
    let node_timeout = config.node_timeout_for(ttl);
    assert!(
        returned - called < node_timeout,
        "the grant took {:?}, the per-node timeout being {node_timeout:?}",
        returned - called
    );
    assert!(guard.is_held());
    // Nor an extend: it returns once the live nodes reset the TTL.
    let extending = Instant::now();
    guard
        .extend(ttl)
        .await
        .expect("three answering nodes are a quorum");
    assert!(
        extending.elapsed() < node_timeout,
        "the extend took {:?}, the per-node timeout being {node_timeout:?}",
        extending.elapsed()
    );
    // Nor a release: it returns once the live nodes deleted the key.
    let releasing = Instant::now();
    guard.release().await.unwrap();
    assert!(
        releasing.elapsed() < config.command_timeout,
        "the release took {:?}, the command timeout being {:?}",
        releasing.elapsed(),
        config.command_timeout
    );
    // Once thawed, the frozen nodes run the SET they were sent and then the release sent after
    // it on the same connection, or, where the release gave up before it could resend its
    // script in full (the node did not know it yet), keep the key until its TTL: either way,
    // nothing stays.
    nodes.node(1).resume();
    nodes.node(2).resume();
    settles_empty(&nodes, &[0, 1, 2, 3, 4], &lock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_decided_at_the_quorum_still_sets_the_key_on_every_node() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    for i in 0..100 {
        let lock = name(&format!("everywhere-{i}"));
        let guard = locks
            .acquire(&lock, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        // The grant does not wait for the two slowest nodes, but their SET still goes out: a
        // key missing there would leave the lock one node from lost.
        let give_up = Instant::now() + BOUND;
        loop {
            let mut missing = Vec::new();
            for node in 0..5 {
                if value_on(&nodes, node, &lock).await.is_none() {
                    missing.push(node);
                }
            }
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "{lock}: no key on nodes {missing:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_renewal_suspends_then_loses_and_deletes_nothing() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    let lock = name("failed-renewal");
    let ttl = Duration::from_secs(3);
    let guard = locks.acquire(&lock, &opts(ttl)).await.unwrap();
    for i in [0, 1, 2] {
        nodes.node(i).kill();
    }
    // The next renewal reaches two nodes of five: suspended while validity remains.
    let give_up = Instant::now() + BOUND;
    let until = loop {
        match guard.status() {
            LockStatus::Suspended { until } => break until,
            LockStatus::Held { .. } => {}
            LockStatus::Lost(reason) => panic!("lost ({reason}) without being suspended first"),
            other => panic!("unexpected status {other:?}"),
        }
        assert!(Instant::now() < give_up, "never suspended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(!guard.is_held(), "a suspended guard is not held");
    assert!(Some(until) <= guard.valid_until());
    // The failed renewal deleted nothing: the nodes that answered still carry the key.
    let ours = value_on(&nodes, 3, &lock).await;
    assert!(ours.is_some(), "node 3 lost the key");
    assert_eq!(value_on(&nodes, 4, &lock).await, ours);
    let reason = timeout(BOUND, guard.lost())
        .await
        .expect("lost once the validity ran out");
    assert_eq!(reason, LostReason::RenewalFailed);
    assert!(matches!(
        guard.release().await,
        Err(LockError::Lost {
            reason: LostReason::RenewalFailed,
            ..
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subset_of_clogged_nodes_decides_by_the_free_ones() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    let url = redlock_url(&nodes, "");
    let mut conns = common::node_conns(&url).await.unwrap();
    for clogged in 0u32..32 {
        let lock = name(&format!("clogged/{clogged}"));
        let key = common::keys(&url, &lock).lock;
        for (i, conn) in conns.iter_mut().enumerate() {
            if clogged & (1 << i) != 0 {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(format!("foreign-{i}"))
                    .arg("PX")
                    .arg(60_000)
                    .query_async(conn)
                    .await
                    .unwrap();
            }
        }
        let free = 5 - clogged.count_ones();
        let got = locks
            .try_acquire(&lock, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(got.is_some(), free >= 3, "{free} free nodes");
        if let Some(guard) = got {
            guard.release().await.unwrap();
        }
        // Only the foreign keys stay: nothing of ours on the free nodes.
        let free_nodes: Vec<usize> = (0..5).filter(|i| clogged & (1 << i) == 0).collect();
        settles_empty(&nodes, &free_nodes, &lock).await;
        for i in (0..5).filter(|i| clogged & (1 << i) != 0) {
            assert_eq!(
                value_on(&nodes, i, &lock).await,
                Some(format!("foreign-{i}"))
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_contend_without_deadlock_or_livelock() {
    let nodes = start_nodes(5);
    let lock = name("contended");
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let (clients, tasks_per_client, rounds) = (6, 3, 10);
    let mut all = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let locks = client(&nodes, "").await;
        all.push(locks.clone());
        for _ in 0..tasks_per_client {
            let (locks, lock, inside, done) =
                (locks.clone(), lock.clone(), inside.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let options = LockOptions::new()
                    .with_ttl(Duration::from_secs(10))
                    .with_wait_timeout(BOUND);
                for _ in 0..rounds {
                    let guard = locks.acquire(&lock, &options).await?;
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    guard.release().await?;
                }
                Ok::<(), LockError>(())
            }));
        }
    }
    for task in tasks {
        timeout(BOUND * 4, task)
            .await
            .expect("every task finishes: no deadlock, no livelock")
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        done.load(Ordering::SeqCst),
        (clients * tasks_per_client * rounds) as u64
    );
    let (mut rounds_sent, mut splits) = (0, 0);
    for locks in &all {
        let stats = locks.stats();
        rounds_sent += stats.rounds;
        splits += stats.split_votes;
    }
    eprintln!(
        "{} grants took {rounds_sent} rounds; {splits} ended in a split vote ({:.1} %)",
        done.load(Ordering::SeqCst),
        100.0 * splits as f64 / rounds_sent.max(1) as f64
    );
    settles_empty(&nodes, &[0, 1, 2, 3, 4], &lock).await;
}

#[test]
fn quorum_below_a_majority_is_refused_before_any_network_call() {
    // No server listens on these ports: a config error comes first.
    for url in [
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4,127.0.0.1:5?quorum=2",
        "redlock://127.0.0.1:1,127.0.0.1:1,127.0.0.1:3",
    ] {
        assert!(matches!(
            RedlockConfig::from_url(url),
            Err(LockError::Config { .. })
        ));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let connected = runtime.block_on(Redlock::connect_url(url));
        assert!(
            matches!(connected, Err(LockError::Config { .. })),
            "{connected:?}"
        );
    }
}

/// A node that is a replica, or a primary with a replica attached, is not an independent
/// Redlock node (a failover can put a copy that missed a grant in its place): connect refuses
/// it with a config error naming the node, and the same nodes, once independent again, connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_node_is_refused_at_connect() {
    let nodes = tokio::task::block_in_place(|| start_nodes(3));
    let primary = nodes.node(0).addr();
    let port = primary.port().to_string();
    nodes
        .node(2)
        .command(&["REPLICAOF", "127.0.0.1", &port])
        .unwrap();
    let url = redlock_url(&nodes, "");
    // The replica names itself at once; the primary counts it once the link is up.
    let refused = Redlock::connect_url(&url).await;
    match &refused {
        Err(LockError::Config { reason, .. }) => {
            assert!(
                reason.contains(&nodes.node(2).addr().to_string())
                    || reason.contains(&primary.to_string()),
                "{reason}"
            );
        }
        other => panic!("expected a config error for a replicated node, got {other:?}"),
    }
    nodes.node(2).command(&["REPLICAOF", "NO", "ONE"]).unwrap();
    let give_up = Instant::now() + BOUND;
    let locks = loop {
        match Redlock::connect_url(&url).await {
            Ok(locks) => break locks,
            // The primary may still count its former replica for a moment.
            Err(LockError::Config { reason, .. }) if Instant::now() < give_up => {
                assert!(reason.contains("replica"), "{reason}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("independent nodes refused: {error}"),
        }
    };
    let guard = locks
        .acquire(&name("independent-again"), &opts(Duration::from_secs(5)))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

/// One server listed under two addresses (`localhost` and `127.0.0.1`) is one node, however the
/// URL spells it: connect refuses it, naming both, instead of counting it twice towards the
/// quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_addresses_is_refused_at_connect() {
    let nodes = tokio::task::block_in_place(|| start_nodes(2));
    let (first, second) = (nodes.node(0).port(), nodes.node(1).port());
    let url = format!("redlock://127.0.0.1:{first},127.0.0.1:{second},localhost:{first}");
    match Redlock::connect_url(&url).await {
        Err(LockError::Config { reason, .. }) => assert!(
            reason.contains("same server")
                && reason.contains(&format!("127.0.0.1:{first}"))
                && reason.contains(&format!("localhost:{first}")),
            "{reason}"
        ),
        other => panic!("expected a config error for a server listed twice, got {other:?}"),
    }
}

/// Cuts the remaining TTL of `name`'s key on node `i` to 1 ms: what a forward jump of that
/// node's wall clock does (Redis keeps a key's expiry as an absolute wall-clock time, so the
/// key expires early). libfaketime cannot be preloaded into this redis-server (jemalloc calls
/// the clock before libfaketime has set itself up, and the server never starts), so the jump's
/// effect on the key is applied directly.
async fn jump_clock_on(nodes: &RedisNodes, i: usize, name: &LockName) {
    let key = common::keys(&redlock_url(nodes, ""), name).lock;
    let client = redis::Client::open(nodes.node(i).url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let cut: i64 = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(cut, 1, "node {i} had no key to expire early");
}

/// One node's clock jumps forward: its copy of the key expires early, the holder keeps its
/// quorum (renewals go on, nobody else gets in). Then two more nodes jump: a majority of the
/// copies is gone, so the next renewal reports the loss (`TakenOver`) and another client gets
/// the lock with a higher token. Redlock's safety assumes clocks that agree on their rate;
/// this shows what the library does when they do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_clock_jump_expires_its_key_early_and_a_majority_of_jumps_loses_the_lock() {
    let nodes = start_nodes(5);
    let (holder, other) = (client(&nodes, "").await, client(&nodes, "").await);
    let lock = name("clock-jump");
    let ttl = Duration::from_secs(3);
    let guard = holder.acquire(&lock, &opts(ttl)).await.unwrap();
    jump_clock_on(&nodes, 0, &lock).await;
    let settle = Instant::now() + ttl;
    while Instant::now() < settle {
        // Through a renewal or two (every third of the TTL): still held, still exclusive.
        assert!(guard.is_held(), "one node's clock jump lost the lock");
        let intruder = other
            .try_acquire(&lock, &LockOptions::new().with_ttl(ttl))
            .await
            .unwrap();
        assert!(
            intruder.is_none(),
            "another client got in past a single jump"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for i in [1, 2] {
        jump_clock_on(&nodes, i, &lock).await;
    }
    let reason = timeout(BOUND, guard.lost())
        .await
        .expect("the next renewal notices a majority of the copies gone");
    assert_eq!(reason, LostReason::TakenOver);
    let next = other.acquire(&lock, &opts(ttl)).await.unwrap();
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.unwrap();
    settles_empty(&nodes, &[0, 1, 2, 3, 4], &lock).await;
}

/// Every node restarted without persistence, cleanly and then by SIGKILL: the fence counters
/// are gone, and the next tokens still rise above every earlier one (a lost counter starts from
/// the client's clock, as the single-node fence is floored at the server's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_rising_when_every_node_restarts_without_persistence() {
    let nodes = start_nodes(5);
    let lock = name("tokens-through-restarts");
    let mut last = 0;
    let mut take = |tokens: &mut Vec<u64>, token: u64| {
        assert!(
            token > last,
            "token {token} after {last}; tokens so far {tokens:?}"
        );
        last = token;
        tokens.push(token);
    };
    let mut tokens = Vec::new();
    for round in 0..3 {
        // A new client each round, as after a restart of the service too.
        let locks = client(&nodes, "").await;
        for _ in 0..5 {
            let guard = timeout(BOUND, locks.acquire(&lock, &opts(Duration::from_secs(10))))
                .await
                .expect("no hang")
                .unwrap();
            take(&mut tokens, guard.fencing_token().get());
            guard.release().await.unwrap();
        }
        drop(locks);
        for node in nodes.nodes() {
            if round == 0 {
                node.stop();
            } else {
                node.kill();
            }
            node.restart().unwrap();
        }
    }
}

/// A thousand names, each acquired and released once, leave no key without an expiry on any node:
/// each node's fence counter of a name used once was kept for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_used_once_leave_nothing_without_an_expiry_on_any_node() {
    use futures::StreamExt;
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    let used = futures::stream::iter(0..1_000)
        .map(|i| {
            let locks = locks.clone();
            async move {
                let name = name(&format!("order-{i}"));
                let guard = locks
                    .acquire(&name, &opts(Duration::from_secs(10)))
                    .await
                    .unwrap();
                guard.release().await.unwrap();
            }
        })
        .buffer_unordered(16)
        .count();
    timeout(BOUND * 4, used)
        .await
        .expect("1,000 names used once");
    dlock_api::settle().await;
    for (i, node) in nodes.nodes().iter().enumerate() {
        let forever = tokio::task::block_in_place(|| node.keys_without_expiry()).unwrap();
        assert!(
            forever.is_empty(),
            "node {i}: {} keys without an expiry, e.g. {:?}",
            forever.len(),
            &forever[..forever.len().min(5)]
        );
    }
}

/// Two of five nodes frozen (`SIGSTOP`: the kernel takes the connection, nothing answers) before a
/// client starts: it goes on once three have answered and a per-node timeout more has passed,
/// and connects the two in the background, instead of waiting out their connect timeouts (4.2 s,
/// two connect timeouts, for a fresh `dlock run`). With 10 s connect timeouts, starting and a
/// first acquire must take less than one of them; once the two thaw, they rejoin by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_minority_does_not_hold_up_the_start() {
    let nodes = start_nodes(5);
    nodes.node(1).pause();
    nodes.node(3).pause();
    let started = Instant::now();
    let locks = timeout(
        BOUND,
        client(&nodes, "?connect_timeout=10s&node_timeout=500ms"),
    )
    .await
    .expect("no hang");
    let lock = name("frozen-at-start");
    let guard = timeout(BOUND, locks.acquire(&lock, &opts(Duration::from_secs(10))))
        .await
        .expect("no hang")
        .expect("three answering nodes are a quorum");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the start and a first acquire took {took:?}, a connect timeout or more"
    );
    guard.release().await.unwrap();
    nodes.node(1).resume();
    nodes.node(3).resume();
    // Thawed, the two connect in the background and take part: with two of the other three
    // killed, a grant needs both.
    nodes.node(0).kill();
    nodes.node(2).kill();
    let give_up = Instant::now() + BOUND;
    loop {
        match locks
            .try_acquire(&lock, &opts(Duration::from_secs(10)))
            .await
        {
            Ok(Some(guard)) => {
                guard.release().await.unwrap();
                break;
            }
            other => assert!(
                Instant::now() < give_up,
                "the thawed nodes never joined: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A lock whose keys an operator deleted on every node goes to a waiting client long before the
/// deleted lease would have ended: waiters look at the nodes again every second, as nothing
/// announces a deletion (before, the waiter slept until the old lease's end: 29.6 s of a 30 s
/// lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_deleted_on_every_node_reach_a_waiter_before_the_old_lease_ends() {
    let nodes = start_nodes(5);
    let (a, b) = (client(&nodes, "").await, client(&nodes, "").await);
    let lock = name("deleted-under-a-waiter");
    let lease = Duration::from_secs(120);
    let held = a.acquire(&lock, &opts(lease)).await.unwrap();
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            b.acquire(
                &lock,
                &LockOptions::new().with_wait_timeout(Duration::from_secs(90)),
            )
            .await
        })
    };
    // Delete only once the waiter found the lock busy and joined the line (on one node): a
    // deletion before its first round would let it in at once, fix or no fix.
    let keys = common::keys(&redlock_url(&nodes, ""), &lock);
    let give_up = Instant::now() + BOUND;
    'queued: loop {
        for i in 0..5 {
            let client = redis::Client::open(nodes.node(i).url()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let queued: i64 = redis::cmd("LLEN")
                .arg(&keys.queue)
                .query_async(&mut conn)
                .await
                .unwrap();
            if queued > 0 {
                break 'queued;
            }
        }
        assert!(Instant::now() < give_up, "the waiter never joined the line");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let key = keys.lock;
    for i in 0..5 {
        let client = redis::Client::open(nodes.node(i).url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: i64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let deleted = Instant::now();
    let next = timeout(BOUND, waiter)
        .await
        .expect("the waiter took the lock within the bound, long before the old lease's end")
        .unwrap()
        .unwrap();
    assert!(
        next.fencing_token() > held.fencing_token(),
        "the waiter's token is above the deleted holder's"
    );
    eprintln!(
        "the waiter took the lock {:?} after the deletion",
        deleted.elapsed()
    );
    next.release().await.unwrap();
    drop(held);
}

/// Whether the watch mark of `name` stands on every node in `on`.
async fn watched_on(nodes: &RedisNodes, on: &[usize], name: &LockName) -> bool {
    let key = common::keys(&redlock_url(nodes, ""), name).watch;
    for &i in on {
        let client = redis::Client::open(nodes.node(i).url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mark: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        if mark.is_none() {
            return false;
        }
    }
    true
}

/// Waits (within the bound) until the holder of `name` watches it on every node.
async fn watched_everywhere(nodes: &RedisNodes, name: &LockName) {
    let give_up = Instant::now() + BOUND;
    while !watched_on(nodes, &[0, 1, 2, 3, 4], name).await {
        assert!(
            Instant::now() < give_up,
            "the holder never watched its lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn delete_on(nodes: &RedisNodes, on: &[usize], key: &str) {
    for &i in on {
        let client = redis::Client::open(nodes.node(i).url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let deleted: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deleted, 1, "node {i} had the key {key}");
    }
}

/// A holder whose keys went learns it as another client takes the lock, not at its next
/// renewal (a third of a two-minute lease here), and only once the taker holds a majority:
/// keys taken over on a minority of nodes leave it a quorum, and its guard held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_learns_of_a_takeover_on_a_majority_and_keeps_a_minority() {
    let nodes = start_nodes(5);
    let (a, b) = (client(&nodes, "").await, client(&nodes, "").await);
    let lock = name("taken-over");
    let held = a
        .acquire(&lock, &opts(Duration::from_secs(120)))
        .await
        .unwrap();
    watched_everywhere(&nodes, &lock).await;
    let key = common::keys(&redlock_url(&nodes, ""), &lock).lock;
    // Two of five: the other client takes those two and no more.
    delete_on(&nodes, &[0, 1], &key).await;
    assert!(
        b.try_acquire(&lock, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "a minority of free nodes granted the lock"
    );
    assert!(
        matches!(held.status(), LockStatus::Held { .. }),
        "a takeover of a minority lost the guard: {:?}",
        held.status()
    );
    // A third: now the other client holds a majority.
    delete_on(&nodes, &[2], &key).await;
    let next = b
        .try_acquire(&lock, &LockOptions::new())
        .await
        .unwrap()
        .expect("a majority of free nodes grants the lock");
    let taken = Instant::now();
    let reason = timeout(BOUND, held.lost())
        .await
        .expect("the holder learnt of the takeover within the bound");
    assert_eq!(reason, LostReason::TakenOver);
    eprintln!(
        "the holder learnt of the takeover {:?} after it",
        taken.elapsed()
    );
    assert!(next.fencing_token() > held.fencing_token());
    // A watched lock's release takes its marks along.
    drop(held);
    let give_up = Instant::now() + BOUND;
    while !watched_on(&nodes, &[0, 1, 2], &lock).await {
        assert!(
            Instant::now() < give_up,
            "the new holder never watched its lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    next.release().await.unwrap();
    for i in 0..3 {
        assert!(
            !watched_on(&nodes, &[i], &lock).await,
            "the release left the watch mark on node {i}"
        );
    }
}

/// A node that lost its scripts (a restart, `SCRIPT FLUSH`) answers a waiter's acquire script
/// with `NOSCRIPT`, and the `SCRIPT LOAD` and `EVALSHA` that follow go out behind a release sent
/// meanwhile: the round's late answer must delete the key it set, or the key stays until its
/// TTL (two minutes here, past the bound this waits for the nodes to be clean), and on a
/// majority it would block the name as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_on_nodes_that_lost_their_scripts_leaves_no_key_behind() {
    let nodes = start_nodes(5);
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&nodes, "").await);
    }
    let lock = name("scripts-lost");
    for _ in 0..5 {
        for i in 0..5 {
            let client = redis::Client::open(nodes.node(i).url()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let (client, lock) = (clients[i % clients.len()].clone(), lock.clone());
                tokio::spawn(async move {
                    client
                        .acquire(&lock, &opts(Duration::from_secs(120)))
                        .await
                        .unwrap()
                        .release()
                        .await
                        .unwrap();
                })
            })
            .collect();
        for task in tasks {
            timeout(BOUND, task)
                .await
                .expect("a task finished")
                .unwrap();
        }
    }
    settles_empty(&nodes, &[0, 1, 2, 3, 4], &lock).await;
}

/// A release whose connection to one node drops before that node ran it (a reset link, or
/// `CLIENT KILL`, as the killed-waiters fault does to every subscribed connection) asks that
/// node again once it is back: otherwise the key stays there until its TTL (two minutes here,
/// past the bound this waits for the nodes to be clean), and enough such keys on different
/// nodes would block the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_off_from_one_node_is_sent_again_when_it_reconnects() {
    let nodes = start_nodes(5);
    let locks = client(&nodes, "").await;
    let lock = name("release-cut-off");
    let guard = locks
        .acquire(&lock, &opts(Duration::from_secs(120)))
        .await
        .unwrap();
    let admin = redis::Client::open(nodes.node(1).url()).unwrap();
    let mut admin = timeout(BOUND, admin.get_multiplexed_async_connection())
        .await
        .expect("the node answers")
        .unwrap();
    // Node 1 holds every write it is sent, so the release reaches it and waits there.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(BOUND.as_millis() as u64)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    guard
        .release()
        .await
        .expect("the four other nodes delete the key");
    let give_up = Instant::now() + BOUND;
    loop {
        let info: String = redis::cmd("INFO")
            .arg("clients")
            .query_async(&mut admin)
            .await
            .unwrap();
        if info.contains("\nblocked_clients:1") {
            break;
        }
        assert!(Instant::now() < give_up, "the release never reached node 1");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its connection drops with the release unrun.
    let own: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut admin)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut admin)
        .await
        .unwrap();
    for id in list
        .lines()
        .filter_map(|line| line.strip_prefix("id=")?.split(' ').next())
        .filter(|id| *id != own.to_string())
    {
        let _: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .unwrap();
    settles_empty(&nodes, &[0, 1, 2, 3, 4], &lock).await;
}
