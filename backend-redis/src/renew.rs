//! One tick's renewals of a client's locks in one exchange with the server: the client's
//! [`RenewBatch`], which the shared watchdog calls with every renewal due at once.
//!
//! On a single node or behind Sentinels every key lives on the one primary, so the plain locks
//! of a tick are extended by one script over all their keys (in chunks, so that no script runs
//! long on the server): one command, one reply and one wake-up for the lot instead of one per
//! lock. A Cluster spreads the keys over slots no one script may span, and a permit or a
//! leader's lock renews more than its key: those are extended each by its own script, all at
//! once on the multiplexed connection.

use std::any::Any;
use std::time::Duration;

use dlock_api::raw::{RawLease, RenewBatch, async_trait, batch_answers, batch_groups};
use dlock_api::{LockError, Result};
use futures::future::join_all;
use tokio::time::Instant;

use crate::client::Inner;
use crate::lease::{Hold, RedisLease, lease_end};

/// The most keys one renewal script takes: a few hundred microseconds of the server's time.
const CHUNK: usize = 512;

/// How many renewals that each need a script of their own are in flight at once.
const SINGLES_IN_FLIGHT: usize = 64;

#[async_trait]
impl RenewBatch for Inner {
    async fn extend_batch(
        &self,
        leases: &[(&(dyn Any + Send + Sync), Duration)],
    ) -> Vec<Result<Instant>> {
        let together = batch_groups::<RedisLease>(leases, CHUNK, |lease| {
            !self.conn.is_cluster()
                && matches!(lease.hold, Hold::Lock { .. })
                && !lease.proclaimed()
        });
        let mut grouped = vec![false; leases.len()];
        for &(index, _) in together.iter().flat_map(|(_, chunk)| chunk) {
            if let Some(grouped) = grouped.get_mut(index) {
                *grouped = true;
            }
        }
        let scripts = join_all(
            together
                .iter()
                .map(|(ttl, chunk)| self.extend_many(*ttl, chunk)),
        );
        let alone: Vec<(usize, &(dyn Any + Send + Sync), Duration)> = leases
            .iter()
            .enumerate()
            .filter(|(index, _)| !grouped.get(*index).copied().unwrap_or(false))
            .map(|(index, &(lease, ttl))| (index, lease, ttl))
            .collect();
        // A bounded number in flight: a Cluster's whole tick at once (thousands of scripts)
        // would queue the client's acquires behind it past their command timeout.
        let singles = async {
            let mut answered = Vec::with_capacity(alone.len());
            for chunk in alone.chunks(SINGLES_IN_FLIGHT) {
                answered.extend(
                    join_all(chunk.iter().map(|&(index, lease, ttl)| async move {
                        let answer = match lease.downcast_ref::<RedisLease>() {
                            Some(lease) => lease.extend(ttl).await,
                            None => Err(LockError::unavailable_because(
                                crate::BACKEND,
                                "a lease of another client was given to this client's renewal",
                            )),
                        };
                        (index, answer)
                    }))
                    .await,
                );
            }
            answered
        };
        let (scripts, singles) = futures::join!(scripts, singles);
        batch_answers(
            leases.len(),
            scripts.into_iter().flatten().chain(singles),
            || {
                LockError::unavailable_because(
                    crate::BACKEND,
                    "the renewal script gave no answer for this lock",
                )
            },
        )
    }
}

impl Inner {
    /// Extends `locks` to `ttl_ms` by one script: each lock's answer, by its position.
    async fn extend_many(
        &self,
        ttl: Duration,
        locks: &[(usize, &RedisLease)],
    ) -> Vec<(usize, Result<Instant>)> {
        let sent = Instant::now();
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let names: Vec<&str> = locks
            .iter()
            .map(|(_, lease)| lease.keys.lock.as_str())
            .collect();
        let args: Vec<&str> = std::iter::once(ttl_ms.as_str())
            .chain(locks.iter().map(|(_, lease)| &*lease.owner))
            .collect();
        let timeout = self.config.command_timeout;
        let script = &self.scripts.extend_many;
        let answers: Result<Vec<i64>> = self.conn.run_script(timeout, script, &names, &args).await;
        match answers {
            Ok(answers) if answers.len() == locks.len() => locks
                .iter()
                .zip(answers)
                .map(|(&(index, lease), extended)| match extended {
                    1 => (index, Ok(lease_end(sent, ttl))),
                    _ => (index, Err(lease.not_held())),
                })
                .collect(),
            Ok(answers) => {
                let error = LockError::unavailable_because(
                    crate::BACKEND,
                    format!(
                        "the renewal script answered {} locks of {}",
                        answers.len(),
                        locks.len()
                    ),
                );
                locks
                    .iter()
                    .map(|&(index, _)| (index, Err(each(&error))))
                    .collect()
            }
            Err(error) => locks
                .iter()
                .map(|&(index, _)| (index, Err(each(&error))))
                .collect(),
        }
    }
}

/// `error` for each lock of a script that failed as a whole, as retryable as it was: the
/// watchdog retries a lock's renewal, or gives it up, by that alone.
fn each(error: &LockError) -> LockError {
    let text = dlock_api::error_chain(error);
    match error.is_retryable() {
        true => LockError::unavailable_because(crate::BACKEND, text),
        false => LockError::unexpected(crate::BACKEND, text),
    }
}
