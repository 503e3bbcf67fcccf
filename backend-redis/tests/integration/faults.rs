//! Redis under faults (a frozen, dead or restarted server and a lost acquire reply are the fault
//! suite's): a partitioned client's late release, a flushed script cache, a Sentinel failover,
//! and many waiters handing one lock along; and the two mitigations of the ways a
//! Redis deployment can forget a lock (the fault suite's `faults::server_that_forgets_a_lock_is_caught`
//! shows the hazards themselves): the eviction check at connect, and `WAIT` for replicas.
//! Each test starts its own servers.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, LostReason, Renewal};
use dlock_redis::RedisLock;
use dlock_test_servers::{FaultProxy, ProxyMode, RedisCluster, RedisSentinel, RedisServer};
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(30);

fn name(s: &str) -> LockName {
    LockName::new(format!("faults/{s}")).unwrap()
}

fn short_ttl() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_wait_timeout(Duration::from_secs(20))
}

/// The lock `lock` through `locks`, tried until it is granted (errors and a busy lock are tried
/// again, as while a client follows a failover); `what` says what failed to happen by `BOUND`.
async fn taken_within_bound(
    locks: &RedisLock,
    lock: &LockName,
    what: &str,
) -> dlock_api::LockGuard {
    timeout(BOUND, async {
        loop {
            match locks.try_acquire(lock, &LockOptions::new()).await {
                Ok(Some(guard)) => break guard,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}"))
}

fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_holder_loses_the_lock_and_its_late_release_spares_the_new_holder() {
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let partitioned =
        RedisLock::connect_url(&format!("redis://{}?command_timeout=500ms", proxy.addr()))
            .await
            .unwrap();
    let direct = RedisLock::connect_url(&redis.url()).await.unwrap();
    let lock = name("partition");
    let guard = partitioned.acquire(&lock, &short_ttl()).await.unwrap();
    let stale_token = guard.fencing_token();

    proxy.set_mode(ProxyMode::Blackhole);
    let reason = timeout(BOUND, guard.lost())
        .await
        .expect("lost fires while partitioned");
    assert_eq!(reason, LostReason::RenewalFailed);
    let new_holder = direct
        .acquire(&lock, &short_ttl())
        .await
        .expect("another client acquires after the TTL");
    assert!(new_holder.fencing_token() > stale_token);

    // Drop the stuck connection so the late release really reaches the server.
    proxy.reset();
    proxy.heal();
    let late = guard.release().await;
    assert!(matches!(late, Err(LockError::Lost { .. })), "{late:?}");
    let intruder = direct
        .try_acquire(&lock, &LockOptions::new())
        .await
        .unwrap();
    assert!(
        intruder.is_none(),
        "the partitioned client's late release freed the new holder's lock"
    );
    let owner = redis.command(&["GET", &direct.keys(&lock).lock]).unwrap();
    assert!(
        owner.as_text().is_some(),
        "the new holder's key is still there"
    );
    new_holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_script_cache_is_recovered() {
    let redis = server();
    let client = RedisLock::connect_url(&redis.url()).await.unwrap();
    let lock = name("script-flush");
    client
        .acquire(&lock, &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let guard = client.acquire(&lock, &LockOptions::new()).await.unwrap();
    let flushed = redis.command(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(!flushed.is_error());
    guard
        .extend(Duration::from_secs(30))
        .await
        .expect("extend after SCRIPT FLUSH");
    guard.release().await.expect("release after SCRIPT FLUSH");
    redis.command(&["SCRIPT", "FLUSH"]).unwrap();
    client
        .acquire(&lock, &LockOptions::new())
        .await
        .expect("acquire after SCRIPT FLUSH")
        .release()
        .await
        .unwrap();
}

/// The `redis+sentinel://` URL of `sentinel`'s three Sentinels and master, with `query`.
fn sentinel_url(sentinel: &RedisSentinel, query: &str) -> String {
    let hosts: Vec<String> = sentinel
        .sentinel_addrs()
        .iter()
        .map(ToString::to_string)
        .collect();
    format!(
        "redis+sentinel://{}/{}?{query}",
        hosts.join(","),
        sentinel.master_name()
    )
}

/// Documented behaviour: the client follows the failover to the new primary. A lock the replica
/// had received survives (renewal keeps working there); one it had missed is reported lost at
/// the next renewal. Never both "held" and "taken by another client" for longer than that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed_and_a_held_lock_survives_or_is_reported_lost() {
    let sentinel = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let url = sentinel_url(&sentinel, "command_timeout=1s");
    let holder = RedisLock::connect_url(&url).await.unwrap();
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_renewal(Renewal::auto());
    let lock = name("failover");
    let guard = holder.acquire(&lock, &opts).await.unwrap();
    // Let replication carry the key over before the failover.
    sentinel.primary().command(&["WAIT", "1", "1000"]).unwrap();
    let old = sentinel.primary().addr();
    let new_primary = tokio::task::spawn_blocking(move || (sentinel.failover(), sentinel))
        .await
        .unwrap();
    let (promoted, sentinel) = new_primary;
    assert_ne!(promoted.unwrap(), old);

    // The client follows: a fresh acquire through the same client works on the new primary.
    let probe = taken_within_bound(
        &holder,
        &name("after-failover"),
        "the client reaches the new primary",
    )
    .await;
    probe.release().await.unwrap();

    // Within one more lease (3 renewals) the lock is either reported lost, or it was renewed on
    // the new primary and survived.
    let lost = timeout(Duration::from_secs(3), guard.lost()).await;
    let other = RedisLock::connect_url(&url).await.unwrap();
    match lost {
        Err(_still_held) => {
            assert!(
                guard.is_held(),
                "no loss was reported, yet the guard is not held"
            );
            assert!(
                other
                    .try_acquire(&lock, &LockOptions::new())
                    .await
                    .unwrap()
                    .is_none(),
                "held by two clients"
            );
            guard.release().await.expect("release on the new primary");
        }
        Ok(reason) => assert!(
            matches!(reason, LostReason::TakenOver | LostReason::RenewalFailed),
            "{reason:?}"
        ),
    }
    drop(sentinel);
}

/// A waiter whose connection is reset while one of its requests is in flight (its reply held
/// back by a proxy, then the connection closed under it, as a proxy restart or `CLIENT KILL`
/// mid-request would) goes on waiting on a new connection and takes the lock when the holder
/// releases: only a server that stays unreachable ends a wait early (the contract's bounded
/// waiting). Before, the failed request ended the wait with `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_connection_resets_mid_request_keeps_waiting() {
    let redis = server();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let waiter = RedisLock::connect_url(&format!("redis://{}", proxy.addr()))
        .await
        .unwrap();
    let holder = RedisLock::connect_url(&redis.url()).await.unwrap();
    let lock = name("reset-mid-request");
    let held = holder.acquire(&lock, &short_ttl()).await.unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move {
            waiter
                .acquire(&lock, &LockOptions::new().with_wait_timeout(BOUND))
                .await
        })
    };
    dlock_conformance::wait_for::within(BOUND, "the waiter to queue", async {
        while holder.inspect(&lock).await.unwrap().waiters != Some(1) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    proxy.set_mode(ProxyMode::HoldReplies);
    // The waiter asks again at the latest when its presence in the queue needs refreshing.
    dlock_conformance::wait_for::within(BOUND, "a request of the waiter in flight", async {
        while proxy.held_bytes() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    proxy.reset();
    proxy.heal();
    held.release().await.unwrap();
    let taken = timeout(BOUND, waiting)
        .await
        .expect("the waiter is still waiting")
        .unwrap();
    let guard = taken.expect("the waiter takes the lock after its connection was reset");
    guard.release().await.unwrap();
}

/// A waiter whose connection is reset under its *first* attempt (the reply held back, then the
/// connection closed, as a `CLIENT KILL` of a busy server's clients would) is still a waiter:
/// it asks again on a new connection and takes the lock, or a permit, when a holder lets go.
/// Before, the first attempt's error ended the acquire with `Unavailable: broken pipe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_first_attempt_is_reset_keeps_waiting() {
    let redis = server();
    for permits in [1, 2] {
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let waiter = RedisLock::connect_url(&format!("redis://{}", proxy.addr()))
            .await
            .unwrap();
        let holder = RedisLock::connect_url(&redis.url()).await.unwrap();
        let lock = name(&format!("reset-first-attempt-{permits}"));
        let mut held = Vec::new();
        for _ in 0..permits {
            held.push(
                holder
                    .acquire_permit(&lock, permits, &short_ttl())
                    .await
                    .unwrap(),
            );
        }
        proxy.set_mode(ProxyMode::HoldReplies);
        let waiting = {
            let lock = lock.clone();
            tokio::spawn(async move {
                let wait = LockOptions::new().with_wait_timeout(BOUND);
                waiter.acquire_permit(&lock, permits, &wait).await
            })
        };
        dlock_conformance::wait_for::within(BOUND, "the first attempt in flight", async {
            while proxy.held_bytes() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        proxy.reset();
        proxy.heal();
        held.pop().unwrap().release().await.unwrap();
        let taken = timeout(BOUND, waiting)
            .await
            .expect("the waiter is still waiting")
            .unwrap();
        let permit = taken.unwrap_or_else(|e| {
            panic!(
                "{permits} permit(s): the waiter gave up after its first attempt was reset: {e:?}"
            )
        });
        permit.release().await.unwrap();
        for rest in held {
            rest.release().await.unwrap();
        }
    }
}

/// A failover in the middle of a partition: a client reaching a Sentinel deployment through
/// proxies of its own (every Sentinel, the primary and the replica, announced addresses mapped
/// with `nat_map`) holds a lock that has reached the replica, and is cut off; the Sentinels
/// promote the replica meanwhile. The cut-off holder must learn its lock is lost, another client
/// must take it on the new primary with a higher token once the lease ends there, and when the
/// link heals, the old holder's late release must not free the new holder's lock; its client
/// then follows to the new primary like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_during_a_partition_leaves_one_holder() {
    let sentinel = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let data = [sentinel.primary().addr(), sentinel.replica().addr()];
    let members: Vec<std::net::SocketAddr> =
        sentinel.sentinel_addrs().into_iter().chain(data).collect();
    let proxies: Vec<FaultProxy> = members
        .iter()
        .map(|&member| FaultProxy::start(member).unwrap())
        .collect();
    let (sentinel_proxies, data_proxies) = proxies.split_at(members.len() - data.len());
    let nat_map: Vec<String> = data
        .iter()
        .zip(data_proxies)
        .map(|(node, proxy)| format!("{node}={}", proxy.addr()))
        .collect();
    let proxied_url = format!(
        "redis+sentinel://{}/{}?command_timeout=1s&nat_map={}",
        sentinel_proxies
            .iter()
            .map(|p| p.addr().to_string())
            .collect::<Vec<_>>()
            .join(","),
        sentinel.master_name(),
        nat_map.join(",")
    );
    let cut_off = RedisLock::connect_url(&proxied_url).await.unwrap();
    let direct = RedisLock::connect_url(&sentinel_url(&sentinel, "command_timeout=1s"))
        .await
        .unwrap();
    let lock = name("failover-in-partition");
    let guard = cut_off.acquire(&lock, &short_ttl()).await.unwrap();
    let stale_token = guard.fencing_token();
    sentinel.primary().command(&["WAIT", "1", "1000"]).unwrap();
    assert!(
        data_proxies[0].connections() > 0,
        "the proxied client does not reach the primary through its proxy"
    );

    for proxy in &proxies {
        proxy.set_mode(ProxyMode::Blackhole);
    }
    let old = sentinel.primary().addr();
    let (promoted, sentinel) = tokio::task::spawn_blocking(move || (sentinel.failover(), sentinel))
        .await
        .unwrap();
    assert_ne!(promoted.unwrap(), old);
    let reason = timeout(BOUND, guard.lost())
        .await
        .expect("the cut-off holder learns its lock is lost");
    assert_eq!(reason, LostReason::RenewalFailed);
    let new_holder = timeout(BOUND, direct.acquire(&lock, &short_ttl()))
        .await
        .expect("another client takes the lock on the new primary")
        .unwrap();
    assert!(new_holder.fencing_token() > stale_token);

    for proxy in &proxies {
        proxy.reset();
        proxy.heal();
    }
    let late = guard.release().await;
    assert!(matches!(late, Err(LockError::Lost { .. })), "{late:?}");
    assert!(
        direct
            .try_acquire(&lock, &LockOptions::new())
            .await
            .unwrap()
            .is_none(),
        "the cut-off holder's late release freed the new holder's lock"
    );
    new_holder.release().await.unwrap();
    let followed = taken_within_bound(
        &cut_off,
        &lock,
        "the healed client follows to the new primary",
    )
    .await;
    assert!(followed.fencing_token() > stale_token);
    followed.release().await.unwrap();
    drop(sentinel);
}

/// The eviction check follows a Sentinel failover: a replica set up to evict lock keys is not
/// taken as the new primary with `eviction_check=refuse` (the client fails rather than lock
/// there) until its policy is fixed, and is taken, with a warning, with `warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_primary_that_may_evict_locks_is_refused_after_a_failover() {
    let sentinel = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    let url = |check: &str| {
        sentinel_url(
            &sentinel,
            &format!("command_timeout=1s&eviction_check={check}"),
        )
    };
    let refusing = RedisLock::connect_url(&url("refuse"))
        .await
        .expect("the first primary cannot evict");
    let warning = RedisLock::connect_url(&url("warn")).await.unwrap();
    for (key, value) in [("maxmemory", "64mb"), ("maxmemory-policy", "volatile-lru")] {
        sentinel
            .replica()
            .command(&["CONFIG", "SET", key, value])
            .unwrap();
    }
    // Killed, not demoted: the refusing client has nowhere left to lock but the new primary.
    let sentinel = tokio::task::spawn_blocking(move || {
        sentinel.kill_primary().unwrap_or_else(|e| panic!("{e}"));
        sentinel
    })
    .await
    .unwrap();

    let lock = name("evicting-primary");
    let taken = taken_within_bound(
        &warning,
        &lock,
        "with eviction_check=warn the client follows to the new primary",
    )
    .await;
    taken.release().await.unwrap();
    for _ in 0..3 {
        match refusing.try_acquire(&lock, &LockOptions::new()).await {
            Err(_) => {}
            Ok(taken) => panic!("locked on a primary that may evict: {taken:?}"),
        }
    }
    // Once the new primary cannot evict, the refusing client takes it too.
    sentinel
        .replica()
        .command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .unwrap();
    taken_within_bound(
        &refusing,
        &lock,
        "the new primary, fixed, is judged again and taken",
    )
    .await
    .release()
    .await
    .unwrap();
    drop(sentinel);
}

/// A server that may evict lock keys is refused with `eviction_check=refuse`, warned about by
/// default, and not asked with `off`; a server that cannot evict passes every setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_may_evict_locks_is_refused_or_warned_about_at_connect() {
    let redis = server();
    let connect = |query: &str| {
        let url = format!("{}?{query}", redis.url());
        async move { RedisLock::connect_url(&url).await }
    };
    connect("eviction_check=refuse")
        .await
        .expect("noeviction (the default policy) passes");
    for (key, value) in [("maxmemory", "64mb"), ("maxmemory-policy", "volatile-lru")] {
        redis.command(&["CONFIG", "SET", key, value]).unwrap();
    }
    match connect("eviction_check=refuse").await {
        Err(LockError::Config { reason, .. }) => {
            assert!(reason.contains("maxmemory-policy volatile-lru"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    connect("eviction_check=warn")
        .await
        .expect("warn connects (and logs)");
    connect("eviction_check=off").await.expect("off connects");
    RedisLock::connect_url(&redis.url())
        .await
        .expect("the default warns and connects");
}

/// With `wait_replicas=1`, an acquire that its replica did not acknowledge fails (and leaves no
/// key on the primary), so a failover cannot hand the lock out twice the way
/// `faults::server_that_forgets_a_lock_is_caught` shows it can without; with the replication
/// link healthy, the same client acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_replicas_refuses_a_lock_the_replica_did_not_get() {
    use dlock_conformance::Amnesia;
    let deployment = common::amnesia::FailoverWithoutTheGrant::start()
        .await
        .unwrap();
    let url = deployment.harness().child_env().unwrap()[0].1.clone();
    let waiting = RedisLock::connect_url(&format!(
        "{url}?wait_replicas=1&wait_replicas_timeout=300ms"
    ))
    .await
    .unwrap();
    let healthy = waiting
        .acquire(&name("wait-healthy"), &short_ttl())
        .await
        .expect("the replica acknowledges while the link is up");
    healthy.release().await.unwrap();

    deployment.arm().await.unwrap();
    let lock = name("wait-cut");
    match waiting.acquire(&lock, &short_ttl()).await {
        Err(LockError::Unavailable { .. }) => {}
        other => panic!("expected Unavailable with the replication link cut, got {other:?}"),
    }
    let plain = RedisLock::connect_url(&url).await.unwrap();
    let key = plain.keys(&lock).lock;
    let freed = timeout(BOUND, async {
        loop {
            if let Some(guard) = plain.try_acquire(&lock, &LockOptions::new()).await.unwrap() {
                break guard;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the unacknowledged lock {key} was never released"));
    freed.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_take_turns_with_none_stranded() {
    let redis = server();
    let lock = name("handoff");
    // A lease far longer than the test: only release messages can hand the lock on.
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(120))
        .with_wait_timeout(BOUND);
    let inside = Arc::new(AtomicUsize::new(0));
    let turns = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = RedisLock::connect_url(&redis.url()).await.unwrap();
        let (lock, opts, inside, turns) =
            (lock.clone(), opts.clone(), inside.clone(), turns.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = client
                    .acquire(&lock, &opts)
                    .await
                    .expect("no waiter is stranded");
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                turns.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        timeout(BOUND * 2, task)
            .await
            .expect("all waiters finish")
            .unwrap();
    }
    assert_eq!(turns.load(Ordering::SeqCst), 40);
}

/// Waiters are served in the order they queued: each release grants the lock to the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_the_lock_in_queue_order() {
    let redis = server();
    let lock = name("fifo");
    let holder = RedisLock::connect_url(&redis.url()).await.unwrap();
    let queue_key = holder.keys(&lock).queue;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(60))
        .with_wait_timeout(BOUND);
    let first = holder.acquire(&lock, &opts).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5usize {
        let client = RedisLock::connect_url(&redis.url()).await.unwrap();
        let (lock, opts, order) = (lock.clone(), opts.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = client.acquire(&lock, &opts).await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Wait until this waiter is in the queue before starting the next one.
        timeout(BOUND, async {
            loop {
                let len = redis.command(&["LLEN", &queue_key]).unwrap();
                if len.as_text().and_then(|t| t.parse::<usize>().ok()) == Some(i + 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the waiter joins the queue");
    }
    first.release().await.unwrap();
    for waiter in waiters {
        timeout(BOUND, waiter)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
}

/// An acquire whose reply never came, because the server stalled (SIGSTOP) past the command
/// timeout and past the cleanup's first cancel: the server runs the script when it wakes, and the
/// cleanup, retried until the server answers, frees what it took. Another client gets the lock
/// long before its 60 s lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_was_lost_to_a_stalled_server_leaves_nothing() {
    let redis = server();
    let stalled = RedisLock::connect_url(&format!("{}?command_timeout=300ms", redis.url()))
        .await
        .unwrap();
    let other = RedisLock::connect_url(&redis.url()).await.unwrap();
    for round in 0..3 {
        let lock = name(&format!("lost-reply-{round}"));
        redis.pause();
        let long = LockOptions::new().with_ttl(Duration::from_secs(60));
        let failed = stalled.try_acquire(&lock, &long).await;
        assert!(
            matches!(failed, Err(LockError::Unavailable { .. })),
            "{failed:?}"
        );
        // Past the first cancel's timeout too.
        tokio::time::sleep(Duration::from_secs(1)).await;
        redis.resume();
        let free = timeout(Duration::from_secs(20), async {
            loop {
                if let Some(guard) = other.try_acquire(&lock, &LockOptions::new()).await.unwrap() {
                    return guard;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("round {round}: the lock the late script took was left held"));
        free.release().await.unwrap();
    }
}

/// A Cluster is judged by every primary: one that may evict keys makes `eviction_check=refuse`
/// refuse the whole cluster, at every connect (the driver used to ask one node of its choice).
/// And a plain `redis://` URL naming one member is refused: it would get `MOVED` for the names
/// other members serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_checked_on_every_primary_and_one_member_is_not_a_server() {
    let cluster =
        tokio::task::block_in_place(RedisCluster::start).unwrap_or_else(|e| panic!("{e}"));
    let member = RedisLock::connect_url(&cluster.node(0).url()).await;
    assert!(
        matches!(&member, Err(LockError::Config { reason, .. }) if reason.contains("redis+cluster://")),
        "{member:?}"
    );
    let evicting = cluster.node(cluster.primaries() - 1);
    evicting
        .command(&["CONFIG", "SET", "maxmemory", "100mb"])
        .unwrap();
    evicting
        .command(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"])
        .unwrap();
    let seeds: Vec<String> = cluster.addrs().iter().map(ToString::to_string).collect();
    let url = format!("redis+cluster://{}?eviction_check=refuse", seeds.join(","));
    for _ in 0..3 {
        let refused = RedisLock::connect_url(&url).await;
        assert!(
            matches!(&refused, Err(LockError::Config { reason, .. }) if reason.contains("may evict")),
            "{refused:?}"
        );
    }
}

/// A Sentinel that does not monitor the master (one just replaced, say) is passed over for the
/// next, as Redisson and Jedis do, instead of ending the connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_does_not_know_the_master_is_passed_over() {
    let sentinel = RedisSentinel::start().unwrap_or_else(|e| panic!("{e}"));
    sentinel
        .sentinel(0)
        .command(&["SENTINEL", "REMOVE", sentinel.master_name()])
        .unwrap();
    let url = sentinel_url(&sentinel, "");
    let locks = RedisLock::connect_url(&url)
        .await
        .unwrap_or_else(|e| panic!("the other Sentinels were not asked: {e}"));
    let guard = locks
        .acquire(&name("unknowing-sentinel"), &LockOptions::new())
        .await
        .unwrap();
    guard.release().await.unwrap();
}
