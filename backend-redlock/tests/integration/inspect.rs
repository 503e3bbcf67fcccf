//! Holder inspection against five real Redis nodes: what a quorum says. Free, held (the guard's
//! token, the lease left, the owner), handed to a waiter, still held with two nodes forgetting
//! the key, and "cannot tell" once too few nodes answer to decide.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, Inspection, LockError, LockName, LockOptions};
use dlock_redlock::Redlock;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn inspect_reports_what_a_quorum_says() {
    let nodes = common::start_nodes(5);
    let url = common::redlock_url(&nodes, "");
    let locks = Redlock::connect_url(&url).await.unwrap();
    assert!(DistributedLock::capabilities(&locks).inspect);
    let name = LockName::new("dlock-test/inspect/redlock").unwrap();
    let opts = LockOptions::new()
        .with_ttl(TTL)
        .with_wait_timeout(Duration::from_secs(30));

    // Redlock has no queue: waiters are never counted.
    assert_eq!(locks.inspect(&name).await.unwrap(), Inspection::free(None));

    let guard = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(seen.token, Some(guard.fencing_token()));
    let left = seen.remaining.expect("a TTL lease has time left");
    assert!(left > Duration::ZERO && left <= TTL, "{left:?}");
    assert_eq!(seen.waiters, None);
    let owner = seen.holder.expect("the owner value");

    // A waiter on another client gets it on release, with a higher token.
    let other = Redlock::connect_url(&url).await.unwrap();
    let waiter = {
        let (name, opts) = (name.clone(), opts.clone());
        tokio::spawn(async move { other.acquire(&name, &opts).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(seen.token, Some(second.fencing_token()));
    assert!(second.fencing_token() > first);
    assert_ne!(seen.holder.as_deref(), Some(owner.as_str()));

    // Two nodes forget the key: three still make a quorum.
    let key = common::keys(&url, &name).lock;
    for i in 0..2 {
        nodes.node(i).command(&["DEL", &key]).unwrap();
    }
    assert!(locks.inspect(&name).await.unwrap().held);

    // Two of the three holding nodes die: one holds, two are silent, so a quorum of three
    // cannot be decided either way.
    nodes.node(3).kill();
    nodes.node(4).kill();
    match locks.inspect(&name).await {
        Err(LockError::Unavailable { .. }) => {}
        other => panic!("expected Unavailable, got {other:?}"),
    }
    drop(second);
}
