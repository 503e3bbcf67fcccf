//! The per-node primitives (`dlock_redis::node`) against a real Redis: owner-checked unlock and
//! extend, fencing tokens that rise, and a fence raised to a quorum's highest token.

use std::time::Duration;

use dlock_api::LockName;
use dlock_redis::RedisConfig;
use dlock_redis::node::Node;

const TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test]
async fn node_primitives_are_owner_checked_and_fenced() {
    let url = std::env::var("DLOCK_TEST_REDIS_URL")
        .unwrap_or_else(|_| dlock_test_servers::shared_redis().url());
    let node = Node::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let name = LockName::new(format!("dlock-test/node/{}", std::process::id())).unwrap();
    let keys = node.keys(&name);
    let ttl = Duration::from_secs(10);

    let first = node.try_lock(&keys, "a", ttl, TIMEOUT).await.unwrap();
    let first = first.expect("a free lock is taken");
    assert_eq!(node.try_lock(&keys, "b", ttl, TIMEOUT).await.unwrap(), None);
    assert!(
        !node.unlock(&keys, "b", TIMEOUT).await.unwrap(),
        "b does not hold it"
    );
    assert!(!node.extend(&keys, "b", ttl, TIMEOUT).await.unwrap());
    assert!(node.extend(&keys, "a", ttl, TIMEOUT).await.unwrap());
    assert!(node.unlock(&keys, "a", TIMEOUT).await.unwrap());
    assert!(
        !node.unlock(&keys, "a", TIMEOUT).await.unwrap(),
        "already gone"
    );

    // Raised past any token the node handed out, the next token is above it.
    let raised = node
        .raise_fence(&keys, first + 1_000_000_000, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(raised, first + 1_000_000_000);
    assert_eq!(
        node.raise_fence(&keys, first, TIMEOUT).await.unwrap(),
        raised
    );
    let second = node
        .try_lock(&keys, "b", ttl, TIMEOUT)
        .await
        .unwrap()
        .unwrap();
    assert!(second > raised, "{second} after raising to {raised}");
    assert!(node.unlock(&keys, "b", TIMEOUT).await.unwrap());
}
