//! The watchdog's renewals through a client's timer: many guards go to the backend's batch
//! together, and one lock's failure stays that lock's.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;
use crate::error::Result;
use crate::raw::time::after;

/// A client whose leases all renew through one batch: counts the calls and the leases in them,
/// and refuses the lease numbered `refused`.
#[derive(Debug, Default)]
struct Client {
    timer: GuardTimer,
    calls: AtomicUsize,
    renewed: AtomicUsize,
    refused: Mutex<Option<usize>>,
}

#[derive(Debug)]
struct Lease {
    client: Arc<Client>,
    number: usize,
}

#[async_trait::async_trait]
impl RawLease for Lease {
    async fn release(&self) -> Result<()> {
        Ok(())
    }

    async fn extend(&self, _ttl: Duration) -> Result<Instant> {
        unreachable!("a batched lease is renewed by its batch")
    }

    fn guard_timer(&self) -> Option<&GuardTimer> {
        Some(&self.client.timer)
    }

    fn renewal_batch(&self) -> Option<(Arc<dyn RenewBatch>, &(dyn Any + Send + Sync))> {
        Some((self.client.clone(), self))
    }
}

#[async_trait::async_trait]
impl RenewBatch for Client {
    async fn extend_batch(
        &self,
        leases: &[(&(dyn Any + Send + Sync), Duration)],
    ) -> Vec<Result<Instant>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let refused = *self.refused.lock().unwrap();
        leases
            .iter()
            .map(|(lease, ttl)| {
                let lease = lease.downcast_ref::<Lease>().expect("one of ours");
                if Some(lease.number) == refused {
                    return Err(LockError::NotHeld {
                        name: lease.number.to_string(),
                    });
                }
                self.renewed.fetch_add(1, Ordering::SeqCst);
                Ok(after(Instant::now(), *ttl))
            })
            .collect()
    }
}

const TTL: Duration = Duration::from_secs(3);
const HELD: usize = 500;

fn hold(client: &Arc<Client>, number: usize) -> (Arc<LeaseState>, Option<Scheduled>) {
    let state = Arc::new(LeaseState::new(Some(after(Instant::now(), TTL))));
    let watch = Watch {
        name: crate::LockName::new(format!("lock-{number}")).unwrap(),
        ttl: TTL,
        renew_every: Some(TTL / 3),
        max_hold_until: None,
    };
    let lease = Arc::new(Lease {
        client: client.clone(),
        number,
    });
    let scheduled = start_watchdog(watch, lease, state.clone());
    (state, scheduled)
}

#[tokio::test(start_paused = true)]
async fn many_guards_renew_in_a_few_batches_and_one_refusal_loses_one_guard() {
    let client = Arc::new(Client::default());
    let mut held = Vec::new();
    for number in 0..HELD {
        held.push(hold(&client, number));
        // Spread over a third of the renewal interval, as grants arrive.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Three renewal intervals.
    tokio::time::sleep(TTL).await;
    let renewed = client.renewed.load(Ordering::SeqCst);
    let calls = client.calls.load(Ordering::SeqCst);
    assert!(renewed >= HELD * 2, "{renewed} renewals of {HELD} guards");
    assert!(
        calls * 20 <= renewed,
        "{calls} batch calls for {renewed} renewals: not batched"
    );
    assert!(held.iter().all(|(state, _)| state.is_held()));

    *client.refused.lock().unwrap() = Some(7);
    tokio::time::sleep(TTL).await;
    for (number, (state, _)) in held.iter().enumerate() {
        if number == 7 {
            assert_eq!(state.lost_reason(), Some(crate::LostReason::TakenOver));
        } else {
            assert!(
                state.is_held(),
                "guard {number} lost: {:?}",
                state.lost_reason()
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_released_guard_is_renewed_no_more() {
    let client = Arc::new(Client::default());
    let (kept, _kept_watch) = hold(&client, 0);
    let (released, released_watch) = hold(&client, 1);
    tokio::time::sleep(TTL).await;
    let before = client.renewed.load(Ordering::SeqCst);
    released.close();
    drop(released_watch);
    tokio::time::sleep(TTL).await;
    let after_release = client.renewed.load(Ordering::SeqCst) - before;
    assert!(kept.is_held());
    // Only the kept guard's renewals (about three in a TTL) were counted.
    assert!(
        after_release <= 4,
        "{after_release} renewals after one of two guards let go"
    );
}
