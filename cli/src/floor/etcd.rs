//! etcd's raw floors, with etcd-client alone: a create transaction and a delete guarded by the
//! create revision per pair (one raft write each, as dlock's uncontended acquire and release),
//! and the synced-watch hand-off from a predecessor to the key queued behind it. A semaphore's
//! floors run the same line with N places at its head: a key holds while fewer than N keys of
//! the name are older, learnt in the transaction that puts it, and a waiter counts the
//! deletions of the keys ahead of it on a watch of the name's range.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_etcd::EtcdConfig;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, KvClient, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
    WatchResponse, WatchStream,
};
use tokio::time::Instant;

use crate::contend::Contender;
use crate::floor::{
    Measured, Ops, Pairs, Protocol, Throughput, WarmUp, contend_for_last_permit, many, pairs_of,
    sample_timed,
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

/// How many keys a permit's read asks for: ours, and as many ahead as dlock reads (at least
/// the limit, so that a read that grants shows every key ahead, and at least eight).
fn line_read(limit: u32) -> i64 {
    i64::from(limit.max(8)).saturating_add(1)
}

/// The newest keys of the line in `range` created at or before our key: ours first.
fn newest_keys(limit: u32) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(line_read(limit))
        .with_keys_only()
}

/// A permit's acquire: our key put on `lease` with the limit as its value unless it exists,
/// and in the same transaction the newest keys of the line (the read sees the put).
fn join_line(key: &str, range: &str, lease: i64, limit: u32) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                key,
                limit.to_string(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(range, Some(newest_keys(limit))),
        ])
}

/// Where our key stands in a read of the line.
struct Line {
    /// Our key's create revision.
    revision: i64,
    /// The keys ahead of ours that the read showed.
    ahead: Vec<Vec<u8>>,
    /// The read showed every key ahead of ours.
    complete: bool,
}

impl Line {
    /// The line a read (newest first, ours the newest) shows, or `None` if ours is not in it.
    fn read(kvs: &[KeyValue], key: &str, revision: i64, limit: u32) -> Option<Self> {
        let (ours, ahead) = kvs.split_first()?;
        (ours.key() == key.as_bytes()).then(|| Self {
            revision,
            ahead: ahead.iter().map(|kv| kv.key().to_vec()).collect(),
            complete: i64::try_from(kvs.len()).unwrap_or(i64::MAX) < line_read(limit),
        })
    }

    /// The line after [`join_line`], which put our key at the transaction's revision.
    fn joined(response: TxnResponse, key: &str, limit: u32) -> Result<Self> {
        let revision = response.header().map_or(0, |h| h.revision());
        let kvs = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
            _ => None,
        });
        match kvs {
            Some(kvs) if response.succeeded() => Line::read(&kvs, key, revision, limit),
            _ => None,
        }
        .ok_or_else(|| LockError::unexpected(BACKEND, format!("the floor's key {key} was not put")))
    }

    /// Fewer keys than the limit are ahead: a permit is ours.
    fn holds(&self, limit: u32) -> bool {
        self.ahead.len() < usize::try_from(limit).unwrap_or(usize::MAX)
    }
}

/// The next answer on a watch stream.
async fn next_response(watches: &mut WatchStream) -> Result<WatchResponse> {
    watches
        .message()
        .await
        .map_err(failed)?
        .ok_or_else(|| unexpected("the watch stream ended"))
}

