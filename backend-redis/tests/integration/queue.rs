//! The grant queue against a real Redis, where a lock is free but waiters are queued (its holder's
//! lease ran out rather than being released): a new acquire does not jump a live waiter, and
//! waiters whose presence lapsed are dropped so that they cannot keep the lock from anyone; and a
//! lock taken with nobody queued, whose release starts with the script without the hand-off, still
//! goes to a waiter that queued while it was held, and is freed if that waiter's presence lapsed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_redis::RedisLock;

fn url() -> String {
    std::env::var("DLOCK_TEST_REDIS_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_redis().url())
}

/// What the acquire script does when a waiter joins the queue: adds it to the waiters and the
/// queue, and marks the fence (waiters may be queued) and a held lock (somebody queued since it
/// was taken). KEYS: lock, fence, queue, waiters. ARGV: owner, entry.
const JOIN_QUEUE: &str = r"
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('RPUSH', KEYS[3], ARGV[1])
local fence = redis.call('GET', KEYS[2]) or '0'
if string.sub(fence, -1) ~= '+' then redis.call('SET', KEYS[2], fence .. '+') end
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, -1) ~= '+' then redis.call('APPEND', KEYS[1], '+') end
";

/// Queues `owner` as a waiter of `keys`' lock by hand, present until `deadline_ms` (Unix ms), as
/// a waiting client's script would.
async fn queue_waiter(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &dlock_redis::LockKeys,
    owner: &str,
    deadline_ms: u128,
) {
    let _: () = redis::Script::new(JOIN_QUEUE)
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.waiters)
        .arg(owner)
        .arg(format!("{deadline_ms}:30000"))
        .invoke_async(conn)
        .await
        .unwrap();
}

/// A client, a bare connection to the same server, and a name of this test process under `prefix`.
async fn setup(
    prefix: &str,
) -> (
    RedisLock,
    redis::aio::MultiplexedConnection,
    LockName,
    dlock_redis::LockKeys,
) {
    let lock = RedisLock::connect_url(&url()).await.unwrap();
    let client = redis::Client::open(url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let name = LockName::new(format!("{prefix}/{}", std::process::id())).unwrap();
    let keys = lock.keys(&name);
    (lock, conn, name, keys)
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[tokio::test]
async fn free_lock_goes_to_a_live_waiter_first_and_lapsed_waiters_are_dropped() {
    let (lock, mut conn, name, keys) = setup("dlock-test/queue").await;
    let now_ms = unix_ms();
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));

    // A live waiter is first in line and nobody holds the lock.
    queue_waiter(&mut conn, &keys, "live-waiter", now_ms + 60_000).await;
    assert!(
        lock.try_acquire(&name, &options).await.unwrap().is_none(),
        "a try_acquire jumped a live waiter"
    );

    // Its presence lapses: the next acquire drops it and takes the lock.
    let _: i64 = redis::cmd("HSET")
        .arg(&keys.waiters)
        .arg("live-waiter")
        .arg("1:30000")
        .query_async(&mut conn)
        .await
        .unwrap();
    let guard = lock
        .try_acquire(&name, &options)
        .await
        .unwrap()
        .expect("a lapsed waiter kept the free lock from a new acquire");
    let queued: i64 = redis::cmd("LLEN")
        .arg(&keys.queue)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, 0, "the lapsed waiter is still queued");
    guard.release().await.unwrap();
}

/// Takes a lock with nobody queued (so that its release starts with the script without the
/// hand-off), queues a waiter by hand, present until `deadline_ms`, and releases. Returns who
/// holds the lock after the release and the fencing token before and after it, having deleted
/// the name's keys.
async fn release_with_a_waiter_queued_meanwhile(
    prefix: &str,
    deadline_ms: u128,
) -> (Option<String>, u64, u64) {
    let (lock, mut conn, name, keys) = setup(prefix).await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let guard = lock
        .try_acquire(&name, &options)
        .await
        .unwrap()
        .expect("the lock is free");
    queue_waiter(&mut conn, &keys, "queued-waiter", deadline_ms).await;
    let before = guard.fencing_token().get();
    guard.release().await.unwrap();
    let (holder, after): (Option<String>, u64) = redis::pipe()
        .cmd("GET")
        .arg(&keys.lock)
        .cmd("GET")
        .arg(&keys.fence)
        .cmd("DEL")
        .arg(&keys.lock)
        .arg(&keys.fence)
        .arg(&keys.queue)
        .arg(&keys.waiters)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    (holder, before, after)
}

