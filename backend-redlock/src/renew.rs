//! One tick's renewals of a client's locks: one script per node over every lock due (a node
//! holds all the keys), the quorum counted per lock as a lone extend counts it. The client's
//! [`RenewBatch`], which the shared watchdog calls with every renewal due at once.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::{RenewBatch, async_trait, batch_answers, batch_groups};
use dlock_api::{LockError, Result};
use dlock_redis::LockKeys;
use futures::future::join_all;
use tokio::time::Instant;

use crate::BACKEND;
use crate::client::Inner;
use crate::fanout;
use crate::lease::{Extended, RedlockLease};

/// The most keys one renewal script takes on a node: a few hundred microseconds of its time.
const CHUNK: usize = 512;

#[async_trait]
impl RenewBatch for Inner {
    async fn extend_batch(
        &self,
        leases: &[(&(dyn Any + Send + Sync), Duration)],
    ) -> Vec<Result<Instant>> {
        let groups = batch_groups::<RedlockLease>(leases, CHUNK, |_| true);
        let answered = join_all(
            groups
                .iter()
                .map(|(ttl, chunk)| self.extend_round(*ttl, chunk)),
        )
        .await;
        batch_answers(leases.len(), answered.into_iter().flatten(), || {
            LockError::unavailable_because(
                BACKEND,
                "a lease of another client was given to this client's renewal",
            )
        })
    }
}

impl Inner {
    /// Extends `locks` to `ttl` on every node at once, each node by one script within the
    /// per-node timeout and the least validity left among them; decided when each lock has a
    /// quorum or can no longer reach one, or every node answered.
    async fn extend_round(
        &self,
        ttl: Duration,
        locks: &[(usize, &RedlockLease)],
    ) -> Vec<(usize, Result<Instant>)> {
        let (n, quorum) = (self.slots.len(), self.config.quorum());
        let started = Instant::now();
        let mut done = Vec::with_capacity(locks.len());
        let mut live = Vec::with_capacity(locks.len());
        for &(index, lease) in locks {
            let current = lease.valid_until();
            if current <= started {
                done.push((index, Err(lease.out_of_validity())));
            } else {
                live.push((index, lease, current));
            }
        }
        let Some(least) = live.iter().map(|&(_, _, current)| current).min() else {
            return done;
        };
        let timeout = self
            .config
            .node_timeout_for(ttl)
            .min(least.saturating_duration_since(started));
        let held: Arc<Vec<(Arc<LockKeys>, Arc<str>)>> = Arc::new(
            live.iter()
                .map(|(_, lease, _)| (lease.keys.clone(), lease.owner.clone()))
                .collect(),
        );
        let (mut extended, mut gone) = (vec![0usize; live.len()], vec![0usize; live.len()]);
        let mut failed: Vec<String> = Vec::new();
        fanout::until_decided(
            &self.slots,
            |slot| {
                let (slot, held) = (slot.clone(), held.clone());
                async move {
                    let locks: Vec<(&LockKeys, &str)> = held
                        .iter()
                        .map(|(keys, owner)| (&**keys, &**owner))
                        .collect();
                    slot.get()?.extend_many(&locks, ttl, timeout).await
                }
            },
            |slot, reply| {
                match reply {
                    Ok(answers) => {
                        for ((extended, gone), yes) in
                            extended.iter_mut().zip(gone.iter_mut()).zip(answers)
                        {
                            match yes {
                                true => *extended = extended.saturating_add(1),
                                false => *gone = gone.saturating_add(1),
                            }
                        }
                    }
                    Err(error) => failed.push(format!("{}: {error}", slot.addr())),
                }
                // Like a lone extend, a lock is decided at a quorum's yes; one that can no
                // longer reach it is decided too, so a lock gone keeps no other waiting.
                extended
                    .iter()
                    .zip(&gone)
                    .all(|(&yes, &no)| yes >= quorum || no > n.saturating_sub(quorum))
            },
            |_, _| {},
        )
        .await;
        for (((index, lease, current), yes), no) in live.into_iter().zip(extended).zip(gone) {
            let round = Extended {
                started,
                current,
                ttl,
            };
            done.push((index, lease.conclude(round, (yes, no), &failed)));
        }
        done
    }
}
