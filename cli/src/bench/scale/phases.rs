//! The three phases of `--scale`, each a JSON array with one entry per size.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockGuard, LockName, LockOptions};
use futures::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{Bench, QUEUE_CLIENTS, TASKS, against};
use crate::bench::{Holding, handoff, rounded};
use crate::floor::census::{Requests, Stored};
use crate::floor::{ProcessCost, Throughput};

/// Most connections the queue phase's raw floor opens: the SQL servers' default connection
/// limit is 100 or 151, and dlock's own clients stay connected meanwhile.
const FLOOR_QUEUE_CONNECTIONS: usize = 32;

/// Postgres counts a session's transactions in `pg_stat_database` when the session has been idle
/// for up to ten seconds: a reading waits that long, so the sessions of the phase before are in.
const POSTGRES_STATS_DELAY: Duration = Duration::from_secs(11);

impl Bench<'_> {
    fn options(&self) -> LockOptions {
        LockOptions::new()
            .with_ttl(self.scale.scale_ttl)
            .with_wait_timeout(Duration::from_secs(60))
    }

    fn lock_names(&self, phase: &str, size: usize) -> Result<Vec<LockName>, LockError> {
        (0..size)
            .map(|i| LockName::new(format!("{}/{phase}/{size}/{i}", self.run)))
            .collect()
    }

    /// The server's request counter, where it has one and answers (a counter that cannot be
    /// read leaves its figures empty, not the bench failed).
    async fn requests(&self) -> Option<Requests> {
        let census = self.census?;
        if census.requests_what().starts_with("transactions") {
            tokio::time::sleep(POSTGRES_STATS_DELAY).await;
        }
        match census.requests().await {
            Ok(requests) => Some(requests),
            Err(error) => {
                eprintln!("server request counter not read: {error}");
                None
            }
        }
    }

    async fn stored(&self) -> Option<Stored> {
        match self.census?.stored().await {
            Ok(stored) => Some(stored),
            Err(error) => {
                eprintln!("server storage not read: {error}");
                None
            }
        }
    }

    /// The raw floor's pairs in [`TASKS`] tasks on one client, a key each, for `--duration`.
    async fn floor_pairs(&self) -> Result<Option<Throughput>, LockError> {
        match self.floors {
            Some(floors) => Ok(Some(floors.parallel(TASKS, self.args.duration).await?)),
            None => Ok(None),
        }
    }

    /// The held phase: one entry per `--scale-held` size.
    pub(super) async fn held(&self) -> Result<Value, LockError> {
        let floor = self.floor_pairs().await?;
        let floor_per_sec = floor.map(|f| f.per_sec());
        let mut entries: Vec<Value> = Vec::new();
        for &locks in &self.scale.scale_held {
            let mut entry = self.held_once(locks).await?;
            entry["floor_pairs_per_sec"] = json!(floor_per_sec.map(f64::round));
            entry["pairs_vs_floor"] = against(entry["pairs_per_sec"].as_f64(), floor_per_sec);
            if let Some(first) = entries.first() {
                for figure in ["acquire_per_sec", "release_per_sec"] {
                    entry[&format!("{figure}_vs_first")] =
                        against(entry[figure].as_f64(), first[figure].as_f64());
                }
            }
            entries.push(entry);
        }
        Ok(Value::Array(entries))
    }

    async fn held_once(&self, locks: usize) -> Result<Value, LockError> {
        let names = self.lock_names("held", locks)?;
        let options = self.options();
        let (client, hold) = (self.client, self.scale.scale_hold);
        let memory_before = resident_bytes();
        let started = Instant::now();
        let guards: Vec<LockGuard> = futures::stream::iter(&names)
            .map(|name| client.acquire(name, &options))
            .buffer_unordered(TASKS)
            .try_collect()
            .await?;
        let acquiring = started.elapsed();
        let memory_held = resident_bytes();
        let requests_before = self.requests().await;
        let cost_before = ProcessCost::now();
        let holding = Instant::now();
        tokio::time::sleep(hold).await;
        let cost = ProcessCost::since(cost_before);
        let held_for = holding.elapsed();
        let requests_after = self.requests().await;
        let lost = guards.iter().filter(|guard| !guard.is_held()).count();
        let started = Instant::now();
        futures::stream::iter(guards)
            .map(LockGuard::release)
            .buffer_unordered(TASKS)
            .try_collect::<()>()
            .await?;
        let releasing = started.elapsed();
        let lock_seconds = locks as f64 * held_for.as_secs_f64();
        let per_sec = |took: Duration| locks as f64 / took.as_secs_f64();
        let requests = match (requests_before, requests_after) {
            (Some(before), Some(after)) => Some(rounded(
                after.0.saturating_sub(before.0) as f64 / lock_seconds,
                4,
            )),
            _ => None,
        };
        Ok(json!({
            "locks": locks,
            "acquire_per_sec": per_sec(acquiring).round(),
            "release_per_sec": per_sec(releasing).round(),
            "pairs_per_sec": per_sec(acquiring.saturating_add(releasing)).round(),
            "held_s": rounded(held_for.as_secs_f64(), 1),
            "cpu_us_per_lock_s": rounded(cost.cpu.as_secs_f64() * 1e6 / lock_seconds, 3),
            "requests_per_lock_s": requests,
            "bytes_per_guard": match (memory_before, memory_held) {
                (Some(before), Some(held)) =>
                    json!((held.saturating_sub(before) as f64 / locks as f64).round()),
                _ => Value::Null,
            },
            "lost": lost,
        }))
    }

    /// The queue phase: one waiter, then one entry per `--scale-queue` size.
    pub(super) async fn queue(&self) -> Result<Value, LockError> {
        let mut sizes = vec![1];
        sizes.extend(self.scale.scale_queue.iter().filter(|&&w| w != 1));
        let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::new();
        let most = sizes.iter().max().copied().unwrap_or(1);
        for _ in 0..QUEUE_CLIENTS.min(most.saturating_add(1)) {
            clients.push(self.args.backend.connect().await?);
        }
        let (duration, hold) = (self.args.duration, self.args.hold);
        let mut entries: Vec<Value> = Vec::new();
        for waiters in sizes {
            // The holder and its waiters, dealt over the clients in turn.
            let contenders = waiters.saturating_add(1);
            let dealt = clients.iter().cycle().take(contenders).cloned().collect();
            let name = LockName::new(format!("{}/queue/{waiters}", self.run))?;
            let before = self.requests().await;
            // A queue too long for this backend to serve within the wait's bound is a finding
            // of the curve, not the end of the run: its entry says so and the next size runs.
            let handoffs = match handoff(dealt, (name, Holding::Lock), duration, hold).await {
                Ok(handoffs) => handoffs,
                Err(error) => {
                    entries.push(json!({ "waiters": waiters, "failed": error.to_string() }));
                    continue;
                }
            };
            let after = self.requests().await;
            let count = handoffs.micros.len();
            let mut entry = json!({
                "waiters": waiters,
                "clients": clients.len().min(contenders),
                "handoffs": count,
                "p50_us": handoffs.percentile(50.0).round(),
                "p99_us": handoffs.percentile(99.0).round(),
                "requests_per_handoff": match (before, after) {
                    (Some(before), Some(after)) if count > 0 => json!(rounded(
                        after.0.saturating_sub(before.0) as f64 / count as f64, 1)),
                    _ => Value::Null,
                },
            });
            if let Some(floors) = self.floors {
                let connections = contenders.min(FLOOR_QUEUE_CONNECTIONS);
                let floor = super::super::Samples::from_durations(
                    &floors.handoffs(duration, connections, hold).await?,
                );
                entry["floor_connections"] = json!(connections);
                entry["floor_p50_us"] = json!(floor.percentile(50.0).round());
                entry["floor_p99_us"] = json!(floor.percentile(99.0).round());
            }
            if let Some(first) = entries.first() {
                entry["p50_vs_one"] = against(entry["p50_us"].as_f64(), first["p50_us"].as_f64());
            }
            entries.push(entry);
        }
        Ok(Value::Array(entries))
    }

    /// The names phase: one entry per `--scale-names` size.
    pub(super) async fn names(&self) -> Result<Value, LockError> {
        let floor = self.floor_pairs().await?;
        let floor_per_sec = floor.map(|f| f.per_sec());
        let options = self.options();
        let mut entries = Vec::new();
        for &count in &self.scale.scale_names {
            let names = self.lock_names("names", count)?;
            let stored_before = self.stored().await;
            let client = self.client;
            let cost_before = ProcessCost::now();
            let started = Instant::now();
            futures::stream::iter(&names)
                .map(|name| async { client.acquire(name, &options).await?.release().await })
                .buffer_unordered(TASKS)
                .try_collect::<()>()
                .await?;
            let elapsed = started.elapsed();
            let cost = ProcessCost::since(cost_before);
            drop(names);
            // Whatever a name leaves with a lease is gone once the lease is over.
            tokio::time::sleep(self.scale.scale_ttl.saturating_add(Duration::from_secs(1))).await;
            let stored_after = self.stored().await;
            let per_sec = count as f64 / elapsed.as_secs_f64();
            let mut entry = json!({
                "names": count,
                "per_sec": per_sec.round(),
                "cpu_us_per_name": rounded(cost.cpu_us_per(count as u64), 1),
                "floor_pairs_per_sec": floor_per_sec.map(f64::round),
                "vs_floor": against(Some(per_sec), floor_per_sec),
            });
            if let (Some(before), Some(after)) = (stored_before, stored_after) {
                let grown = after.items as f64 - before.items as f64;
                entry["stored_before"] = json!(before.items);
                entry["stored_after"] = json!(after.items);
                entry["stored_per_name"] = json!(rounded(grown / count as f64, 4));
                if let (Some(b), Some(a)) = (before.unexpiring, after.unexpiring) {
                    entry["unexpiring_per_name"] =
                        json!(rounded((a as f64 - b as f64) / count as f64, 4));
                }
                if let (Some(b), Some(a)) = (before.bytes, after.bytes) {
                    entry["bytes_per_name"] =
                        json!(rounded((a as f64 - b as f64) / count as f64, 1));
                }
            }
            entries.push(entry);
        }
        Ok(Value::Array(entries))
    }
}

/// This process's resident memory, from `/proc/self/statm`; `None` where there is none.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}