#[tokio::test]
async fn a_lock_taken_uncontended_is_handed_to_a_waiter_that_queued_while_it_was_held() {
    let (holder, before, after) =
        release_with_a_waiter_queued_meanwhile("dlock-test/queue-handoff", unix_ms() + 60_000)
            .await;
    assert_eq!(
        holder.as_deref(),
        Some("queued-waiter"),
        "the release did not hand the lock to the waiter that queued while it was held"
    );
    assert!(after > before, "the hand-off took no new fencing token");
}

#[tokio::test]
async fn a_lock_taken_uncontended_is_freed_when_the_waiter_that_queued_has_lapsed() {
    let (holder, before, after) =
        release_with_a_waiter_queued_meanwhile("dlock-test/queue-lapsed", 1).await;
    assert_eq!(
        holder, None,
        "the lock went to a waiter whose presence lapsed"
    );
    assert_eq!(after, before, "a lapsed waiter was given a fencing token");
}

/// The name's fence value as stored, its queue mark included.
async fn stored_fence(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &dlock_redis::LockKeys,
) -> String {
    redis::cmd("GET")
        .arg(&keys.fence)
        .query_async::<Option<String>>(conn)
        .await
        .unwrap()
        .unwrap_or_default()
}

/// Waits (at most 10 s) until `lock` counts `waiters` live waiters on `name`.
async fn until_waiters(lock: &RedisLock, name: &LockName, waiters: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock.inspect(name).await.unwrap().waiters != Some(waiters) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiters} waiter(s) never showed on {name}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn an_acquire_does_not_jump_a_waiter_queued_by_a_real_client_when_the_holder_vanished() {
    let (lock, mut conn, name, keys) = setup("dlock-test/queue-vanished").await;
    let options = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait_timeout(Duration::from_secs(20));
    let holder = lock.try_acquire(&name, &options).await.unwrap().unwrap();
    let waiter = {
        let (lock, name, options) = (
            RedisLock::connect_url(&url()).await.unwrap(),
            name.clone(),
            options.clone(),
        );
        tokio::spawn(async move { lock.acquire(&name, &options).await })
    };
    until_waiters(&lock, &name, 1).await;
    // The holder's lease runs out (its key goes) while the waiter is queued: the first attempt
    // of a newcomer finds the lock free, but the queued waiter goes first.
    let _: () = redis::cmd("DEL")
        .arg(&keys.lock)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        lock.try_acquire(&name, &options).await.unwrap().is_none(),
        "a try_acquire jumped a waiter queued while the lock was held"
    );
    let granted = waiter
        .await
        .unwrap()
        .expect("the queued waiter got the lock");
    assert!(granted.fencing_token() > holder.fencing_token());
    assert!(
        holder.release().await.is_err(),
        "the vanished holder still held"
    );
    let granted_token = granted.fencing_token();
    granted.release().await.unwrap();
    // Nobody is queued any more: the queue mark is off, and the next first attempt takes the
    // lock at once, with a higher token.
    assert!(!stored_fence(&mut conn, &keys).await.ends_with('+'));
    let next = lock.try_acquire(&name, &options).await.unwrap().unwrap();
    assert!(next.fencing_token() > granted_token);
    next.release().await.unwrap();
}

#[tokio::test]
async fn a_queue_mark_left_by_a_waiter_that_gave_up_costs_the_next_acquire_nothing_but_a_round_trip()
 {
    let (lock, mut conn, name, keys) = setup("dlock-test/queue-gave-up").await;
    let options = LockOptions::new().with_ttl(Duration::from_secs(30));
    let holder = lock.try_acquire(&name, &options).await.unwrap().unwrap();
    // A waiter queues while the lock is held, and gives up.
    let impatient = options
        .clone()
        .with_wait_timeout(Duration::from_millis(200));
    let other = RedisLock::connect_url(&url()).await.unwrap();
    assert!(other.acquire(&name, &impatient).await.is_err());
    until_waiters(&lock, &name, 0).await;
    assert!(
        stored_fence(&mut conn, &keys).await.ends_with('+'),
        "the waiter did not mark the fence when it queued"
    );
    // The holder took the lock with nobody queued; its release finds the waiter's mark, goes the
    // full way, and frees the lock (nobody left to hand it to).
    let first_token = holder.fencing_token();
    holder.release().await.unwrap();
    assert!(!lock.inspect(&name).await.unwrap().held);
    // The next acquire finds the stale mark, lets the full acquire decide, takes the lock, and
    // takes the mark off.
    let next = other
        .try_acquire(&name, &options)
        .await
        .unwrap()
        .expect("the lock is free");
    assert!(next.fencing_token() > first_token);
    assert!(!stored_fence(&mut conn, &keys).await.ends_with('+'));
    let next_token = next.fencing_token();
    next.release().await.unwrap();
    let last = lock.try_acquire(&name, &options).await.unwrap().unwrap();
    assert!(last.fencing_token() > next_token);
    last.release().await.unwrap();
}
