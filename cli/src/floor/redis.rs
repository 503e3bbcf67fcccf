//! Redis's raw floors, with the `redis` crate alone: a `SET NX PX` and an `EVALSHA`
//! compare-and-delete per pair, and the notified hand-off (`DEL`+`PUBLISH` in one script, the
//! subscriber's `SET NX`). The commands, scripts and node connections here are Redlock's too.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};

use crate::floor::{Measured, Pairs, Throughput, many, pairs_of};

/// Deletes the key if it still holds the owner token: the release of a pair.
pub(super) const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Deletes the key and announces it on channel `ARGV[1]` with message `ARGV[2]`, in one step:
/// the release of a hand-off.
pub(super) const DELETE_AND_PUBLISH: &str = r"
redis.call('DEL', KEYS[1])
return redis.call('PUBLISH', ARGV[1], ARGV[2])
";

/// The lease every floor key gets, in milliseconds.
const LEASE_MS: u64 = 30_000;

/// `SET key owner NX PX 30000`.
pub(super) fn set_nx(key: &str, owner: &str) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key).arg(owner).arg("NX").arg("PX").arg(LEASE_MS);
    set
}

/// A fresh owner token.
pub(super) fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Keys of this run under `prefix`: `PREFIX:{dlock-bench-WHAT/PID}`, each in one hash slot.
#[derive(Debug)]
pub(super) struct RunKeys {
    pub(super) prefix: String,
}

impl RunKeys {
    /// The key of `what`.
    pub(super) fn key(&self, what: &str) -> String {
        format!(
            "{}:{{dlock-bench-{what}/{}}}",
            self.prefix,
            std::process::id()
        )
    }

    /// The keys of `tasks` tasks in the many-names phase, `what` telling the floors apart.
    pub(super) fn parallel(&self, what: &str, tasks: usize) -> Vec<String> {
        (0..tasks)
            .map(|i| self.key(&format!("{what}/{tasks}/{i}")))
            .collect()
    }
}

/// The fence key of each lock key, where fenced floors count their tokens.
pub(super) fn fence_keys(keys: &[String]) -> Vec<String> {
    keys.iter().map(|key| format!("{key}:fence")).collect()
}

/// Pairs of a Redis-protocol floor, which may count tokens on fence keys.
pub(super) trait ForgetFences: Pairs {
    /// Deletes the fence keys the pairs counted tokens on (none for plain pairs), so a bench
    /// leaves nothing behind.
    fn forget_fences(&self) -> impl Future<Output = Result<()>> + Send;
}

/// A Redis-protocol floor (one node, or Redlock's N) whose pairs run plain or fenced on keys
/// of this run: its uncontended and many-names phases are [`uncontended`] and [`many_keys`].
pub(super) trait KeyedFloor: Sync {
    type Pairs: ForgetFences;

    /// The keys of this run.
    fn run_keys(&self) -> &RunKeys;

    /// Pairs on `keys`, fenced with a fence key per lock key.
    fn pairs_on(
        &self,
        keys: Vec<String>,
        fenced: bool,
    ) -> impl Future<Output = Result<Self::Pairs>> + Send;
}

/// `floor`'s pairs on one key, plain or fenced, for `duration`.
pub(super) async fn uncontended<F: KeyedFloor>(
    floor: &F,
    fenced: bool,
    duration: Duration,
) -> Result<Measured> {
    let what = if fenced { "fenced" } else { "floor" };
    let pairs = floor
        .pairs_on(vec![floor.run_keys().key(what)], fenced)
        .await?;
    let measured = pairs_of(&pairs, duration).await;
    pairs.forget_fences().await?;
    measured
}

/// `floor`'s pairs in `tasks` tasks, a key each, plain or fenced, for `duration`.
pub(super) async fn many_keys<F: KeyedFloor>(
    floor: &F,
    fenced: bool,
    tasks: usize,
    duration: Duration,
) -> Result<Throughput> {
    let what = if fenced { "fenced" } else { "parallel" };
    let keys = floor.run_keys().parallel(what, tasks);
    let pairs = Arc::new(floor.pairs_on(keys, fenced).await?);
    let run = many(pairs.clone(), tasks, duration).await;
    pairs.forget_fences().await?;
    run
}

/// Waits for a driver call at most `timeout`.
pub(super) async fn bounded<T>(
    backend: &'static str,
    timeout: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(|e| LockError::unavailable(backend, e)),
        Err(_) => Err(LockError::command_timeout(backend, timeout)),
    }
}

#[cfg(feature = "redis")]
pub(super) use single::Redis;

#[cfg(feature = "redis")]
mod single {
    use std::time::Duration;

