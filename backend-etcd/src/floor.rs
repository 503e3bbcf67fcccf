//! The raw protocol floor for `dlock bench`: what the same acquire and release cost with the
//! client library alone, measured in the same run as dlock.

use std::time::Duration;

use dlock_api::{LockError, Result};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use tokio::time::Instant;

use crate::EtcdLock;
use crate::error::map_err;

/// Measures create + delete pairs for `duration` on one key riding a session lease: a
/// transaction that puts the key if it does not exist, and one that deletes it guarded by its
/// create revision (one raft write each, as dlock's uncontended acquire and release). Returns
/// one sample per pair, after a short warm-up.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL;
/// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) when the cluster does not answer.
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most one key on a lease that is revoked when the client
/// goes (or expires with its TTL).
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let locks = EtcdLock::connect_url(url).await?;
    let mut client = locks.inner.client.clone();
    let lease = client.lease_grant(30, None).await.map_err(map_err)?.id();
    let key = format!(
        "{}/dlock-bench-floor/{}",
        locks.config().prefix,
        std::process::id()
    );
    let pair = async || -> Result<()> {
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let created = client.txn(create).await.map_err(map_err)?;
        let revision = created.header().map_or(0, |h| h.revision());
        let delete = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        client.txn(delete).await.map_err(map_err)?;
        Ok(())
    };
    let samples = dlock_api::raw::floor::sample(duration, pair).await?;
    let _ = client.lease_revoke(lease).await;
    Ok(samples)
}

/// Measures the synced-watch hand-off for `duration`: a holder's key, and a waiter's key created
/// behind it in the acquire transaction (put, and read the two newest keys), whose watch on the
/// holder's key starts from that read's revision + 1 (a start above the current revision joins
/// the server's synced watchers). One sample is the time from the holder sending its delete
/// (guarded by the create revision) to the waiter's watch delivering it. The two sides are two
/// clients, each with its keys on a kept-alive lease, and the waiter's watches share one stream.
/// Returns one sample per hand-off, after a short warm-up.
///
/// # Errors
/// As [`raw_floor`]; [`LockError::Backend`] if the server's answers do not
/// follow the recipe (another key under the floor's range, a watch that is not created).
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most two keys, on leases that are revoked when the
/// clients go (or expire with their TTL).
pub async fn raw_handoff_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let (holder, waiter) = (
        EtcdLock::connect_url(url).await?,
        EtcdLock::connect_url(url).await?,
    );
    let ttl = Duration::from_secs(30);
    let (holder_lease, waiter_lease) = (
        holder.inner.session_lease(ttl).await?.id,
        waiter.inner.session_lease(ttl).await?.id,
    );
    let range = format!(
        "{}/dlock-bench-handoff/{}/",
        holder.config().prefix,
        std::process::id()
    );
    let mut side = HandOff {
        holder: holder.inner.client.clone(),
        waiter: waiter.inner.client.clone(),
        holder_key: format!("{range}h"),
        waiter_key: format!("{range}w"),
        range,
        holder_lease,
        waiter_lease,
        watches: None,
    };
    for _ in 0..20 {
        side.once().await?;
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        samples.push(side.once().await?);
    }
    Ok(samples)
}

struct HandOff {
    holder: Client,
    waiter: Client,
    range: String,
    holder_key: String,
    waiter_key: String,
    holder_lease: i64,
    waiter_lease: i64,
    /// The waiter's watch stream, opened by its first watch.
    watches: Option<WatchStream>,
}

fn unexpected(what: &str) -> LockError {
    LockError::unexpected(crate::BACKEND, what.to_owned())
}

fn create_if_absent(key: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )])
}

fn delete_guarded(key: &str, revision: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, revision)])
        .and_then([TxnOp::delete(key, None)])
}

impl HandOff {
    /// One hand-off; its sample.
    async fn once(&mut self) -> Result<Duration> {
        let created = self
            .holder
            .txn(create_if_absent(&self.holder_key, self.holder_lease))
            .await
            .map_err(map_err)?;
        let held = created.header().map_or(0, |h| h.revision());
        // The waiter's acquire: its key, and in the same transaction the two newest keys.
        let newest_two = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2)
            .with_keys_only();
        let queued = self
            .waiter
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        self.waiter_key.as_str(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([
                        TxnOp::put(
                            self.waiter_key.as_str(),
                            "",
                            Some(PutOptions::new().with_lease(self.waiter_lease)),
                        ),
                        TxnOp::get(self.range.as_str(), Some(newest_two)),
                    ]),
            )
            .await
            .map_err(map_err)?;
        let read = queued.header().map_or(0, |h| h.revision());
        let before = queued.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().get(1).map(|kv| kv.key().to_vec()),
            _ => None,
        });
        if !queued.succeeded() || before.as_deref() != Some(self.holder_key.as_bytes()) {
            return Err(unexpected(
                "the waiter is not queued right behind the holder",
            ));
        }
        let watch_id = self.watch_holder(read + 1).await?;
        let released = Instant::now();
        self.holder
            .txn(delete_guarded(&self.holder_key, held))
            .await
            .map_err(map_err)?;
        let took = self.deletion(watch_id).await?;
        let took = took.saturating_duration_since(released);
        let watches = self
            .watches
            .as_mut()
            .ok_or_else(|| unexpected("no watch stream"))?;
        watches.cancel(watch_id).await.map_err(map_err)?;
        self.waiter
            .txn(delete_guarded(&self.waiter_key, read))
            .await
            .map_err(map_err)?;
        Ok(took)
    }

    /// Watches the holder's key from `start` and waits until the server says the watch exists,
    /// so the delete meets a created watcher, as a waiter's does. Returns the watch's id.
    async fn watch_holder(&mut self, start: i64) -> Result<i64> {
        let options = WatchOptions::new().with_start_revision(start);
        let watches = match self.watches.as_mut() {
            Some(watches) => {
                watches
                    .watch(self.holder_key.as_str(), Some(options))
                    .await
                    .map_err(map_err)?;
                watches
            }
            None => self.watches.insert(
                self.waiter
                    .watch(self.holder_key.as_str(), Some(options))
                    .await
                    .map_err(map_err)?,
            ),
        };
        loop {
            let response = watches
                .message()
                .await
                .map_err(map_err)?
                .ok_or_else(|| unexpected("the watch stream ended"))?;
            // The previous watch's cancellation may come first.
            if response.created() {
                if response.canceled() {
                    return Err(unexpected("the holder's watch was refused"));
                }
                return Ok(response.watch_id());
            }
        }
    }

    /// Waits for the holder's deletion on watch `watch_id`; the instant it arrived.
    async fn deletion(&mut self, watch_id: i64) -> Result<Instant> {
        let watches = self
            .watches
            .as_mut()
            .ok_or_else(|| unexpected("no watch stream"))?;
        loop {
            let response = watches
                .message()
                .await
                .map_err(map_err)?
                .ok_or_else(|| unexpected("the watch stream ended"))?;
            let arrived = Instant::now();
            if response.watch_id() != watch_id {
                continue;
            }
            if response.canceled() {
                return Err(unexpected("the holder's watch was cancelled"));
            }
            if response
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                return Ok(arrived);
            }
        }
    }
}
