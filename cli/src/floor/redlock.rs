//! Redlock's raw floors on its N nodes, with the `redis` crate alone and one multiplexed
//! connection per node: a pair is `SET NX PX` on every node in parallel, then an `EVALSHA`
//! compare-and-delete on every node in parallel; the hand-off is the multi-node analogue of
//! Redis's notified one.

use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_redlock::RedlockConfig;
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, Script};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::redis::{
    COMPARE_AND_DELETE, DELETE_AND_PUBLISH, ForgetFences, KeyedFloor, RunKeys, bounded, fence_keys,
    many_keys, set_nx, token, uncontended,
};
use crate::floor::{Measured, Ops, Pairs, Protocol, Throughput, WarmUp, sample_timed};

const BACKEND: &str = "redlock";

/// The nodes a `redlock://` URL names.
#[derive(Debug)]
pub(crate) struct Redlock {
    config: RedlockConfig,
    keys: RunKeys,
}

impl Redlock {
    pub(crate) fn new(url: &str) -> Result<Self> {
        let config = RedlockConfig::from_url(url)?;
        let keys = RunKeys {
            prefix: config.prefix.clone(),
        };
        Ok(Self { config, keys })
    }

    /// A client of each node, in the URL's order (for the peer, which connects by itself).
    fn node_clients(&self) -> Result<Vec<redis::Client>> {
        let c = &self.config;
        c.nodes
            .iter()
            .enumerate()
            .map(|(i, node)| dlock_redis::driver::node_client(&c.node_config(i), node))
            .collect()
    }

    /// One multiplexed RESP3 connection per node, in the URL's order, each sending its push
    /// messages to `push`.
    async fn connect(
        &self,
        push: Option<UnboundedSender<PushInfo>>,
    ) -> Result<Vec<MultiplexedConnection>> {
        let c = &self.config;
        let mut options = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(c.connect_timeout))
            .set_response_timeout(Some(c.command_timeout));
        if let Some(push) = push {
            options = options.set_push_sender(push);
        }
        let connecting = c.nodes.iter().enumerate().map(|(i, node)| {
            let client = dlock_redis::driver::node_client(&c.node_config(i), node);
            let options = &options;
            async move {
                let client = client?;
                let connecting = client.get_multiplexed_async_connection_with_config(options);
                bounded(BACKEND, c.connect_timeout, connecting).await
            }
        });
        join_all(connecting).await.into_iter().collect()
    }
}

/// Pairs on one connection per node, a key per task: plain (`SET NX PX`), or fenced (`SET NX
/// PX` and `INCR` of a fence key per task, pipelined, as dlock's first attempt counts).
pub(crate) struct RedlockPairs {
    conns: Vec<MultiplexedConnection>,
    keys: Vec<String>,
    fences: Option<Vec<String>>,
    script: Script,
    timeout: Duration,
}

impl Pairs for RedlockPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let (key, timeout) = (&self.keys[task], self.timeout);
        let fence = self.fences.as_ref().map(|fences| &fences[task]);
        let token = token();
        let sets = join_all(self.conns.iter().map(|conn| {
            let (mut conn, set) = (conn.clone(), set_nx(key, &token));
            async move {
                match fence {
                    None => {
                        bounded(
                            BACKEND,
                            timeout,
                            set.query_async::<Option<String>>(&mut conn),
                        )
                        .await
                    }
                    Some(fence) => {
                        let mut take = redis::pipe();
                        take.add_command(set).cmd("INCR").arg(fence);
                        let taken = take.query_async::<(Option<String>, u64)>(&mut conn);
                        Ok(bounded(BACKEND, timeout, taken).await?.0)
                    }
                }
            }
        }))
        .await;
        let deletes =
            join_all(
                self.conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    let mut invocation = self.script.key(key);
                    invocation.arg(&token);
                    async move {
                        bounded(BACKEND, timeout, invocation.invoke_async::<i64>(&mut conn)).await
                    }
                }),
            )
            .await;
        for result in sets {
            result?;
        }
        for result in deletes {
            result?;
        }
        Ok(())
    }
}

impl ForgetFences for RedlockPairs {
    /// On every node.
    async fn forget_fences(&self) -> Result<()> {
        let Some(fences) = &self.fences else {
            return Ok(());
        };
        let deleted =
            join_all(
                self.conns.iter().map(|conn| {
                    let mut conn = conn.clone();
                    let mut del = redis::cmd("DEL");
                    del.arg(fences);
                    async move {
                        bounded(BACKEND, self.timeout, del.query_async::<i64>(&mut conn)).await
                    }
                }),
            )
            .await;
        deleted.into_iter().try_for_each(|result| result.map(drop))
    }
}

impl KeyedFloor for Redlock {
    type Pairs = RedlockPairs;

    fn run_keys(&self) -> &RunKeys {
        &self.keys
    }

    async fn pairs_on(&self, keys: Vec<String>, fenced: bool) -> Result<RedlockPairs> {
        let fences = fenced.then(|| fence_keys(&keys));
        Ok(RedlockPairs {
            conns: self.connect(None).await?,
            keys,
            fences,
            script: Script::new(COMPARE_AND_DELETE),
            timeout: self.config.command_timeout,
        })
    }
}

/// `SET key owner NX PX` on the nodes `on` lists, in parallel: whether each got it.
async fn set_on(
    conns: &[MultiplexedConnection],
    on: &[usize],
    key: &str,
    owner: &str,
    timeout: Duration,
) -> Result<Vec<bool>> {
    let sets = join_all(on.iter().map(|&i| {
        let (mut conn, set) = (conns[i].clone(), set_nx(key, owner));
        async move {
            bounded(
                BACKEND,
                timeout,
                set.query_async::<Option<String>>(&mut conn),
            )
            .await
        }
    }))
    .await;
    sets.into_iter().map(|set| Ok(set?.is_some())).collect()
}

