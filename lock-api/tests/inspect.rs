//! Holder inspection on the memory backend: free, held (token, lease left, waiters), released.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{
    DistributedLock, Inspection, LockError, LockGuard, LockName, LockOptions, MemoryLock,
};

#[tokio::test]
async fn inspect_follows_a_hold_and_its_waiters() {
    let locks = MemoryLock::new();
    assert!(DistributedLock::capabilities(&locks).inspect);
    let name = LockName::new("inspect/memory").unwrap();
    let ttl = Duration::from_secs(10);
    let opts = LockOptions::new().with_ttl(ttl);

    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );

    let guard = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held);
    assert_eq!(seen.token, Some(guard.fencing_token()));
    let left = seen.remaining.expect("a TTL lease has time left");
    assert!(left > Duration::ZERO && left <= ttl, "{left:?}");
    assert_eq!(seen.waiters, Some(0));
    assert!(seen.holder.is_some());

    // Two waiters from other clients of the store.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let client = locks.client();
            let (name, opts) = (name.clone(), opts.clone());
            tokio::spawn(async move { client.acquire(&name, &opts).await })
        })
        .collect();
    let mut counted = None;
    for _ in 0..500 {
        counted = locks.inspect(&name).await.unwrap().waiters;
        if counted == Some(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(counted, Some(2));

    // Released: the first waiter holds it, with a higher token; one still waits.
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let seen = locks.inspect(&name).await.unwrap();
    assert!(seen.held);
    assert!(seen.token.unwrap() > first);
    assert_eq!(seen.waiters, Some(1));

    for task in waiting {
        task.await.unwrap().unwrap().release().await.unwrap();
    }
    assert_eq!(
        locks.inspect(&name).await.unwrap(),
        Inspection::free(Some(0))
    );
}

#[tokio::test]
async fn inspect_through_a_trait_object_and_on_a_backend_without_it() {
    let locks: Arc<dyn DistributedLock> = Arc::new(MemoryLock::new());
    let name = LockName::new("inspect/dyn").unwrap();
    assert!(!locks.inspect(&name).await.unwrap().held);

    #[derive(Debug)]
    struct Opaque;
    impl std::fmt::Display for Opaque {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("opaque")
        }
    }
    #[async_trait::async_trait]
    impl DistributedLock for Opaque {
        fn capabilities(&self) -> dlock_api::Capabilities {
            dlock_api::Capabilities::TTL_LEASE
        }
        async fn try_acquire(
            &self,
            _: &LockName,
            _: &LockOptions,
        ) -> dlock_api::Result<Option<LockGuard>> {
            Ok(None)
        }
        async fn acquire(&self, name: &LockName, _: &LockOptions) -> dlock_api::Result<LockGuard> {
            Err(LockError::Timeout {
                name: name.to_string(),
                waited: Duration::ZERO,
            })
        }
    }
    let opaque: Arc<dyn DistributedLock> = Arc::new(Opaque);
    assert!(!opaque.capabilities().inspect);
    assert!(matches!(
        opaque.inspect(&name).await,
        Err(LockError::Unsupported { .. })
    ));
}

#[tokio::test]
async fn a_cut_off_client_cannot_inspect() {
    let locks = MemoryLock::new();
    locks.cut_off();
    let name = LockName::new("inspect/cut").unwrap();
    assert!(matches!(
        locks.inspect(&name).await,
        Err(LockError::Unavailable { .. })
    ));
}
