//! The per-node primitives (`dlock_redis::node`) against a real Redis: owner-checked unlock,
//! extend and fence raise, fencing tokens that rise, a fence raised to a quorum's highest token,
//! and release announcements on the name's channel.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::LockName;
use dlock_redis::node::{Counting, Node, NodeAttempt, NodeEvent, fence_floor};
use dlock_redis::{LockKeys, RedisConfig};

const TIMEOUT: Duration = Duration::from_secs(2);
const BOUND: Duration = Duration::from_secs(30);

fn url() -> String {
    std::env::var("DLOCK_TEST_REDIS_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_redis().url())
}

fn busy(attempt: NodeAttempt) -> (String, Option<Duration>) {
    match attempt {
        NodeAttempt::Busy { holder, pttl } => (holder, pttl),
        taken => panic!("expected the lock to be busy, got {taken:?}"),
    }
}

fn token(attempt: NodeAttempt) -> u64 {
    match attempt {
        NodeAttempt::Taken { token } => token,
        busy => panic!("expected the lock to be taken, got {busy:?}"),
    }
}

/// A node on the test server and the keys of a name of this process, `dlock-test/WHAT/PID`.
async fn node_and_keys(what: &str) -> (Node, LockKeys) {
    let node = Node::connect(RedisConfig::from_url(&url()).unwrap())
        .await
        .unwrap();
    let name = LockName::new(format!("dlock-test/{what}/{}", std::process::id())).unwrap();
    let keys = node.keys(&name);
    (node, keys)
}

#[tokio::test]
async fn node_primitives_are_owner_checked_and_fenced() {
    let (node, keys) = node_and_keys("node").await;
    let ttl = Duration::from_secs(10);

    let first = token(
        node.try_lock(&keys, "a", ttl, fence_floor(), TIMEOUT, Counting::OnGrant)
            .await
            .unwrap(),
    );
    let (holder, pttl) = busy(
        node.try_lock(&keys, "b", ttl, fence_floor(), TIMEOUT, Counting::OnGrant)
            .await
            .unwrap(),
    );
    assert_eq!(holder, "a");
    assert!(pttl.is_some_and(|p| p <= ttl), "{pttl:?}");
    assert!(
        !node.unlock(&keys, "b", TIMEOUT).await.unwrap(),
        "b does not hold it"
    );
    assert!(!node.extend(&keys, "b", ttl, TIMEOUT).await.unwrap());
    assert!(node.extend(&keys, "a", ttl, TIMEOUT).await.unwrap());
    // Only the holder raises the fence this way.
    assert!(
        !node
            .raise_fence_if_held(&keys, "b", first + 1_000, TIMEOUT)
            .await
            .unwrap()
    );
    assert!(
        node.raise_fence_if_held(&keys, "a", first + 10, TIMEOUT)
            .await
            .unwrap()
    );
    assert!(node.unlock(&keys, "a", TIMEOUT).await.unwrap());
    assert!(
        !node.unlock(&keys, "a", TIMEOUT).await.unwrap(),
        "already gone"
    );
    let second = token(
        node.try_lock(&keys, "b", ttl, fence_floor(), TIMEOUT, Counting::OnGrant)
            .await
            .unwrap(),
    );
    assert_eq!(
        second,
        first + 11,
        "the counter went on from the raised value"
    );
    assert!(node.unlock(&keys, "b", TIMEOUT).await.unwrap());

    // Raised past any token the node handed out, the next token is above it.
    let raised = node
        .raise_fence(&keys, second + 1_000_000_000, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(raised, second + 1_000_000_000);
    assert_eq!(
        node.raise_fence(&keys, second, TIMEOUT).await.unwrap(),
        raised
    );
    let third = token(
        node.try_lock(&keys, "c", ttl, fence_floor(), TIMEOUT, Counting::OnGrant)
            .await
            .unwrap(),
    );
    assert!(third > raised, "{third} after raising to {raised}");
    assert!(node.unlock(&keys, "c", TIMEOUT).await.unwrap());
}

/// The pipelined acquire answers as the script does, and shares its counter: a busy attempt
/// advances it, and a grant after any mix of the two still draws a higher token.
#[tokio::test]
async fn pipelined_acquire_answers_as_the_script_and_keeps_tokens_rising() {
    let (node, keys) = node_and_keys("node-pipelined").await;
    let ttl = Duration::from_secs(10);

    let first = token(
        node.try_lock(
            &keys,
            "a",
            ttl,
            fence_floor(),
            TIMEOUT,
            Counting::EveryAttempt,
        )
        .await
        .unwrap(),
    );
    let (holder, pttl) = busy(
        node.try_lock(
            &keys,
            "b",
            ttl,
            fence_floor(),
            TIMEOUT,
            Counting::EveryAttempt,
        )
        .await
        .unwrap(),
    );
    assert_eq!(holder, "a");
    assert!(pttl.is_some_and(|p| p <= ttl), "{pttl:?}");
    assert!(node.unlock(&keys, "a", TIMEOUT).await.unwrap());
    // The busy attempt used one value of the counter: the next grant goes past it.
    let second = token(
        node.try_lock(&keys, "b", ttl, fence_floor(), TIMEOUT, Counting::OnGrant)
            .await
            .unwrap(),
    );
    assert_eq!(second, first + 2);
    assert!(node.unlock(&keys, "b", TIMEOUT).await.unwrap());
    let third = token(
        node.try_lock(
            &keys,
            "c",
            ttl,
            fence_floor(),
            TIMEOUT,
            Counting::EveryAttempt,
        )
        .await
        .unwrap(),
    );
    assert_eq!(third, second + 1);

    // A key without a TTL (not dlock's) is busy with no lease to wait out.
    assert!(node.unlock(&keys, "c", TIMEOUT).await.unwrap());
    let mut plain = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(&keys.lock)
        .arg("someone")
        .query_async(&mut plain)
        .await
        .unwrap();
    let seen = busy(
        node.try_lock(
            &keys,
            "d",
            ttl,
            fence_floor(),
            TIMEOUT,
            Counting::EveryAttempt,
        )
        .await
        .unwrap(),
    );
    assert_eq!(seen, ("someone".to_owned(), None));
    let _: () = redis::cmd("DEL")
        .arg(&keys.lock)
        .query_async(&mut plain)
        .await
        .unwrap();
}

#[tokio::test]
async fn release_is_announced_to_subscribers() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let seen = Arc::new(Mutex::new(tx));
    let node = Node::connect_with_events(
        RedisConfig::from_url(&url()).unwrap(),
        Arc::new(move |event| {
            if let NodeEvent::Message { channel, payload } = event {
                let _ = seen
                    .lock()
                    .unwrap()
                    .send((channel.to_owned(), payload.to_owned()));
            }
        }),
    )
    .await
    .unwrap();
    let name = LockName::new(format!("dlock-test/node-announce/{}", std::process::id())).unwrap();
    let keys = node.keys(&name);
    node.subscribe(&keys.channel, TIMEOUT).await.unwrap();
    token(
        node.try_lock(
            &keys,
            "a",
            Duration::from_secs(10),
            fence_floor(),
            TIMEOUT,
            Counting::OnGrant,
        )
        .await
        .unwrap(),
    );
    // A silent unlock of someone else's lock says nothing; the owner's release announces.
    assert!(!node.release(&keys, "b", TIMEOUT).await.unwrap());
    assert!(node.release(&keys, "a", TIMEOUT).await.unwrap());
    let (channel, payload) = tokio::time::timeout(BOUND, rx.recv())
        .await
        .expect("the announcement arrives")
        .unwrap();
    assert_eq!(
        (channel.as_str(), payload.as_str()),
        (keys.channel.as_str(), "released")
    );
    node.unsubscribe(&keys.channel, TIMEOUT).await.unwrap();
}

/// A holder that watches its lock hears who took it over after its key went, whether the taker
/// came by the pipelined first attempt or by the script; a release takes the mark along; and
/// the untimed first attempt answers busy without the holder's remaining lease.
#[tokio::test]
async fn a_watched_holder_hears_of_the_takeover_of_its_vanished_key() {
    let (lost_tx, mut lost) = tokio::sync::mpsc::unbounded_channel::<String>();
    let node = Node::connect_with_events(
        RedisConfig::from_url(&url()).unwrap(),
        Arc::new(move |event| {
            if let NodeEvent::HolderLost { owner } = event {
                let _ = lost_tx.send(owner.to_owned());
            }
        }),
    )
    .await
    .unwrap();
    let name = LockName::new(format!("dlock-test/node-watch/{}", std::process::id())).unwrap();
    let keys = node.keys(&name);
    let ttl = Duration::from_secs(10);
    let client = "c0ffee";
    node.subscribe(&node.held_by_channel(client), TIMEOUT)
        .await
        .unwrap();
    let mut plain = redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    for counting in [Counting::EveryAttemptUntimed, Counting::OnGrant] {
        token(
            node.try_lock(
                &keys,
                "a1",
                ttl,
                fence_floor(),
                TIMEOUT,
                Counting::EveryAttemptUntimed,
            )
            .await
            .unwrap(),
        );
        assert_eq!(
            busy(
                node.try_lock(
                    &keys,
                    "b1",
                    ttl,
                    fence_floor(),
                    TIMEOUT,
                    Counting::EveryAttemptUntimed
                )
                .await
                .unwrap()
            ),
            ("a1".to_owned(), None)
        );
        assert!(node.watch_held(&keys, "a1", client, TIMEOUT).await.unwrap());
        let _: i64 = redis::cmd("DEL")
            .arg(&keys.lock)
            .query_async(&mut plain)
            .await
            .unwrap();
        token(
            node.try_lock(&keys, "b1", ttl, fence_floor(), TIMEOUT, counting)
                .await
                .unwrap(),
        );
        let told = tokio::time::timeout(BOUND, lost.recv())
            .await
            .expect("the watching holder was told within the bound");
        assert_eq!(told.as_deref(), Some("a1"), "{counting:?}");
        assert!(
            !node.watch_held(&keys, "a1", client, TIMEOUT).await.unwrap(),
            "the old holder's mark took again"
        );
        // The new holder watches, and its release takes the mark along.
        assert!(node.watch_held(&keys, "b1", client, TIMEOUT).await.unwrap());
        assert!(node.release(&keys, "b1", TIMEOUT).await.unwrap());
        let marked: i64 = redis::cmd("EXISTS")
            .arg(&keys.watch)
            .query_async(&mut plain)
            .await
            .unwrap();
        assert_eq!(marked, 0, "the release left the watch mark");
    }
}