    use dlock_api::{LockError, Result};
    use dlock_redis::{RedisConfig, Topology};
    use redis::aio::{ConnectionManager, ConnectionManagerConfig};
    use redis::cluster::ClusterConfig;
    use redis::cluster_async::ClusterConnection;
    use redis::{FromRedisValue, PushInfo, Script};
    use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

    use super::{
        COMPARE_AND_DELETE, DELETE_AND_PUBLISH, ForgetFences, KeyedFloor, LEASE_MS, RunKeys,
        bounded, fence_keys, many_keys, set_nx, token, uncontended,
    };
    use crate::contend::{Contender, contend};
    use crate::floor::{Measured, Ops, Pairs, Protocol, Throughput, contend_for_last_permit};

    const BACKEND: &str = "redis";

    /// Returns the next fencing token of fence key `KEYS[2]`, given `t`, the reply of `TIME`:
    /// above the last one and at least the server clock in microseconds. One `GETSET` in the
    /// common case; the ending of every fenced floor's acquire.
    macro_rules! return_token {
        () => {
            r"
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('GETSET', KEYS[2], t[1] .. string.sub('00000' .. t[2], -6))
local token = tonumber(last or '0') + 1
if token <= now then return now end
redis.call('SET', KEYS[2], string.format('%.0f', token))
return token
"
        };
    }

    /// Takes the lock key `KEYS[1]` for owner `ARGV[1]` for `ARGV[2]` ms if it is free, with a
    /// fencing token from fence key `KEYS[2]`; returns the token, or 0 when the key is taken: the
    /// acquire of a fenced pair. The token is above the last one and at least the server clock in
    /// microseconds (so it keeps rising if the fence key is lost), which is what dlock's Redis
    /// tokens promise: one `TIME` and one `GETSET` in the common case, the fewest that do.
    const FENCED_SET_NX: &str = concat!(
        r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local t = redis.call('TIME')
",
        return_token!()
    );

    /// One of `ARGV[3]` permits of the semaphore whose sorted set is `KEYS[1]` for owner
    /// `ARGV[1]` for `ARGV[2]` ms, scored on the server's clock, with a fencing token from fence
    /// key `KEYS[2]` taken as [`FENCED_SET_NX`] takes it; 0 when every permit is taken. What
    /// every permit's acquire must do on this algorithm: trim the ended leases, count, add.
    const PERMIT_ACQUIRE: &str = concat!(
        r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[1])
",
        return_token!()
    );

    /// Gives owner `ARGV[1]`'s permit of `KEYS[1]` back and, if it was there, announces it on
    /// channel `ARGV[2]`.
    const PERMIT_RELEASE: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
