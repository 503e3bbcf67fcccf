//! One multiplexed RESP3 connection per client (per runtime that uses it: see [`Driven`]), for
//! commands *and* subscriptions, in three topologies. Every command is bounded by the
//! configured command timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use dlock_api::raw::RuntimeLife;
use dlock_api::{LockError, Result};
use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterConfig;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, PushInfo, Script, ServerErrorKind};

use crate::config::{RedisConfig, Topology};
use crate::driven::{Connect, Driven, PushHandler};
use crate::driver::{self, find_primary, sentinel_client};
use crate::error::{map_err, timed_out};
use crate::eviction;

#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<Driven<ConnectionManager>>),
    Cluster(Arc<Driven<ClusterConnection>>),
    Sentinel(Arc<SentinelConn>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Single(_) => "Conn::Single",
            Self::Cluster(_) => "Conn::Cluster",
            Self::Sentinel(_) => "Conn::Sentinel",
        })
    }
}

/// The current primary behind a set of Sentinels; replaced when a command finds it gone or read-only.
pub(crate) struct SentinelConn {
    config: RedisConfig,
    push: PushHandler,
    /// The primary, and the connections to it (one per runtime that uses the client).
    current: RwLock<(String, Arc<Driven<ConnectionManager>>)>,
    /// Held while asking the Sentinels. Keeps the last primary the eviction check refused, when
    /// and why, so that commands failing meanwhile re-judge it at most once per
    /// [`REJUDGE_AFTER`] instead of each opening a connection to it.
    refresh: tokio::sync::Mutex<Option<Refused>>,
    /// The `+switch-master` watcher; stopped when the client goes away.
    watcher: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
    /// Set when the runtime that ran the watcher ended: the next command starts it on its own.
    watcher_ended: Arc<AtomicBool>,
}

/// A new primary the eviction check refused.
struct Refused {
    primary: String,
    at: std::time::Instant,
    reason: String,
}

/// How long a refused primary's refusal stands before the next failing command asks it again
/// (its policy may have been fixed).
const REJUDGE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for SentinelConn {
    fn drop(&mut self) {
        if let Some(watcher) = self
            .watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            watcher.abort();
        }
    }
}

fn manager_config(config: &RedisConfig, push: &PushHandler) -> ConnectionManagerConfig {
    let push = push.clone();
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
        .set_number_of_retries(1)
        .set_max_delay(config.connect_timeout)
        .set_push_sender(move |info: PushInfo| {
            push(info);
            Ok::<(), std::convert::Infallible>(())
        })
        .set_automatic_resubscription()
}

async fn manager_for(
    config: &RedisConfig,
    node: &str,
    push: &PushHandler,
) -> Result<ConnectionManager> {
    let client = driver::node_client(config, node)?;
    let connecting = client.get_connection_manager_with_config(manager_config(config, push));
    // The driver retries a failed connect; bound the whole attempt so a dead server fails promptly.
    match tokio::time::timeout(config.connect_timeout.saturating_mul(3), connecting).await {
        Ok(result) => result.map_err(map_err),
        Err(_) => Err(timed_out(config.connect_timeout.saturating_mul(3))),
    }
}

/// Runs `command` on this runtime's Cluster connection. A Cluster connection that found no node
/// (every node was down at once) may go on answering `ClusterConnectionNotFound` after the nodes
/// are back, with no slot map left to repair from: it is dropped then, and the next command
/// connects anew from the configured nodes, so the client comes back by itself.
async fn on_cluster<T, F>(
    cluster: &Driven<ClusterConnection>,
    command: impl FnOnce(ClusterConnection) -> F,
) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    let result = cluster.send(command).await;
    if let Err(error) = &result
        && error
            .source_as::<redis::RedisError>()
            .is_some_and(|e| e.kind() == redis::ErrorKind::ClusterConnectionNotFound)
    {
        tracing::debug!("redis: a Cluster connection that reaches no node is made anew");
        cluster.forget_current();
    }
    result
}

