//! One Redis node's lock primitives, without the single-node grant queue: the building blocks
//! of multi-node algorithms (Redlock, `dlock-redlock`).
//!
//! Each call is one round trip (a script, or plain commands in one pipeline), bounded by the
//! timeout it is given (Redlock derives a short per-node timeout from the TTL, so one frozen node
//! never stalls an acquire):
//! - [`Node::try_lock`]: `SET lock owner NX PX ttl` and, when set, the next per-name fencing
//!   token (the node's counter plus one); when busy, the holder and its remaining TTL. Whether a
//!   busy attempt advances the counter too, for less work on the node, is the caller's choice
//!   ([`Counting`]); a round that asks every node the same builds the request once
//!   ([`AttemptRequest`]) and sends it to each ([`Node::send_attempt`]);
//! - [`Node::unlock`]: delete the lock only if `owner` holds it; [`Node::release`] does the same
//!   and announces it on the name's channel;
//! - [`Node::extend`]: reset the TTL only if `owner` holds it;
//! - [`Node::raise_fence`]: raise the per-name counter to at least a token, so the next token
//!   from this node is above every token the quorum handed out; [`Node::raise_fence_if_held`]
//!   does it only while `owner` still holds the lock there;
//! - [`Node::subscribe`]: listen to a name's channel; messages and lost connections reach the
//!   handler given to [`Node::connect_with_events`];
//! - [`Node::watch_held`]: mark a held lock as watched by its holder, whom [`Node::try_lock`]
//!   then tells ([`NodeEvent::HolderLost`] on [`Node::held_by_channel`]) when it takes the lock
//!   after the holder's key went (expired, deleted, lost with a restart);
//! - [`Node::line_check`]: join the name's waiting line, or keep one's place in it, and learn
//!   whether one is first; [`Node::line_leave`]: leave it.
//!
//! Every call on one `Node` rides one multiplexed connection, so the node runs them in the order
//! they were sent: an unlock sent after a `try_lock` whose reply timed out still runs after it.
//!
//! The grant queue of [`RedisLock`](crate::RedisLock) is deliberately not here: on N independent
//! nodes it would hand the lock to different waiters on different nodes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::LockError;
use dlock_api::{LockName, Result};
use redis::{PushInfo, PushKind, Script, Value};

use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::keys::LockKeys;
use crate::scripts::{
    EXTEND, EXTEND_MANY, FENCE_KEEP_MS_ARG, INSPECT, NODE_ACQUIRE, NODE_LINE_CHECK,
    NODE_RAISE_FENCE, NODE_RAISE_FENCE_HELD, NODE_RELEASE, NODE_RELEASE_ANNOUNCED, NODE_WATCH_HELD,
};

/// What a takeover tells a watching holder on its client's channel: `lost OWNER`.
const HOLDER_LOST: &str = "lost ";

/// A connection to one Redis node (or Sentinel-managed primary) and its lock primitives.
pub struct Node {
    config: RedisConfig,
    conn: Conn,
    acquire: Script,
    release: Script,
    release_announced: Script,
    extend: Script,
    extend_many: Script,
    raise: Script,
    raise_held: Script,
    inspect: Script,
    line_check: Script,
    watch_held: Script,
    /// `PREFIX:held-by:`: a client's watch channel is this and its id.
    held_by: String,
}

/// What a node tells its event handler ([`Node::connect_with_events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeEvent<'a> {
    /// A message on a subscribed channel.
    Message {
        /// The channel.
        channel: &'a str,
        /// The message.
        payload: &'a str,
    },
    /// A holder watching its lock ([`Node::watch_held`]) lost its key on this node: someone
    /// took the lock after the key went. Sent on [`Node::held_by_channel`] of the holder's
    /// client.
    HolderLost {
        /// The watching holder's owner value.
        owner: &'a str,
    },
    /// The connection was lost: messages sent meanwhile were missed. The connection comes back
    /// by itself and subscribes again.
    Disconnected,
}