impl Protocol for Redlock {
    fn ops(&self) -> Ops {
        Ops {
            pair: "parallel SET NX PX x N + parallel EVALSHA compare-and-delete x N",
            fenced_pair: Some(
                "parallel (SET NX PX, INCR fence) pipelined x N + parallel EVALSHA compare-and-delete x N",
            ),
            handoff: "parallel DEL+PUBLISH x N, subscriber's parallel SET NX x N to a quorum",
            client: "one multiplexed connection per node".to_owned(),
            peer_pair: Some(super::rslock::PEER_PAIR),
        }
    }

    async fn peer_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        super::rslock::pairs(self.node_clients()?, &self.keys, duration)
            .await
            .map(Some)
    }

    async fn peer_parallel(&self, tasks: usize, duration: Duration) -> Result<Option<Throughput>> {
        super::rslock::parallel(self.node_clients()?, &self.keys, tasks, duration)
            .await
            .map(Some)
    }

    async fn pairs(&self, duration: Duration) -> Result<Measured> {
        uncontended(self, false, duration).await
    }

    /// As [`pairs`](Self::pairs), each node's `SET NX PX` pipelined with an `INCR` of the
    /// name's fence counter, as dlock's first attempt takes its token.
    async fn fenced_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        uncontended(self, true, duration).await.map(Some)
    }

    /// The holder holds the key on every node; the waiter is subscribed to the key's channel on
    /// every node. After holding `hold` (as dlock's contenders do), the holder deletes the key and
    /// publishes on every node in parallel (one script per node); on the first announcement the
    /// waiter sends `SET NX PX` to every node in parallel (on a later one, again to the nodes it
    /// did not get), and holds once a quorum said yes. Each sample runs from the release being
    /// issued to the quorum's last yes.
    async fn handoffs(
        &self,
        duration: Duration,
        _waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let (timeout, quorum) = (self.config.command_timeout, self.config.quorum());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
        let holder = self.connect(None).await?;
        let waiter = self.connect(Some(tx)).await?;
        let every: Vec<usize> = (0..waiter.len()).collect();
        let key = self.keys.key("handoff");
        let channel = format!("{key}:released");
        for result in join_all(waiter.iter().map(|conn| {
            let mut conn = conn.clone();
            let channel = &channel;
            async move { bounded(BACKEND, timeout, conn.subscribe(channel)).await }
        }))
        .await
        {
            result?;
        }
        let release = Script::new(DELETE_AND_PUBLISH);
        let unexpected =
            |what: &str| LockError::unexpected(BACKEND, format!("hand-off floor: {what}"));
        let mut round = 0u64;
        let handoff = async || -> Result<Duration> {
            // Each round announces its own number, so a late message of the last one is
            // told apart.
            round = round.wrapping_add(1);
            let message = round.to_string();
            if set_on(&holder, &every, &key, "holder", timeout)
                .await?
                .contains(&false)
            {
                return Err(unexpected("the holder's SET NX failed"));
            }
            tokio::time::sleep(hold).await;
            let sent = Instant::now();
            let releasing =
                join_all(holder.iter().map(|conn| {
                    let mut conn = conn.clone();
                    let mut invocation = release.key(&key);
                    invocation.arg(&channel).arg(&message);
                    async move {
                        bounded(BACKEND, timeout, invocation.invoke_async::<i64>(&mut conn)).await
                    }
                }));
            let taking = async {
                let mut taken = vec![false; waiter.len()];
                let mut heard = 0;
                while heard < waiter.len() {
                    let info = tokio::time::timeout(timeout, rx.recv())
                        .await
                        .ok()
                        .flatten()
                        .ok_or_else(|| LockError::command_timeout(BACKEND, timeout))?;
                    let this_round = info.kind == redis::PushKind::Message
                        && info.data.get(1).is_some_and(|payload| {
                            redis::from_redis_value_ref::<String>(payload).ok().as_ref()
                                == Some(&message)
                        });
                    if !this_round {
                        continue;
                    }
                    heard = heard.saturating_add(1);
                    // The nodes not taken yet, in parallel; held at the quorum's last yes.
                    let mut answers: FuturesUnordered<_> = (0..waiter.len())
                        .filter(|&i| !taken[i])
                        .map(|i| {
                            let (mut conn, set) = (waiter[i].clone(), set_nx(&key, "waiter"));
                            async move {
                                let got = set.query_async::<Option<String>>(&mut conn);
                                (i, bounded(BACKEND, timeout, got).await)
                            }
                        })
                        .collect();
                    let mut held = None;
                    while let Some((i, got)) = answers.next().await {
                        taken[i] = got?.is_some();
                        if held.is_none() && taken.iter().filter(|&&t| t).count() >= quorum {
                            held = Some(Instant::now());
                        }
                    }
                    if let Some(held) = held {
                        return Ok(held);
                    }
                }
                Err(unexpected("the waiter did not get a quorum"))
            };
            let (released, taken) = tokio::join!(releasing, taking);
            for result in released {
                result?;
            }
            let took = taken?.saturating_duration_since(sent);
            // Off the clock: the waiter lets go on every node.
            for result in join_all(waiter.iter().map(|conn| {
                let mut conn = conn.clone();
                let mut del = redis::cmd("DEL");
                del.arg(&key);
                async move { bounded(BACKEND, timeout, del.query_async::<i64>(&mut conn)).await }
            }))
            .await
            {
                result?;
            }
            Ok(took)
        };
        sample_timed(WarmUp::Rounds(50), duration, handoff).await
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