return redis.call('PUBLISH', ARGV[2], 'released') + 1
";

    /// Redis (single node, the primary behind Sentinels, or a Cluster), as a URL names it.
    #[derive(Debug)]
    pub(crate) struct Redis {
        config: RedisConfig,
        keys: RunKeys,
    }

    impl Redis {
        pub(crate) fn new(url: &str) -> Result<Self> {
            let config = RedisConfig::from_url(url)?;
            let keys = RunKeys {
                prefix: config.prefix.clone(),
            };
            Ok(Self { config, keys })
        }

        fn is_cluster(&self) -> bool {
            matches!(self.config.topology, Topology::Cluster { .. })
        }

        /// A client of the single node, or of the primary the Sentinels name.
        async fn primary_client(&self) -> Result<redis::Client> {
            let node = dlock_redis::driver::primary(&self.config).await?;
            dlock_redis::driver::node_client(&self.config, &node)
        }

        /// One multiplexed RESP3 connection (the primary's, behind Sentinels; the cluster's
        /// connection to every primary, in a Cluster), with its push messages sent to `push`.
        async fn connect(&self, push: Option<UnboundedSender<PushInfo>>) -> Result<Conn> {
            let config = &self.config;
            let within = config.connect_timeout.saturating_mul(3);
            if let Topology::Cluster { .. } = &config.topology {
                let client = dlock_redis::driver::cluster_client(config)?;
                let mut cluster_config = ClusterConfig::new();
                if let Some(push) = push {
                    cluster_config = cluster_config.set_push_sender(push);
                }
                let connecting = client.get_async_connection_with_config(cluster_config);
                return Ok(Conn::Cluster(bounded(BACKEND, within, connecting).await?));
            }
            let node = dlock_redis::driver::primary(config).await?;
            let client = dlock_redis::driver::node_client(config, &node)?;
            let mut manager = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.command_timeout))
                .set_number_of_retries(1)
                .set_max_delay(config.connect_timeout);
            if let Some(push) = push {
                manager = manager.set_push_sender(push);
            }
            let connecting = client.get_connection_manager_with_config(manager);
            Ok(Conn::Single(bounded(BACKEND, within, connecting).await?))
        }
    }

    /// One multiplexed connection: a single node's (or a Sentinel-managed primary's), or a
    /// Cluster's.
    #[derive(Clone)]
    enum Conn {
        Single(ConnectionManager),
        Cluster(ClusterConnection),
    }

    impl Conn {
        async fn query<T: FromRedisValue>(&self, timeout: Duration, cmd: &redis::Cmd) -> Result<T> {
            match self {
                Self::Single(conn) => {
                    bounded(BACKEND, timeout, cmd.query_async(&mut conn.clone())).await
                }
                Self::Cluster(conn) => {
                    bounded(BACKEND, timeout, cmd.query_async(&mut conn.clone())).await
                }
            }
        }

        /// `EVALSHA`, or `EVAL` when the server does not know the script.
        async fn run_script<T: FromRedisValue>(
            &self,
            timeout: Duration,
            script: &Script,
            key: &str,
            args: &[&str],
        ) -> Result<T> {
            self.run_script_on(timeout, script, &[key], args).await
        }

        /// [`run_script`](Self::run_script) with several keys.
        async fn run_script_on<T: FromRedisValue>(
            &self,
            timeout: Duration,
            script: &Script,
            keys: &[&str],
            args: &[&str],
        ) -> Result<T> {
            let mut invocation = script.prepare_invoke();
            for key in keys {
                invocation.key(*key);
            }
            for arg in args {
                invocation.arg(*arg);
            }
            match self {
                Self::Single(conn) => {
                    bounded(BACKEND, timeout, invocation.invoke_async(&mut conn.clone())).await
                }
                Self::Cluster(conn) => {
                    bounded(BACKEND, timeout, invocation.invoke_async(&mut conn.clone())).await
                }
            }
        }

        async fn subscribe(&self, timeout: Duration, channel: &str) -> Result<()> {
            match self {
                Self::Single(conn) => {
                    bounded(BACKEND, timeout, conn.clone().subscribe(channel)).await
                }
                Self::Cluster(conn) => {
                    bounded(BACKEND, timeout, conn.clone().subscribe(channel)).await
                }
            }
        }
    }

    /// Pairs on one connection, a key per task: plain (`SET NX PX`), or fenced
    /// ([`FENCED_SET_NX`], with a fence key per task); released by compare-and-delete.
    pub(crate) struct RedisPairs {
        conn: Conn,
        keys: Vec<String>,
        /// What fenced pairs take their tokens with.
        fenced: Option<Fenced>,
        script: Script,
        timeout: Duration,
    }

    /// The acquire of fenced pairs: the script, each task's fence key, and the lease argument,
    /// all made once so that the timed pairs do no more than the protocol's work.
    struct Fenced {
        acquire: Script,
        fences: Vec<String>,
        lease_ms: String,
    }

    impl Pairs for RedisPairs {
        async fn pair(&self, task: usize) -> Result<()> {
            let key = &self.keys[task];
            let token = token();
            match &self.fenced {
                None => {
                    let _: Option<String> =
                        self.conn.query(self.timeout, &set_nx(key, &token)).await?;
                }
                Some(fenced) => {
                    let keys = [key.as_str(), fenced.fences[task].as_str()];
                    let args = [token.as_str(), fenced.lease_ms.as_str()];
                    let taken: i64 = self
                        .conn
                        .run_script_on(self.timeout, &fenced.acquire, &keys, &args)
                        .await?;
                    if taken == 0 {
                        return Err(LockError::backend(
                            BACKEND,
                            format!("the fenced floor's key {key} was taken"),
                        ));
                    }
                }
            }
            let _: i64 = self
                .conn
                .run_script(self.timeout, &self.script, key, &[&token])
                .await?;
            Ok(())
        }
    }

    impl ForgetFences for RedisPairs {
        async fn forget_fences(&self) -> Result<()> {
            for fence in self.fenced.iter().flat_map(|fenced| &fenced.fences) {
                let mut del = redis::cmd("DEL");
                del.arg(fence);
                let _: i64 = self.conn.query(self.timeout, &del).await?;
            }
            Ok(())
        }
    }

    impl KeyedFloor for Redis {
        type Pairs = RedisPairs;

        fn run_keys(&self) -> &RunKeys {
            &self.keys
        }

        async fn pairs_on(&self, keys: Vec<String>, fenced: bool) -> Result<RedisPairs> {
            let fenced = fenced.then(|| Fenced {
                acquire: Script::new(FENCED_SET_NX),
                fences: fence_keys(&keys),
                lease_ms: LEASE_MS.to_string(),
            });
            Ok(RedisPairs {
                conn: self.connect(None).await?,
                keys,
                fenced,
                script: Script::new(COMPARE_AND_DELETE),
                timeout: self.config.command_timeout,
            })
        }
    }

    /// One connection contending for the key: `SET NX PX`, and on failure, waiting for the
    /// channel's next message; releasing with `DEL` and `PUBLISH` in one script.
    struct RawContender {
        conn: Conn,
        /// The connection's push messages: the channel's, and its subscription's confirmation
        /// (one spare wake-up).
        released: UnboundedReceiver<PushInfo>,
        key: String,
        channel: String,
        owner: String,
        release: Script,
        timeout: Duration,
    }

    impl Contender for RawContender {
        async fn lock(&mut self) -> Result<()> {
            loop {
                // Messages already here announced releases before this `SET`, which sees them.
                while self.released.try_recv().is_ok() {}
                let taken: Option<String> = self
                    .conn
                    .query(self.timeout, &set_nx(&self.key, &self.owner))
                    .await?;
                if taken.is_some() {
                    return Ok(());
                }
                // Bounded only so that a lost connection cannot hang the run.
                let _ = tokio::time::timeout(self.timeout, self.released.recv()).await;
            }
        }

        async fn unlock(&mut self) -> Result<()> {
            let _: i64 = self
                .conn
                .run_script(
                    self.timeout,
                    &self.release,
                    &self.key,
                    &[&self.channel, "released"],
                )
                .await?;
            Ok(())
        }
    }

    /// One connection's permits of one semaphore: [`PERMIT_ACQUIRE`], and [`PERMIT_RELEASE`].
    struct RawPermits {
        conn: Conn,
        /// The sorted set and the fence key.
        keys: [String; 2],
        channel: String,
        /// The lease and the number of permits, as the scripts take them.
        lease_ms: String,
        limit: String,
        acquire: Script,
        release: Script,
        timeout: Duration,
    }

    impl RawPermits {
        /// A permit for `owner`, if one is free.
        async fn take(&self, owner: &str) -> Result<bool> {
            let keys = [self.keys[0].as_str(), self.keys[1].as_str()];
            let args = [owner, self.lease_ms.as_str(), self.limit.as_str()];
            let token: i64 = self
                .conn
                .run_script_on(self.timeout, &self.acquire, &keys, &args)
                .await?;
            Ok(token != 0)
        }

        async fn give_back(&self, owner: &str) -> Result<()> {
            let _: i64 = self
                .conn
                .run_script(
                    self.timeout,
                    &self.release,
                    &self.keys[0],
                    &[owner, &self.channel],
                )
                .await?;
            Ok(())
        }

        /// Deletes the run's keys.
        async fn forget(&self) -> Result<()> {
            let mut del = redis::cmd("DEL");
            del.arg(&self.keys[0]).arg(&self.keys[1]);
            let _: i64 = self.conn.query(self.timeout, &del).await?;
            Ok(())
        }
    }

    impl Pairs for RawPermits {
        async fn pair(&self, _task: usize) -> Result<()> {
            let owner = token();
            if !self.take(&owner).await? {
                return Err(LockError::backend(
                    BACKEND,
                    format!("every permit of the floor's {} was taken", self.keys[0]),
                ));
            }
            self.give_back(&owner).await
        }
    }

    /// One connection contending for a permit: [`PERMIT_ACQUIRE`], and on failure, waiting for
    /// the channel's next message.
    struct PermitContender {
        permits: RawPermits,
        released: UnboundedReceiver<PushInfo>,
        owner: String,
    }

    impl Contender for PermitContender {
        async fn lock(&mut self) -> Result<()> {
            loop {
                while self.released.try_recv().is_ok() {}
                self.owner = token();
                if self.permits.take(&self.owner).await? {
                    return Ok(());
                }
                let timeout = self.permits.timeout;
                let _ = tokio::time::timeout(timeout, self.released.recv()).await;
            }
        }

        async fn unlock(&mut self) -> Result<()> {
            self.permits.give_back(&self.owner).await
        }
    }

    impl Redis {
        /// A connection's [`RawPermits`] of the run's semaphore `what` of `limit` permits, its
        /// push messages sent to `push`.
        async fn raw_permits(
            &self,
            what: &str,
            limit: u32,
            push: Option<UnboundedSender<PushInfo>>,
        ) -> Result<RawPermits> {
            let key = self.keys.key(what);
            Ok(RawPermits {
                conn: self.connect(push).await?,
                channel: format!("{key}:released"),
                keys: [format!("{key}:permits"), format!("{key}:fence")],
                lease_ms: LEASE_MS.to_string(),
                limit: limit.to_string(),
                acquire: Script::new(PERMIT_ACQUIRE),
                release: Script::new(PERMIT_RELEASE),
                timeout: self.config.command_timeout,
            })
        }
    }

    impl Protocol for Redis {
        fn ops(&self) -> Ops {
            Ops {
                pair: "SET NX PX + EVALSHA compare-and-delete",
                fenced_pair: Some(
                    "EVALSHA (SET NX PX, token: TIME, GETSET) + EVALSHA compare-and-delete",
                ),
                handoff: "DEL+PUBLISH, waiters race SET NX",
                client: "one multiplexed connection".to_owned(),
                // rslock takes a list of nodes: a single one, or the primary behind Sentinels.
                peer_pair: (!self.is_cluster()).then_some(crate::floor::rslock::PEER_PAIR),
            }
        }

        async fn peer_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
            if self.is_cluster() {
                return Ok(None);
            }
            crate::floor::rslock::pairs(vec![self.primary_client().await?], &self.keys, duration)
                .await
                .map(Some)
        }

        async fn peer_parallel(
            &self,
            tasks: usize,
            duration: Duration,
        ) -> Result<Option<Throughput>> {
            if self.is_cluster() {
                return Ok(None);
            }
            let primary = vec![self.primary_client().await?];
            crate::floor::rslock::parallel(primary, &self.keys, tasks, duration)
                .await
                .map(Some)
        }

        async fn pairs(&self, duration: Duration) -> Result<Measured> {
            uncontended(self, false, duration).await
        }

        async fn fenced_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
            uncontended(self, true, duration).await.map(Some)
        }

        /// `waiters` connections, each subscribed to the key's channel, run through the same
        /// contention loop as dlock's own phase: a holder deletes the key and publishes in one
        /// script, and the waiters, woken by the message, race to take the key with `SET NX PX`
        /// (the losers wait for the next message). A sample runs from a holder sending its
        /// release to the next holder's `SET` answered.
        async fn handoffs(
            &self,
            duration: Duration,
            waiters: usize,
            hold: Duration,
        ) -> Result<Vec<Duration>> {
            let key = self.keys.key("handoff");
            let channel = format!("{key}:released");
            let waiters = waiters.max(2);
            let mut contenders = Vec::with_capacity(waiters);
            for _ in 0..waiters {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
                let conn = self.connect(Some(tx)).await?;
                conn.subscribe(self.config.command_timeout, &channel)
                    .await?;
                contenders.push(RawContender {
                    conn,
                    released: rx,
                    key: key.clone(),
                    channel: channel.clone(),
                    owner: token(),
                    release: Script::new(DELETE_AND_PUBLISH),
                    timeout: self.config.command_timeout,
                });
            }
            let (samples, _) = contend(contenders, duration, hold).await?;
            Ok(samples)
        }

        async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
            let raw = self
                .raw_permits(&format!("permits-{permits}"), permits, None)
                .await?;
            let measured = crate::floor::pairs_of(&raw, duration).await;
            raw.forget().await?;
            measured.map(Some)
        }

        /// `permits - 1` permits held by one more connection throughout; `waiters`
        /// connections, each subscribed to the semaphore's channel, contend for the last one
        /// as the lock's floor does: a release announces, the woken waiters race.
        async fn permit_handoffs(
            &self,
            permits: u32,
            duration: Duration,
            (waiters, hold): (usize, Duration),
        ) -> Result<Option<Vec<Duration>>> {
            let what = format!("permit-handoff-{permits}");
            let parked = self.raw_permits(&what, permits, None).await?;
            for _ in 1..permits {
                parked.take(&token()).await?;
            }
            let contended = contend_for_last_permit(waiters, duration, hold, async || {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
                let permits = self.raw_permits(&what, permits, Some(tx)).await?;
                permits
                    .conn
                    .subscribe(self.config.command_timeout, &permits.channel)
                    .await?;
                Ok(PermitContender {
                    permits,
                    released: rx,
                    owner: String::new(),
                })
            })
            .await;
            parked.forget().await?;
            contended.map(Some)
        }

        async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
            many_keys(self, false, tasks, duration).await
        }

        async fn fenced_parallel(
            &self,
            tasks: usize,
            duration: Duration,
        ) -> Result<Option<Throughput>> {
            many_keys(self, true, tasks, duration).await.map(Some)
        }
    }
}