/// What [`Node::inspect`] read of one name on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeView {
    /// The holder's owner value, if the lock is held on this node.
    pub holder: Option<String>,
    /// The lock's remaining TTL on this node; `None` when free or when the key has no TTL (not a
    /// dlock key).
    pub pttl: Option<Duration>,
    /// The node's fence counter for the name (the last token it handed out); `None` if it never
    /// handed one out.
    pub fence: Option<u64>,
    /// Live waiters in the name's queue on this node (only the single-node backend queues).
    pub waiters: usize,
    /// Readers sharing the name while their leases last (the reader-writer lock of
    /// `RedisLock`; Redlock has none); 0 while a writer holds it.
    pub readers: usize,
    /// How many of the [`waiters`](Self::waiters) wait to read.
    pub waiting_readers: usize,
}

/// Runs the inspect script for `keys` on `conn`.
pub(crate) async fn inspect_on(
    conn: &Conn,
    script: &Script,
    keys: &LockKeys,
    timeout: Duration,
) -> Result<NodeView> {
    let reply: Vec<Value> = conn
        .run_script(
            timeout,
            script,
            &[
                &keys.lock,
                &keys.fence,
                &keys.queue,
                &keys.waiters,
                &keys.permits(),
            ],
            &[],
        )
        .await?;
    let count = |n: &i64| usize::try_from(*n).unwrap_or(0);
    match reply.as_slice() {
        [
            holder,
            Value::Int(pttl),
            fence,
            Value::Int(waiters),
            Value::Int(readers),
            Value::Int(waiting_readers),
        ] => {
            let holder = text(holder).unwrap_or_default();
            let fence = text(fence).unwrap_or_default();
            Ok(NodeView {
                holder: (!holder.is_empty()).then(|| holder.to_owned()),
                pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                fence: fence.parse().ok(),
                waiters: count(waiters),
                readers: count(readers),
                waiting_readers: count(waiting_readers),
            })
        }
        other => Err(LockError::unexpected(
            crate::BACKEND,
            format!("unexpected inspect reply {other:?}"),
        )),
    }
}

/// Receives a node's [`NodeEvent`]s; called on the connection's task, so it must not block.
pub type NodeEventHandler = Arc<dyn Fn(NodeEvent<'_>) + Send + Sync>;

/// The answer of [`Node::try_lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeAttempt {
    /// The lock was free and is now the caller's, with this fencing token.
    Taken {
        /// The node's fence counter after the grant.
        token: u64,
    },
    /// Someone holds the lock.
    Busy {
        /// The holder's owner value.
        holder: String,
        /// The holder's remaining TTL; `None` when the key has none (not a dlock key).
        pttl: Option<Duration>,
    },
}

/// When a node acquire ([`Node::try_lock`]) advances the name's fence counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counting {
    /// Only when it takes the lock: one Lua script, `SET NX PX` and, when set, `INCR`. For an
    /// attempt that may reach only some of the nodes (a waiter's), so that the counters of nodes
    /// which saw the same grants stay equal.
    OnGrant,
    /// On every attempt, taken or busy: plain commands in one pipeline, `SET NX PX GET` (which
    /// answers who holds it, when busy), `INCR`, then `PTTL` of the lock. Redis 7.0 spends
    /// about 2 µs on the three against 7–8 µs on the script (`INFO commandstats`; every script pays for
    /// setting up its Lua call), which on N nodes sharing a machine is most of what an
    /// uncontended acquire costs beyond a bare `SET`. The counter can then stand above the
    /// holder's token until the next grant; tokens still rise with every grant (a grant's `INCR`
    /// runs after its `SET`, and so after the previous holder's release or expiry on this
    /// node). For a first attempt sent to every node at once, which advances every counter
    /// alike.
    ///
    /// ```no_run
    /// # async fn first_round(nodes: &[dlock_redis::node::Node]) -> dlock_api::Result<()> {
    /// use std::time::Duration;
    /// use dlock_redis::node::{Counting, NodeAttempt};
    ///
    /// let name = dlock_api::LockName::new("orders/42")?;
    /// let (ttl, timeout) = (Duration::from_secs(10), Duration::from_millis(50));
    /// for node in nodes {
    ///     let keys = node.keys(&name);
    ///     let floor = dlock_redis::node::fence_floor();
    ///     match node.try_lock(&keys, "owner-1", ttl, floor, timeout, Counting::EveryAttempt).await? {
    ///         NodeAttempt::Taken { token } => println!("taken with token {token}"),
    ///         NodeAttempt::Busy { holder, pttl } => println!("{holder} holds it for {pttl:?}"),
    ///         other => println!("{other:?}"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    EveryAttempt,
    /// As [`EveryAttempt`](Self::EveryAttempt), one command less: a busy answer does not say
    /// how long the holder has left (its `pttl` is `None`). For an attempt that does not wait
    /// on the holder's expiry: an uncontended acquire's first attempt, the most frequent of all.
    EveryAttemptUntimed,
}

