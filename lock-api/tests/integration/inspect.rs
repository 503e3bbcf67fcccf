//! Holder inspection on the memory backend beyond the shared suite's `inspect::follows_a_hand_off`
//! (which the memory backend runs): through a trait object, on a backend without it, and from a
//! client cut off from its store.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions, MemoryLock};

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