async fn cluster_for(config: &RedisConfig, push: PushHandler) -> Result<ClusterConnection> {
    let client = driver::cluster_client(config)?;
    let cluster_config = ClusterConfig::new().set_push_sender(move |info: PushInfo| {
        push(info);
        Ok::<(), std::convert::Infallible>(())
    });
    let connecting = client.get_async_connection_with_config(cluster_config);
    match tokio::time::timeout(config.connect_timeout.saturating_mul(3), connecting).await {
        Ok(result) => result.map_err(map_err),
        Err(_) => Err(timed_out(config.connect_timeout.saturating_mul(3))),
    }
}

/// Follows failovers as they are announced: subscribes to a Sentinel's `+switch-master` channel
/// and re-resolves the primary on every announcement (and once after each (re)subscription, in
/// case one was missed). Without this, a client could keep writing to a demoted primary that has
/// not yet been told to replicate, for as long as Sentinel takes to reconfigure it.
async fn watch_switches(conn: std::sync::Weak<SentinelConn>, sentinels: Vec<String>) {
    use futures::StreamExt;
    loop {
        for sentinel in &sentinels {
            let Some(config) = conn.upgrade().map(|c| c.config.clone()) else {
                return;
            };
            let timeout = config.connect_timeout;
            let subscribed = async {
                let client = sentinel_client(&config, sentinel)?;
                let mut pubsub = client.get_async_pubsub().await.map_err(map_err)?;
                pubsub.subscribe("+switch-master").await.map_err(map_err)?;
                Ok::<_, LockError>(pubsub)
            };
            let Ok(Ok(mut pubsub)) = tokio::time::timeout(timeout, subscribed).await else {
                continue;
            };
            let mut messages = pubsub.on_message();
            loop {
                let Some(current) = conn.upgrade() else {
                    return;
                };
                if let Err(error) = current.refresh().await {
                    tracing::debug!(%error, "redis sentinel: could not refresh the primary");
                }
                drop(current);
                if messages.next().await.is_none() {
                    break;
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// How connections to `primary` are made, on each runtime that needs one.
fn to_primary(
    config: &RedisConfig,
    primary: &str,
    push: &PushHandler,
) -> Connect<ConnectionManager> {
    let (config, primary, push) = (config.clone(), primary.to_owned(), push.clone());
    Box::new(move || {
        let (config, primary, push) = (config.clone(), primary.clone(), push.clone());
        Box::pin(async move { manager_for(&config, &primary, &push).await })
    })
}

impl SentinelConn {
    /// Runs `command` on this runtime's connection to the primary (see [`Driven`]), first
    /// starting the failover watcher on this runtime if the one that ran it has ended.
    async fn send<T, F>(self: &Arc<Self>, command: impl FnOnce(ConnectionManager) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        if self.watcher_ended.load(Ordering::Acquire) {
            self.watch();
        }
        self.primary().send(command).await
    }

    /// The connections to the current primary.
    fn primary(&self) -> Arc<Driven<ConnectionManager>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Starts the `+switch-master` watcher on this runtime, stopping the last one.
    fn watch(self: &Arc<Self>) {
        let Topology::Sentinel { sentinels, .. } = &self.config.topology else {
            return;
        };
        let watcher = tokio::spawn(watch_switches(Arc::downgrade(self), sentinels.clone()));
        self.watcher_ended.store(false, Ordering::Release);
        if let Some(life) = RuntimeLife::current() {
            let ended = self.watcher_ended.clone();
            life.on_stop(move || ended.store(true, Ordering::Release));
        }
        let mut slot = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(last) = slot.replace(watcher.abort_handle()) {
            last.abort();
        }
    }

    /// Asks the Sentinels again and switches to the primary they name, if it moved and passes
    /// the eviction check (a refused one is not used: commands keep failing on the old primary).
    async fn refresh(&self) -> Result<()> {
        let Topology::Sentinel { sentinels, master } = &self.config.topology else {
            return Ok(());
        };
        let mut refused = self.refresh.lock().await;
        let primary = find_primary(&self.config, sentinels, master).await?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == primary {
            return Ok(());
        }
        if let Some(last) = refused.as_ref() {
            if last.primary == primary && last.at.elapsed() < REJUDGE_AFTER {
                return Err(LockError::Config {
                    backend: crate::BACKEND,
                    reason: last.reason.clone(),
                });
            }
        }
        let manager = manager_for(&self.config, &primary, &self.push).await?;
        // The new primary is judged as the first one was at connect: a replica configured to
        // evict would otherwise take over the locks unchecked.
        let mut asking = manager.clone();
        let asked = async {
            let settings = bounded(
                self.config.command_timeout,
                eviction::settings_query().send(&mut asking),
            )
            .await?;
            Ok(vec![(primary.clone(), settings)])
        };
        if let Err(error) = eviction::judge(self.config.eviction_check, asked).await {
            tracing::error!(%error, %primary, "redis sentinel: not switching to the new primary");
            if let LockError::Config { reason, .. } = &error {
                *refused = Some(Refused {
                    primary,
                    at: std::time::Instant::now(),
                    reason: reason.clone(),
                });
            }
            return Err(error);
        }
        *refused = None;
        tracing::info!(%primary, "redis sentinel: switching to the new primary");
        let connections = Driven::adopting(
            manager,
            to_primary(&self.config, &primary, &self.push),
            self.push.clone(),
        );
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (primary, Arc::new(connections));
        // The new connection has no subscriptions: make every waiter re-check and re-subscribe.
        (self.push)(PushInfo {
            kind: redis::PushKind::Disconnection,
            data: Vec::new(),
        });
        Ok(())
    }
}

impl Conn {
    /// Connects as `config` says (a single node, the primary behind Sentinels, or a Cluster).
    pub(crate) async fn connect(config: &RedisConfig, push: PushHandler) -> Result<Self> {
        match &config.topology {
            Topology::Single { node } => {
                let (config, node, handler) = (config.clone(), node.clone(), push.clone());
                let connect: Connect<ConnectionManager> = Box::new(move || {
                    let (config, node, handler) = (config.clone(), node.clone(), handler.clone());
                    Box::pin(async move { manager_for(&config, &node, &handler).await })
                });
                Ok(Self::Single(Arc::new(
                    Driven::connect(connect, push).await?,
                )))
            }
            Topology::Sentinel { sentinels, master } => {
                let primary = find_primary(config, sentinels, master).await?;
                let manager = manager_for(config, &primary, &push).await?;
                let connections =
                    Driven::adopting(manager, to_primary(config, &primary, &push), push.clone());
                let conn = Arc::new(SentinelConn {
                    config: config.clone(),
                    push,
                    current: RwLock::new((primary, Arc::new(connections))),
                    refresh: tokio::sync::Mutex::new(None),
                    watcher: std::sync::Mutex::new(None),
                    watcher_ended: Arc::new(AtomicBool::new(false)),
                });
                conn.watch();
                Ok(Self::Sentinel(conn))
            }
            Topology::Cluster { .. } => {
                let (config, handler) = (config.clone(), push.clone());
                let connect: Connect<ClusterConnection> = Box::new(move || {
                    let (config, handler) = (config.clone(), handler.clone());
                    Box::pin(async move { cluster_for(&config, handler).await })
                });
                Ok(Self::Cluster(Arc::new(
                    Driven::connect(connect, push).await?,
                )))
            }
        }
    }

    /// Whether a command may reach the server twice: a Cluster client sends a command again
    /// after a lost connection or a redirection, and a Sentinel connection a release after a
    /// failover ([`follows_failover`](Self::follows_failover)). A single node's connection
    /// sends each command once.
    pub(crate) fn may_resend(&self) -> bool {
        !matches!(self, Self::Single(_))
    }

    /// Whether keys go to the server of their hash slot, so that one script may take only
    /// keys of one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Whether a failed command makes this connection look for a new primary (Sentinel), so
    /// that an idempotent command may be sent once more.
    pub(crate) fn follows_failover(&self) -> bool {
        matches!(self, Self::Sentinel(_))
    }

    /// Runs `script`: `EVALSHA`, and when the server does not know the script (a restart, a
    /// `SCRIPT FLUSH`, a failover) `SCRIPT LOAD` and `EVALSHA` again.
    pub(crate) async fn run_script<T: FromRedisValue>(
        &self,
        timeout: std::time::Duration,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T> {
        self.send_script(timeout, script, &evalsha(script, keys, args))
            .await
    }

    /// Sends `cmd` (an `EVALSHA` of `script`) to the deployment's primary, loading the script
    /// where the server does not know it, within `timeout`; a Sentinel deployment asks for its
    /// primary again after a failure that may mean it moved.
    async fn send_script<T: FromRedisValue>(
        &self,
        timeout: std::time::Duration,
        script: &Script,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        match self {
            Self::Single(manager) => {
                manager
                    .send(|mut conn| async move {
                        bounded(timeout, invoke(cmd, script, &mut conn)).await
                    })
                    .await
            }
            Self::Cluster(cluster) => {
                on_cluster(cluster, |mut conn| async move {
                    bounded(timeout, invoke(cmd, script, &mut conn)).await
                })
                .await
            }
            Self::Sentinel(sentinel) => {
                let result = sentinel
                    .send(|mut conn| async move {
                        bounded(timeout, invoke(cmd, script, &mut conn)).await
                    })
                    .await;
                if result.as_ref().is_err_and(LockError::is_retryable) {
                    // Boxed: asking the Sentinels is a large future, and in place it would make
                    // every script call's future (and each lock operation's) as large.
                    if let Err(error) = Box::pin(sentinel.refresh()).await {
                        tracing::debug!(%error, "redis sentinel: could not refresh the primary");
                    }
                }
                result
            }
        }
    }

    /// [`run_script`](Self::run_script) with arguments that are bytes (a leader's value), not
    /// text.
    pub(crate) async fn run_script_bytes<T: FromRedisValue>(
        &self,
        timeout: std::time::Duration,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<T> {
        self.send_script(timeout, script, &evalsha(script, keys, args))
            .await
    }

    /// Runs a plain command, or a pipeline of them (in one write, its replies in one vector).
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        timeout: std::time::Duration,
        request: &impl Request,
    ) -> Result<T> {
        match self {
            Self::Single(manager) => {
                manager
                    .send(|mut conn| async move { bounded(timeout, request.send(&mut conn)).await })
                    .await
            }
            Self::Cluster(cluster) => {
                on_cluster(cluster, |mut conn| async move {
                    bounded(timeout, request.send(&mut conn)).await
                })
                .await
            }
            Self::Sentinel(sentinel) => {
                sentinel
                    .send(|mut conn| async move { bounded(timeout, request.send(&mut conn)).await })
                    .await
            }
        }
    }

    /// `INFO section`, or `None` where the server refuses it (an ACL, a proxy that hides it): what
    /// it would have told is then not checked. A server that does not answer is an error.
    pub(crate) async fn info(
        &self,
        timeout: std::time::Duration,
        section: &str,
    ) -> Result<Option<String>> {
        match self.query(timeout, redis::cmd("INFO").arg(section)).await {
            Ok(info) => Ok(Some(info)),
            Err(error @ LockError::Unavailable { .. }) => Err(error),
            Err(error) => {
                tracing::info!(%error, section, "redis: cannot read INFO; not checked");
                Ok(None)
            }
        }
    }

    /// Runs `cmd` on every primary of a Cluster, or on the one server otherwise: each server's
    /// reply, named by its address (the node's `host:port`; empty for a single server).
    pub(crate) async fn query_every_primary<T: FromRedisValue>(
        &self,
        timeout: std::time::Duration,
        cmd: &redis::Cmd,
    ) -> Result<Vec<(String, T)>> {
        let Self::Cluster(cluster) = self else {
            return Ok(vec![(String::new(), self.query(timeout, cmd).await?)]);
        };
        use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let replies = on_cluster(cluster, |mut conn| async move {
            bounded(timeout, conn.route_command(cmd.clone(), every)).await
        })
        .await?;
        let by_node: Vec<(String, redis::Value)> =
            redis::from_redis_value(replies).map_err(|e| map_err(e.into()))?;
        by_node
            .into_iter()
            .map(|(node, reply)| {
                Ok((
                    node,
                    redis::from_redis_value(reply).map_err(|e| map_err(e.into()))?,
                ))
            })
            .collect()
    }

    pub(crate) async fn subscribe(
        &self,
        timeout: std::time::Duration,
        channel: &str,
    ) -> Result<()> {
        match self {
            Self::Single(manager) => {
                manager
                    .send(|mut conn| async move { bounded(timeout, conn.subscribe(channel)).await })
                    .await
            }
            Self::Cluster(cluster) => {
                on_cluster(cluster, |mut conn| async move {
                    bounded(timeout, conn.subscribe(channel)).await
                })
                .await
            }
            Self::Sentinel(sentinel) => {
                sentinel
                    .send(|mut conn| async move { bounded(timeout, conn.subscribe(channel)).await })
                    .await
            }
        }
    }

    /// Unsubscribes `channel` on the connection of every runtime that still runs: a waiter of
    /// any of them may have subscribed it there.
    pub(crate) async fn unsubscribe(
        &self,
        timeout: std::time::Duration,
        channel: &str,
    ) -> Result<()> {
        let unsubscribe = |mut conn: ConnectionManager| async move {
            bounded(timeout, conn.unsubscribe(channel)).await
        };
        match self {
            Self::Single(manager) => manager.send_everywhere(unsubscribe).await,
            Self::Cluster(cluster) => {
                cluster
                    .send_everywhere(|mut conn| async move {
                        bounded(timeout, conn.unsubscribe(channel)).await
                    })
                    .await
            }
            Self::Sentinel(sentinel) => sentinel.primary().send_everywhere(unsubscribe).await,
        }
    }
}

/// What [`Conn::query`] sends: a command or a pipeline.
pub(crate) trait Request: Sync {
    fn send<T: FromRedisValue>(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> impl std::future::Future<Output = redis::RedisResult<T>> + Send;
}

impl Request for Cmd {
    fn send<T: FromRedisValue>(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> impl std::future::Future<Output = redis::RedisResult<T>> + Send {
        self.query_async(conn)
    }
}

impl Request for redis::Pipeline {
    fn send<T: FromRedisValue>(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> impl std::future::Future<Output = redis::RedisResult<T>> + Send {
        self.query_async(conn)
    }
}

/// `EVALSHA sha numkeys keys.. args..`, written straight into one command buffer: the driver's
/// `ScriptInvocation` copies every key and argument into a vector of its own first, which on the
/// acquire and release path cost more allocations than the rest of the client together.
fn evalsha<A: AsRef<[u8]>>(script: &Script, keys: &[&str], args: &[A]) -> Cmd {
    let data = keys
        .iter()
        .map(|key| key.len())
        .chain(args.iter().map(|arg| arg.as_ref().len()))
        .fold(0usize, usize::saturating_add);
    let mut cmd = Cmd::with_capacity(
        keys.len().saturating_add(args.len()).saturating_add(3),
        data.saturating_add(64),
    );
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(arg.as_ref());
    }
    cmd
}

/// Sends `cmd` (an `EVALSHA` of `script`), loading the script first if the server lost it.
async fn invoke<T: FromRedisValue>(
    cmd: &Cmd,
    script: &Script,
    conn: &mut impl ConnectionLike,
) -> redis::RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            // Boxed, as rare: in place, loading would grow every script call's future.
            Box::pin(async {
                script.load_async(conn).await?;
                cmd.query_async(conn).await
            })
            .await
        }
        done => done,
    }
}

/// `future` bounded by `timeout`, its error mapped. A plain function rather than an `async fn`:
/// an `async fn` keeps its argument in its state beside the timeout that wraps it, which would
/// double the size of every command's future.
fn bounded<T>(
    timeout: std::time::Duration,
    future: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> impl std::future::Future<Output = Result<T>> {
    use futures::FutureExt;
    tokio::time::timeout(timeout, future).map(move |bounded| match bounded {
        Ok(result) => result.map_err(map_err),
        Err(_) => Err(timed_out(timeout)),
    })
}
