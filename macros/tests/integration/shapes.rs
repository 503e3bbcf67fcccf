//! Shapes of function `#[locked]` must accept, run on the memory backend. Every warning is an
//! error here: the expansion must not add a lint to the user's code.
#![deny(warnings)]

use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLock, DistributedLockExt, LockError, LockOptions, MemoryLock, Renewal};

struct Counter {
    locks: Arc<dyn DistributedLock>,
    n: u32,
}

impl Counter {
    async fn step(&mut self) {
        tokio::task::yield_now().await;
        self.n += 1;
    }

    /// The body takes `self` whole, so `locks` is a clone rather than a borrow of `self.locks`.
    #[dlock::locked(locks = self.locks.clone(), name = "counter:{self.n}")]
    async fn bump(&mut self) -> dlock::Result<u32> {
        self.step().await;
        self.step().await;
        Ok(self.n)
    }

    #[dlock::locked(locks = self.locks.clone(), name = "counter", context = lock)]
    async fn bump_with_context(&mut self) -> dlock::Result<(u32, u64)> {
        self.step().await;
        Ok((self.n, lock.fencing_token().get()))
    }
}

#[tokio::test]
async fn mut_self_bodies_beside_a_cloned_client() {
    let memory = MemoryLock::new();
    let mut counter = Counter {
        locks: Arc::new(memory.clone()),
        n: 0,
    };
    assert_eq!(counter.bump().await.unwrap(), 2);
    assert_eq!(counter.bump_with_context().await.unwrap().0, 3);
    assert_eq!(memory.active_names(), 0);
}

// On one line, as rustfmt would not leave them: `unused_braces` looks only at one-line blocks.
#[rustfmt::skip]
#[dlock::locked(locks = locks, name = "one-line")]
async fn one_line(locks: &MemoryLock) -> dlock::Result<u32> { Ok(1) }

#[rustfmt::skip]
#[dlock::locked(locks = locks, name = "one-line", context = lock)]
async fn one_line_with_context(locks: &MemoryLock) -> dlock::Result<u64> { Ok(lock.fencing_token().get()) }

#[tokio::test]
async fn one_line_bodies_compile_without_warnings() {
    let memory = MemoryLock::new();
    assert_eq!(one_line(&memory).await.unwrap(), 1);
    one_line_with_context(&memory).await.unwrap();
}

// The body's inner attribute covers the whole function: without it, `unused` fails the build.
#[dlock::locked(locks = locks, name = "inner-attribute")]
async fn inner_attribute(locks: &MemoryLock, unused: u32) -> dlock::Result<()> {
    #![allow(unused_variables)]
    Ok(())
}

#[tokio::test]
async fn a_body_may_start_with_an_inner_attribute() {
    inner_attribute(&MemoryLock::new(), 1).await.unwrap();
}

/// Options that try once: a call waits without limit unless it started from them.
fn try_once() -> LockOptions {
    LockOptions::new().with_wait_timeout(Duration::ZERO)
}

#[dlock::locked(locks = locks, name = "options", options = base)]
async fn options_by_value(locks: &MemoryLock, base: LockOptions) -> dlock::Result<()> {
    Ok(())
}

#[dlock::locked(locks = locks, name = "options", options = base)]
async fn options_by_reference(locks: &MemoryLock, base: &LockOptions) -> dlock::Result<()> {
    Ok(())
}

#[dlock::locked(locks = locks, name = "options", options = base)]
async fn options_in_an_arc(locks: &MemoryLock, base: Arc<LockOptions>) -> dlock::Result<()> {
    Ok(())
}

struct Configured {
    locks: MemoryLock,
    options: LockOptions,
}

impl Configured {
    #[dlock::locked(locks = self.locks, name = "options", options = &self.options)]
    async fn run(&self) -> dlock::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn options_by_value_by_reference_and_in_an_arc() {
    let memory = MemoryLock::new();
    let configured = Configured {
        locks: memory.clone(),
        options: try_once(),
    };
    options_by_value(&memory, try_once()).await.unwrap();
    options_by_reference(&memory, &try_once()).await.unwrap();
    options_in_an_arc(&memory, Arc::new(try_once()))
        .await
        .unwrap();
    configured.run().await.unwrap();

    // Held elsewhere, each call gives up at once: the base options were used.
    let guard = memory
        .client()
        .acquire_str("options", &LockOptions::new())
        .await
        .unwrap();
    let give_up = Duration::from_secs(3600);
    let outcomes = [
        tokio::time::timeout(give_up, options_by_value(&memory, try_once())).await,
        tokio::time::timeout(give_up, options_by_reference(&memory, &try_once())).await,
        tokio::time::timeout(give_up, options_in_an_arc(&memory, Arc::new(try_once()))).await,
        tokio::time::timeout(give_up, configured.run()).await,
    ];
    for outcome in outcomes {
        assert!(
            matches!(outcome, Ok(Err(LockError::Timeout { .. }))),
            "{outcome:?}"
        );
    }
    guard.release().await.unwrap();
    assert_eq!(memory.active_names(), 0);
}

/// Too short to renew, but `options` may turn renewal off, so the build cannot refuse it.
#[dlock::locked(locks = locks, name = "short", ttl = "2ms", options = base)]
async fn short_lease(locks: &MemoryLock, base: &LockOptions) -> dlock::Result<()> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_short_lease_is_left_to_validate_when_options_are_given() {
    let memory = MemoryLock::new();
    let off = LockOptions::new().with_renewal(Renewal::Off);
    short_lease(&memory, &off).await.unwrap();
    assert!(matches!(
        short_lease(&memory, &LockOptions::new()).await,
        Err(LockError::InvalidArgument { what: "ttl", .. })
    ));
}

/// The shortest lease that renews: a third of it is 1 ms.
#[dlock::locked(locks = locks, name = "short", ttl = "3ms")]
async fn shortest_renewed_lease(locks: &MemoryLock) -> dlock::Result<()> {
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_shortest_renewed_lease_passes_validate() {
    shortest_renewed_lease(&MemoryLock::new()).await.unwrap();
}
