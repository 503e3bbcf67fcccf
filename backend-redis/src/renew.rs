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
use std::collections::BTreeMap;
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{RawLease, RenewBatch, async_trait};
use dlock_api::{LockError, Result};
use futures::future::join_all;
use tokio::time::Instant;

use crate::client::Inner;
use crate::lease::{Hold, RedisLease};

/// The most keys one renewal script takes: a few hundred microseconds of the server's time.
const CHUNK: usize = 512;

#[async_trait]
impl RenewBatch for Inner {
    async fn extend_batch(
        &self,
        leases: &[(&(dyn Any + Send + Sync), Duration)],
    ) -> Vec<Result<Instant>> {
        // By TTL, each a list of (position, lease) that one script may renew together.
        let mut together: BTreeMap<u128, Vec<(usize, &RedisLease)>> = BTreeMap::new();
        let mut alone = Vec::new();
        for (index, &(lease, ttl)) in leases.iter().enumerate() {
            match lease.downcast_ref::<RedisLease>() {
                Some(lease)
                    if !self.conn.is_cluster()
                        && matches!(lease.hold, Hold::Lock { .. })
                        && !lease.proclaimed() =>
                {
                    together
                        .entry(ttl.as_millis().max(1))
                        .or_default()
                        .push((index, lease));
                }
                lease => alone.push((index, lease, ttl)),
            }
        }
        let chunks = together
            .iter()
            .flat_map(|(&ttl_ms, locks)| locks.chunks(CHUNK).map(move |chunk| (ttl_ms, chunk)));
        let scripts = join_all(chunks.map(|(ttl_ms, chunk)| self.extend_many(ttl_ms, chunk)));
        let singles = join_all(alone.iter().map(|&(index, lease, ttl)| async move {
            let answer = match lease {
                Some(lease) => lease.extend(ttl).await,
                None => Err(LockError::unavailable_because(
                    crate::BACKEND,
                    "a lease of another client was given to this client's renewal",
                )),
            };
            (index, answer)
        }));
        let (scripts, singles) = futures::join!(scripts, singles);
        let mut answers: Vec<Option<Result<Instant>>> = leases.iter().map(|_| None).collect();
        for (index, answer) in scripts.into_iter().flatten().chain(singles) {
            if let Some(slot) = answers.get_mut(index) {
                *slot = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(LockError::unavailable_because(
                        crate::BACKEND,
                        "the renewal script gave no answer for this lock",
                    ))
                })
            })
            .collect()
    }
}

impl Inner {
    /// Extends `locks` to `ttl_ms` by one script: each lock's answer, by its position.
    async fn extend_many(
        &self,
        ttl_ms: u128,
        locks: &[(usize, &RedisLease)],
    ) -> Vec<(usize, Result<Instant>)> {
        let sent = Instant::now();
        let ttl = Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(u64::MAX));
        let ttl_ms = ttl_ms.to_string();
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
                    1 => (index, Ok(after(sent, ttl))),
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