/// Where a node's fence counter that does not exist starts ([`Node::try_lock`]'s `floor`): this
/// client's wall clock in microseconds, cut to the millisecond. Read it once per round and hand
/// the same value to every node, so that their counters start alike and a quorum agrees on the
/// first token (read per node, a round that straddles a millisecond would start them apart, and
/// the grant would have to write its token back).
///
/// A counter is lost when its node restarts without persistence (or the counter expires):
/// started again from the clock, it is above every token the old one handed out, which
/// counted up by one per grant from an earlier clock reading (a grant takes far more than a
/// microsecond), provided the clocks of the clients that start counters disagree by less than
/// the time between the old counter's start and its loss.
pub fn fence_floor() -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since_epoch.as_millis())
        .unwrap_or(u64::MAX)
        .saturating_mul(1000)
}

fn unexpected_acquire(reply: &impl std::fmt::Debug) -> LockError {
    LockError::unexpected(
        crate::BACKEND,
        format!("unexpected node acquire reply {reply:?}"),
    )
}

/// [`Counting::EveryAttempt`]'s acquire: `SET NX PX GET` (nil when it set the key, else the
/// holder's value: Redis 7.0 takes `NX` with `GET`), `SET NX PX` of the counter at `floor` (a
/// counter that does not exist starts there, for ten minutes), `INCR` (which keeps its
/// expiry), the watch mark (`GET`: read after the `SET`, so when it took the lock the mark is
/// a former holder's, whom [`Node::try_lock`] then tells), and `PTTL` when `timed`.
fn acquire_pipeline(
    keys: &LockKeys,
    owner: &str,
    ttl_ms: &str,
    floor: &str,
    timed: bool,
) -> redis::Pipeline {
    let mut pipe = redis::Pipeline::with_capacity(5);
    pipe.add_command(sized_cmd(&[
        "SET", &keys.lock, owner, "NX", "PX", ttl_ms, "GET",
    ]))
    .add_command(sized_cmd(&[
        "SET",
        &keys.fence,
        floor,
        "NX",
        "PX",
        FENCE_KEEP_MS_ARG,
    ]))
    .add_command(sized_cmd(&["INCR", &keys.fence]))
    .add_command(sized_cmd(&["GET", &keys.watch]));
    if timed {
        pipe.add_command(sized_cmd(&["PTTL", &keys.lock]));
    }
    pipe
}

