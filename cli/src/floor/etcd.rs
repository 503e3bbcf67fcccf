//! etcd's raw floors, with etcd-client alone: a create transaction and a delete guarded by the
//! create revision per pair (one raft write each, as dlock's uncontended acquire and release),
//! and the synced-watch hand-off from a predecessor to the key queued behind it.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_etcd::EtcdConfig;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KvClient, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use tokio::time::Instant;

use crate::floor::{
    Measured, Ops, Pairs, Protocol, Throughput, WarmUp, many, pairs_of, sample_timed,
};

const BACKEND: &str = "etcd";

/// The TTL of the floors' leases, in seconds; they are kept alive while a floor runs.
const LEASE_TTL: i64 = 30;

fn failed(error: etcd_client::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

fn unexpected(what: &str) -> LockError {
    LockError::unexpected(BACKEND, format!("hand-off floor: {what}"))
}

/// The cluster an `etcd://` URL names.
#[derive(Debug)]
pub(crate) struct Etcd {
    config: EtcdConfig,
}

impl Etcd {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: EtcdConfig::from_url(url)?,
        })
    }

    /// A client (one gRPC channel) with the options dlock's client sets: timeouts, HTTP/2
    /// keep-alive, `require_leader`, credentials and TLS.
    async fn connect(&self) -> Result<Client> {
        let c = &self.config;
        let connecting = Client::connect(c.endpoint_urls(), Some(c.connect_options()?));
        tokio::time::timeout(c.connect_timeout, connecting)
            .await
            .map_err(|_| LockError::command_timeout(BACKEND, c.connect_timeout))?
            .map_err(failed)
    }

    /// A key (or range) of this run: `PREFIX/dlock-bench-WHAT/PID`.
    fn key(&self, what: &str) -> String {
        format!(
            "{}/dlock-bench-{what}/{}",
            self.config.prefix,
            std::process::id()
        )
    }
}

/// A lease kept alive while it lives, revoked at [`end`](KeptLease::end) (or left to expire
/// with its TTL if dropped).
struct KeptLease {
    id: i64,
    client: Client,
    keeper: tokio::task::JoinHandle<()>,
}

impl KeptLease {
    async fn grant(client: &Client) -> Result<Self> {
        let mut client = client.clone();
        let id = client
            .lease_grant(LEASE_TTL, None)
            .await
            .map_err(failed)?
            .id();
        let (mut keeper, mut answers) = client.lease_keep_alive(id).await.map_err(failed)?;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(LEASE_TTL.unsigned_abs() / 3)).await;
                if keeper.keep_alive().await.is_err()
                    || !matches!(answers.message().await, Ok(Some(_)))
                {
                    return;
                }
            }
        });
        Ok(Self { id, client, keeper })
    }

    async fn end(mut self) {
        self.keeper.abort();
        let _ = self.client.lease_revoke(self.id).await;
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
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

/// Pairs on one client, a key per task, every key on one lease.
struct EtcdPairs {
    kv: KvClient,
    keys: Vec<String>,
    lease: i64,
}

impl Pairs for EtcdPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let (mut kv, key) = (self.kv.clone(), self.keys[task].as_str());
        let created = kv
            .txn(create_if_absent(key, self.lease))
            .await
            .map_err(failed)?;
        let revision = created.header().map_or(0, |h| h.revision());
        kv.txn(delete_guarded(key, revision))
            .await
            .map_err(failed)?;
        Ok(())
    }
}

impl Etcd {
    /// Runs `measure` on pairs of one client over `keys`, the lease ended afterwards.
    async fn with_pairs<T>(
        &self,
        keys: Vec<String>,
        measure: impl AsyncFnOnce(Arc<EtcdPairs>) -> Result<T>,
    ) -> Result<T> {
        let client = self.connect().await?;
        let lease = KeptLease::grant(&client).await?;
        let pairs = Arc::new(EtcdPairs {
            kv: client.kv_client(),
            keys,
            lease: lease.id,
        });
        let result = measure(pairs).await;
        lease.end().await;
        result
    }
}

impl Protocol for Etcd {
    fn ops(&self) -> Ops {
        Ops {
            pair: "txn create (create_revision = 0, put on a lease) + txn delete guarded by create revision",
            fenced_pair: None,
            handoff: "guarded delete, then the waiter's watch (from the read's revision + 1) fires",
            client: "one client (one channel)".to_owned(),
        }
    }

    async fn pairs(&self, duration: Duration) -> Result<Measured> {
        self.with_pairs(vec![self.key("floor")], async |pairs| {
            pairs_of(&*pairs, duration).await
        })
        .await
    }

    /// A holder's key, and a waiter's key created behind it in the acquire transaction (put, and
    /// read the two newest keys), whose watch on the holder's key starts from that read's revision
    /// plus one (a start above the current revision joins the server's synced watchers). The holder
    /// then holds `hold`, as dlock's contenders do. One sample is the time from the holder sending
    /// its delete (guarded by the create revision) to the waiter's watch delivering it. The two
    /// sides are two clients, each with its keys on a kept-alive lease, and the waiter's watches
    /// share one stream.
    async fn handoffs(
        &self,
        duration: Duration,
        _waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let (holder, waiter) = (self.connect().await?, self.connect().await?);
        let (holder_lease, waiter_lease) = (
            KeptLease::grant(&holder).await?,
            KeptLease::grant(&waiter).await?,
        );
        let range = format!("{}/", self.key("handoff"));
        let mut side = HandOff {
            holder,
            waiter,
            holder_key: format!("{range}h"),
            waiter_key: format!("{range}w"),
            range,
            holder_lease: holder_lease.id,
            waiter_lease: waiter_lease.id,
            watches: None,
        };
        let samples =
            sample_timed(WarmUp::Rounds(20), duration, async || side.once(hold).await).await;
        holder_lease.end().await;
        waiter_lease.end().await;
        samples
    }

    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
        let keys = (0..tasks)
            .map(|i| self.key(&format!("parallel/{tasks}/{i}")))
            .collect();
        self.with_pairs(keys, async |pairs| many(pairs, tasks, duration).await)
            .await
    }
}

/// The two sides of the hand-off floor.
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

impl HandOff {
    /// One hand-off, the holder holding `hold` once the waiter is queued; its sample.
    async fn once(&mut self, hold: Duration) -> Result<Duration> {
        let created = self
            .holder
            .txn(create_if_absent(&self.holder_key, self.holder_lease))
            .await
            .map_err(failed)?;
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
            .map_err(failed)?;
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
        let watch_id = self.watch_holder(read.saturating_add(1)).await?;
        tokio::time::sleep(hold).await;
        let released = Instant::now();
        self.holder
            .txn(delete_guarded(&self.holder_key, held))
            .await
            .map_err(failed)?;
        let took = self.deletion(watch_id).await?;
        let took = took.saturating_duration_since(released);
        let watches = self
            .watches
            .as_mut()
            .ok_or_else(|| unexpected("no watch stream"))?;
        watches.cancel(watch_id).await.map_err(failed)?;
        self.waiter
            .txn(delete_guarded(&self.waiter_key, read))
            .await
            .map_err(failed)?;
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
                    .map_err(failed)?;
                watches
            }
            None => self.watches.insert(
                self.waiter
                    .watch(self.holder_key.as_str(), Some(options))
                    .await
                    .map_err(failed)?,
            ),
        };
        loop {
            let response = watches
                .message()
                .await
                .map_err(failed)?
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
                .map_err(failed)?
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