/// Watches `key` (or the range it starts, as `options` say) on the stream of `client` (opened
/// by the first watch), and waits until the server says the watch exists. Returns its id.
async fn open_watch(
    client: &mut Client,
    watches: &mut Option<WatchStream>,
    key: &str,
    options: WatchOptions,
) -> Result<i64> {
    let watches = match watches {
        Some(watches) => {
            watches.watch(key, Some(options)).await.map_err(failed)?;
            watches
        }
        None => watches.insert(client.watch(key, Some(options)).await.map_err(failed)?),
    };
    loop {
        let response = next_response(watches).await?;
        // The previous watch's cancellation may come first.
        if response.created() {
            if response.canceled() {
                return Err(unexpected("a watch was refused"));
            }
            return Ok(response.watch_id());
        }
    }
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

/// Uncontended pairs of a semaphore of `limit` permits on one client: its key's acquire
/// transaction, and the delete guarded by its create revision.
struct PermitPairs {
    kv: KvClient,
    key: String,
    range: String,
    lease: i64,
    limit: u32,
}

impl Pairs for PermitPairs {
    async fn pair(&self, _task: usize) -> Result<()> {
        let mut kv = self.kv.clone();
        let joined = kv
            .txn(join_line(&self.key, &self.range, self.lease, self.limit))
            .await
            .map_err(failed)?;
        let line = Line::joined(joined, &self.key, self.limit)?;
        let held = line.holds(self.limit);
        kv.txn(delete_guarded(&self.key, line.revision))
            .await
            .map_err(failed)?;
        if !held {
            return Err(LockError::backend(
                BACKEND,
                format!("every permit of the floor's {} was taken", self.range),
            ));
        }
        Ok(())
    }
}

/// One client contending for the last free permit of a semaphore: its key's acquire
/// transaction, then, while `limit` or more keys are ahead, a watch of the range's deletions
/// from the read's revision + 1 counting those ahead (a linearizable read of the line decides
/// when the first read did not show them all).
struct PermitContender {
    client: Client,
    lease: KeptLease,
    key: String,
    range: String,
    limit: u32,
    /// The create revision of our key, while it holds.
    held: i64,
    /// The client's watch stream, opened by its first wait.
    watches: Option<WatchStream>,
}

impl PermitContender {
    /// Waits until fewer than the limit of the keys ahead of ours are left; `line` is the read
    /// made at revision `seen`.
    async fn wait(&mut self, mut line: Line, seen: i64) -> Result<()> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(seen.saturating_add(1))
            .with_filters([WatchFilterType::NoPut]);
        let range = self.range.clone();
        let watch_id = open_watch(&mut self.client, &mut self.watches, &range, options).await?;
        let watches = self
            .watches
            .as_mut()
            .ok_or_else(|| unexpected("no watch stream"))?;
        while !line.holds(self.limit) {
            let response = next_response(watches).await?;
            if response.watch_id() != watch_id {
                continue;
            }
            if response.canceled() {
                return Err(unexpected("the line's watch was cancelled"));
            }
            for event in response.events() {
                if let Some(kv) = event.kv() {
                    line.ahead.retain(|key| key.as_slice() != kv.key());
                }
            }
            if line.holds(self.limit) && !line.complete {
                // Keys the read did not show may still be ahead: read the line again.
                let options = newest_keys(self.limit).with_max_create_revision(line.revision);
                let read = self
                    .client
                    .get(range.as_str(), Some(options))
                    .await
                    .map_err(failed)?;
                line = Line::read(read.kvs(), &self.key, line.revision, self.limit)
                    .ok_or_else(|| unexpected("the contender's key went"))?;
            }
        }
        watches.cancel(watch_id).await.map_err(failed)
    }
}

impl Contender for PermitContender {
    async fn lock(&mut self) -> Result<()> {
        let joined = self
            .client
            .txn(join_line(&self.key, &self.range, self.lease.id, self.limit))
            .await
            .map_err(failed)?;
        let line = Line::joined(joined, &self.key, self.limit)?;
        self.held = line.revision;
        if !line.holds(self.limit) {
            let seen = line.revision;
            self.wait(line, seen).await?;
        }
        Ok(())
    }

    async fn unlock(&mut self) -> Result<()> {
        self.client
            .txn(delete_guarded(&self.key, self.held))
            .await
            .map_err(failed)
            .map(drop)
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
            peer_pair: None,
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

    async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
        let client = self.connect().await?;
        let lease = KeptLease::grant(&client).await?;
        let range = format!("{}/", self.key(&format!("permits-{permits}")));
        let pairs = PermitPairs {
            kv: client.kv_client(),
            key: format!("{range}k"),
            range,
            lease: lease.id,
            limit: permits,
        };
        let measured = pairs_of(&pairs, duration).await;
        lease.end().await;
        measured.map(Some)
    }

    /// `permits - 1` keys held on one more client's lease throughout; `waiters` clients, each
    /// with its key on a lease of its own, contend for the last permit.
    async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        (waiters, hold): (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        let range = format!("{}/", self.key(&format!("permit-handoff-{permits}")));
        let parker = self.connect().await?;
        let parked = KeptLease::grant(&parker).await?;
        let mut kv = parker.kv_client();
        for i in 1..permits {
            let key = format!("{range}parked-{i}");
            let joined = kv
                .txn(join_line(&key, &range, parked.id, permits))
                .await
                .map_err(failed)?;
            if !Line::joined(joined, &key, permits)?.holds(permits) {
                return Err(unexpected("a parked key holds no permit"));
            }
        }
        let mut made = 0usize;
        let samples = contend_for_last_permit(waiters, duration, hold, async || {
            made = made.saturating_add(1);
            let client = self.connect().await?;
            Ok(PermitContender {
                lease: KeptLease::grant(&client).await?,
                client,
                key: format!("{range}contender-{made}"),
                range: range.clone(),
                limit: permits,
                held: 0,
                watches: None,
            })
        })
        .await;
        // Revoking the lease deletes the parked keys.
        parked.end().await;
        samples.map(Some)
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
        let key = self.holder_key.clone();
        open_watch(&mut self.waiter, &mut self.watches, &key, options).await
    }

    /// Waits for the holder's deletion on watch `watch_id`; the instant it arrived.
    async fn deletion(&mut self, watch_id: i64) -> Result<Instant> {
        let watches = self
            .watches
            .as_mut()
            .ok_or_else(|| unexpected("no watch stream"))?;
        loop {
            let response = next_response(watches).await?;
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