/// A command of `args`, its buffers sized once: the driver's `cmd(..).arg(..)` grows them an
/// argument at a time, which cost a reallocation or two per argument.
fn sized_cmd(args: &[&str]) -> redis::Cmd {
    let bytes = args
        .iter()
        .map(|arg| arg.len())
        .fold(0, usize::saturating_add);
    let mut cmd = redis::Cmd::with_capacity(args.len(), bytes);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// One node acquire ([`Node::try_lock`]), built once and sent to each node of a round: a round
/// sends every node the same keys, owner, TTL and counter floor, so the commands are made once,
/// not once per node.
#[derive(Debug)]
pub struct AttemptRequest {
    ttl_ms: String,
    floor: String,
    /// The commands of a counting-every-attempt acquire.
    pipeline: Option<redis::Pipeline>,
}

impl AttemptRequest {
    /// The request of [`Node::try_lock`] with these arguments.
    pub fn new(
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        floor: u64,
        counting: Counting,
    ) -> Self {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let floor = floor.to_string();
        let pipeline = match counting {
            Counting::OnGrant => None,
            Counting::EveryAttempt | Counting::EveryAttemptUntimed => Some(acquire_pipeline(
                keys,
                owner,
                &ttl_ms,
                &floor,
                counting == Counting::EveryAttempt,
            )),
        };
        Self {
            ttl_ms,
            floor,
            pipeline,
        }
    }
}

impl NodeAttempt {
    /// The answer of the node acquire script ([`Counting::OnGrant`]).
    fn from_script(reply: &Value) -> Result<Self> {
        let busy = match reply {
            Value::Int(token) if *token > 0 => return Ok(Self::taken(*token)),
            Value::Array(busy) => busy.as_slice(),
            _ => &[],
        };
        match busy {
            [Value::Int(0), Value::Int(pttl), holder] => Ok(Self::busy(holder, *pttl)),
            _ => Err(unexpected_acquire(reply)),
        }
    }

    /// The answer of [`acquire_pipeline`] ([`Counting::EveryAttempt`]), and the watch mark of
    /// the holder whose key it took over, if any.
    fn from_pipeline(replies: &[Value]) -> Result<(Self, Option<&str>)> {
        // The fence's `SET NX` answers too, unread: a pipeline that drops a reply has the
        // driver rebuild the vector of replies to drop it.
        match replies {
            [Value::Nil, _, Value::Int(token), mark, ..] if *token > 0 => {
                Ok((Self::taken(*token), text(mark)))
            }
            // The holder the `SET` found, and its lease read right after (`-2`: it released in
            // between; `-1`: a key without TTL, not dlock's).
            [
                holder @ Value::BulkString(_),
                _,
                Value::Int(_),
                _,
                Value::Int(pttl),
            ] => Ok((Self::busy(holder, *pttl), None)),
            [holder @ Value::BulkString(_), _, Value::Int(_), _] => {
                Ok((Self::busy(holder, -1), None))
            }
            _ => Err(unexpected_acquire(&replies)),
        }
    }

    /// Taken, with the token the node's counter returned.
    fn taken(token: i64) -> Self {
        Self::Taken {
            token: token as u64,
        }
    }

    /// Busy, from the holder's value and its `PTTL` as the node replied them (a negative PTTL:
    /// no lease to wait out).
    fn busy(holder: &Value, pttl: i64) -> Self {
        Self::Busy {
            holder: text(holder).unwrap_or_default().to_owned(),
            pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        }
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

impl Node {
    /// Connects to the node `config` names.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if it does not answer within
    /// the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        Self::connect_with_events(config, Arc::new(|_| {})).await
    }

    /// Connects to the node `config` names, handing its channel messages and lost connections
    /// to `events`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub async fn connect_with_events(
        config: RedisConfig,
        events: NodeEventHandler,
    ) -> Result<Self> {
        let held_by = format!("{}:held-by:", config.prefix);
        let watch_prefix = held_by.clone();
        let push = Arc::new(move |info: PushInfo| match info.kind {
            PushKind::Message | PushKind::SMessage => {
                if let (Some(channel), Some(payload)) = (
                    info.data.first().and_then(text),
                    info.data.get(1).and_then(text),
                ) {
                    match payload.strip_prefix(HOLDER_LOST) {
                        Some(owner) if channel.starts_with(&watch_prefix) => {
                            events(NodeEvent::HolderLost { owner })
                        }
                        _ => events(NodeEvent::Message { channel, payload }),
                    }
                }
            }
            PushKind::Disconnection => events(NodeEvent::Disconnected),
            _ => {}
        });
        let conn = crate::connect::connect_checked(&config, push).await?;
        Ok(Self {
            config,
            conn,
            acquire: Script::new(NODE_ACQUIRE),
            release: Script::new(NODE_RELEASE),
            release_announced: Script::new(NODE_RELEASE_ANNOUNCED),
            extend: Script::new(EXTEND),
            extend_many: Script::new(EXTEND_MANY),
            raise: Script::new(NODE_RAISE_FENCE),
            raise_held: Script::new(NODE_RAISE_FENCE_HELD),
            inspect: Script::new(INSPECT),
            line_check: Script::new(NODE_LINE_CHECK),
            watch_held: Script::new(NODE_WATCH_HELD),
            held_by,
        })
    }

    /// Why this node is not an independent primary, or `None` when it is: a replica (`role:
    /// slave`: it refuses writes, and its data is another node's), or a primary with replicas
    /// attached (`connected_slaves` above 0: a failover can put a replica that missed a grant in
    /// its place). A server that denies `INFO` cannot be judged and is taken as it is.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if the node does not answer
    /// within the command timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn replication_hazard(&self) -> Result<Option<String>> {
        Ok(self
            .info("replication")
            .await?
            .and_then(|info| replication_hazard(&info)))
    }

    /// The server's `run_id` (from `INFO server`): the same for every address of one server
    /// process, so a caller can tell that two addresses reach the same server. `None` where the
    /// server does not say (a proxy that hides `INFO`).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if the node does not answer within the command timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn run_id(&self) -> Result<Option<String>> {
        Ok(self
            .info("server")
            .await?
            .and_then(|info| info_field(&info, "run_id").map(str::to_owned)))
    }

    async fn info(&self, section: &str) -> Result<Option<String>> {
        self.conn.info(self.config.command_timeout, section).await
    }

    /// The configuration this node was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// The keys of `name` on this node (under the configured prefix).
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(&self.config.prefix, name)
    }

    /// Takes the lock for `owner` for `ttl` if nobody holds it ([`NodeAttempt::Taken`] with the
    /// new fencing token), or says who holds it and for how long ([`NodeAttempt::Busy`]).
    /// `counting` says whether a busy attempt advances the name's fence counter too, in return
    /// for less work on the node (see [`Counting`]); a counter that does not exist starts at
    /// `floor` ([`fence_floor`], read once for all the nodes of one round).
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if the node does not answer
    /// within `timeout`; the lock may then be set (release it with [`unlock`](Self::unlock)).
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: a dropped call may have set the lock; undo it with `unlock`.
    pub async fn try_lock(
        &self,
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        floor: u64,
        timeout: Duration,
        counting: Counting,
    ) -> Result<NodeAttempt> {
        let request = AttemptRequest::new(keys, owner, ttl, floor, counting);
        self.send_attempt(keys, owner, &request, timeout).await
    }

    /// [`try_lock`](Self::try_lock) with its request built already (the same for every node
    /// of a round), for `owner` on `keys`, as the request was built.
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    /// As [`try_lock`](Self::try_lock).
    pub async fn send_attempt(
        &self,
        keys: &LockKeys,
        owner: &str,
        request: &AttemptRequest,
        timeout: Duration,
    ) -> Result<NodeAttempt> {
        match &request.pipeline {
            None => {
                let reply: Value = self
                    .conn
                    .run_script(
                        timeout,
                        &self.acquire,
                        &[&keys.lock, &keys.fence, &keys.watch],
                        &[owner, &request.ttl_ms, &request.floor, &self.held_by],
                    )
                    .await?;
                NodeAttempt::from_script(&reply)
            }
            Some(pipe) => {
                let replies: Vec<Value> = self.conn.query(timeout, pipe).await?;
                let (attempt, mark) = NodeAttempt::from_pipeline(&replies)?;
                if let Some(mark) = mark {
                    self.tell_lost_holder(keys, mark, timeout).await;
                }
                Ok(attempt)
            }
        }
    }

    /// Tells the holder whose watch `mark` (`CLIENT OWNER`) a pipelined acquire found as it took
    /// the lock over, as the acquire script does in its own step, and drops the mark. Nobody
    /// else can mark the key meanwhile: a mark needs the key, which is the caller's now. A
    /// failure only delays the news to the next renewal of that holder.
    async fn tell_lost_holder(&self, keys: &LockKeys, mark: &str, timeout: Duration) {
        let Some((client, watcher)) = mark.split_once(' ') else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("DEL")
            .arg(&keys.watch)
            .ignore()
            .cmd("PUBLISH")
            .arg(self.held_by_channel(client))
            .arg(format!("{HOLDER_LOST}{watcher}"))
            .ignore();
        if let Err(error) = self.conn.query::<()>(timeout, &pipe).await {
            tracing::debug!(key = %keys.lock, %error, "redis node: could not tell a watching holder that its key was taken over");
        }
    }

    /// The channel the holders of client `client` listen on for [`NodeEvent::HolderLost`]:
    /// `PREFIX:held-by:CLIENT`. Subscribe to it ([`subscribe`](Self::subscribe)) before
    /// [`watch_held`](Self::watch_held).
    pub fn held_by_channel(&self, client: &str) -> String {
        let mut channel = String::with_capacity(self.held_by.len().saturating_add(client.len()));
        channel.push_str(&self.held_by);
        channel.push_str(client);
        channel
    }

    /// Marks the lock as watched by its holder `owner` of client `client` (random hex digits),
    /// for the next ten minutes, if `owner` holds it here; whether it does. Whoever takes the
    /// lock here after the key went (expired, deleted) then publishes
    /// [`NodeEvent::HolderLost`] on [`held_by_channel`](Self::held_by_channel)`(client)`. A
    /// release drops the mark; a holder that keeps the lock longer marks it again.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: marking is idempotent.
    pub async fn watch_held(
        &self,
        keys: &LockKeys,
        owner: &str,
        client: &str,
        timeout: Duration,
    ) -> Result<bool> {
        let mark = format!("{client} {owner}");
        let held: i64 = self
            .conn
            .run_script(
                timeout,
                &self.watch_held,
                &[&keys.lock, &keys.watch],
                &[owner, &mark],
            )
            .await?;
        Ok(held == 1)
    }

    /// Deletes the lock if `owner` holds it; whether it did.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it is owner-checked, so sending it again is harmless.
    pub async fn unlock(&self, keys: &LockKeys, owner: &str, timeout: Duration) -> Result<bool> {
        let deleted: i64 = self
            .conn
            .run_script(timeout, &self.release, &[&keys.lock, &keys.watch], &[owner])
            .await?;
        Ok(deleted == 1)
    }

    /// Deletes the lock if `owner` holds it and, if it did, publishes `released` on the name's
    /// channel (waiters subscribed there wake); whether it did.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it is owner-checked, so sending it again is harmless.
    pub async fn release(&self, keys: &LockKeys, owner: &str, timeout: Duration) -> Result<bool> {
        let deleted: i64 = self
            .conn
            .run_script(
                timeout,
                &self.release_announced,
                &[&keys.lock, &keys.watch],
                &[owner, &keys.channel],
            )
            .await?;
        Ok(deleted == 1)
    }

    /// Resets the lock's TTL to `ttl` if `owner` holds it; whether it did.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: the TTL may or may not have been reset.
    pub async fn extend(
        &self,
        keys: &LockKeys,
        owner: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<bool> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let extended: i64 = self
            .conn
            .run_script(timeout, &self.extend, &[&keys.lock], &[owner, &ttl_ms])
            .await?;
        Ok(extended == 1)
    }

    /// [`extend`](Self::extend) of many locks in one script (a node holds every key): whether
    /// each `(keys, owner)` of `locks` was extended, in order.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: the TTLs may or may not have been reset.
    pub async fn extend_many(
        &self,
        locks: &[(&LockKeys, &str)],
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Vec<bool>> {
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let names: Vec<&str> = locks.iter().map(|(keys, _)| keys.lock.as_str()).collect();
        let args: Vec<&str> = std::iter::once(ttl_ms.as_str())
            .chain(locks.iter().map(|&(_, owner)| owner))
            .collect();
        let extended: Vec<i64> = self
            .conn
            .run_script(timeout, &self.extend_many, &names, &args)
            .await?;
        if extended.len() != locks.len() {
            return Err(LockError::unexpected(
                crate::BACKEND,
                format!(
                    "extend of {} locks answered {}",
                    locks.len(),
                    extended.len()
                ),
            ));
        }
        Ok(extended.into_iter().map(|one| one == 1).collect())
    }

    /// Joins the name's waiting line on this node, or keeps `waiter`'s place in it for
    /// `presence` more; whether `waiter` is now first (waiters ahead of it whose presence lapsed
    /// are dropped). The line only orders waiters: it grants nothing.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call may have joined the line; [`line_leave`](Self::line_leave)
    /// undoes it, and a place not kept lapses with its presence.
    pub async fn line_check(
        &self,
        keys: &LockKeys,
        waiter: &str,
        presence: Duration,
        timeout: Duration,
    ) -> Result<bool> {
        let presence_ms = presence.as_millis().max(1).to_string();
        let first: i64 = self
            .conn
            .run_script(
                timeout,
                &self.line_check,
                &[&keys.queue, &keys.waiters],
                &[waiter, &presence_ms],
            )
            .await?;
        Ok(first == 1)
    }

    /// Leaves the name's waiting line on this node.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: leaving twice is harmless.
    pub async fn line_leave(&self, keys: &LockKeys, waiter: &str, timeout: Duration) -> Result<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("LREM")
            .arg(&keys.queue)
            .arg(0)
            .arg(waiter)
            .ignore()
            .cmd("HDEL")
            .arg(&keys.waiters)
            .arg(waiter)
            .ignore();
        self.conn.query::<()>(timeout, &pipe).await
    }

    /// Raises the name's fence counter to at least `token`; the counter after.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: raising is idempotent.
    pub async fn raise_fence(&self, keys: &LockKeys, token: u64, timeout: Duration) -> Result<u64> {
        self.conn
            .run_script(timeout, &self.raise, &[&keys.fence], &[&token.to_string()])
            .await
    }

    /// Raises the name's fence counter to at least `token`, but only while `owner` holds the
    /// lock on this node; whether it does. The check keeps a later holder's token above ours:
    /// that holder's `SET NX` here can only succeed once our key is gone, so after the raise.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: raising is idempotent.
    pub async fn raise_fence_if_held(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: u64,
        timeout: Duration,
    ) -> Result<bool> {
        let held: i64 = self
            .conn
            .run_script(
                timeout,
                &self.raise_held,
                &[&keys.lock, &keys.fence],
                &[owner, &token.to_string()],
            )
            .await?;
        Ok(held == 1)
    }

    /// Reads who holds the lock on this node, its remaining TTL and the fence counter, in one
    /// script that writes nothing.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect(&self, keys: &LockKeys, timeout: Duration) -> Result<NodeView> {
        inspect_on(&self.conn, &self.inspect, keys, timeout).await
    }

    /// Subscribes to `channel` (a name's [`LockKeys::channel`]); its messages reach the event
    /// handler. The subscription is renewed by itself after a lost connection.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: subscribing twice is harmless; a dropped call may or may not have subscribed.
    pub async fn subscribe(&self, channel: &str, timeout: Duration) -> Result<()> {
        self.conn.subscribe(timeout, channel).await
    }

    /// Unsubscribes from `channel`.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] on a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call may or may not have unsubscribed.
    pub async fn unsubscribe(&self, channel: &str, timeout: Duration) -> Result<()> {
        self.conn.unsubscribe(timeout, channel).await
    }
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The value of `name` in an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
}

/// What an `INFO replication` answer says against using the node as an independent one.
fn replication_hazard(info: &str) -> Option<String> {
    let field = |name: &str| info_field(info, name);
    match field("role") {
        Some("master") => {}
        Some(role) => return Some(format!("it is a replica (role {role})")),
        None => return None,
    }
    let replicas: u64 = field("connected_slaves")?.parse().ok()?;
    (replicas > 0).then(|| {
        format!(
            "it has {replicas} replica(s) attached, which a failover could promote without a grant"
        )
    })
}

#[cfg(test)]
mod replication_tests {
    use super::replication_hazard;

    #[test]
    fn only_an_unreplicated_primary_is_independent() {
        let primary =
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_repl_offset:0\r\n";
        assert_eq!(replication_hazard(primary), None);
        let replicated = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\n";
        assert!(
            replication_hazard(replicated)
                .unwrap()
                .contains("1 replica")
        );
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.1\r\n";
        assert!(replication_hazard(replica).unwrap().contains("replica"));
        assert_eq!(replication_hazard(""), None);
    }
}
