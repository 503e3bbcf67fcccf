//! `Redlock`: the parallel quorum acquire, the fence over a majority, and the wait on release
//! announcements.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{Grant, LeaseState, PendingAcquire, RawLock, RenewedBy, Session};
use dlock_api::{
    Capabilities, Fencing, FencingToken, Inspection, LockError, LockName, LockOptions, Result,
};
use dlock_redis::LockKeys;
use dlock_redis::node::{AttemptRequest, Counting, NodeAttempt, NodeView, fence_floor};
use futures::future::join_all;
use rand::Rng;
use tokio::time::{Instant, sleep_until};

use crate::BACKEND;
use crate::client::{Counters, Inner, node_events};
use crate::config::{RedlockConfig, majority};
use crate::fanout;
use crate::held::{HeldLock, Holders, schedule_watch};
use crate::lease::RedlockLease;
use crate::line::Line;
use crate::nodes::{Slot, connect_all};
use crate::release::{LetGo, release_everywhere, release_everywhere_waiting, release_on};
use crate::wake::Hub;

/// Locks over N independent Redis nodes with the Redlock algorithm.
///
/// Each `Redlock` is one client: one multiplexed connection per node, carrying commands and the
/// pub/sub subscriptions of all its waiters. Clone it (cheap) to share; call
/// [`Redlock::connect`] again for an independent client.
#[derive(Clone)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

/// How this client's acquire rounds have gone: how often contention ended in a split vote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedlockStats {
    /// Acquire rounds sent (one `SET NX PX` to every node each).
    pub rounds: u64,
    /// Rounds that won a quorum.
    pub granted: u64,
    /// Rounds that lost while no other client could have won either: the nodes were split
    /// among contenders, and everyone retried after a random delay.
    pub split_votes: u64,
    /// Rounds of a waiter first in the name's waiting line: sent to every node at once instead
    /// of taking the agreed node first (see the crate docs, *Waiting*).
    pub first_in_line_rounds: u64,
}

/// Which round of an acquire: what it sends where.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RoundKind {
    /// The first attempt: to every node at once.
    First,
    /// A waiter first in the name's waiting line: to every node at once, asking how long the
    /// holder has left where it is busy.
    FirstInLine,
    /// Another waiter: the agreed node first (see [`Redlock::round`]).
    Gated,
}

/// What one round ended in.
enum Round {
    Granted(Grant),
    /// Not ours this time.
    Busy {
        /// A bit per node the round found free (it took them and released them again).
        free: u64,
        /// Some client holds a quorum (or may, counting unreachable nodes): wait for its
        /// release, at the latest until enough of its keys expire (`None`: they never will, as
        /// far as this round saw).
        held_until: Option<Instant>,
        /// No client can hold a quorum: contenders split the nodes among them.
        split: bool,
        /// The agreed first node that another contender won: its release announcement is
        /// worth waking for on its own.
        gate: Option<usize>,
    },
    /// Too few nodes answered, or the grant came too late to leave any validity.
    Failed(LockError),
}

impl Redlock {
    /// Connects to every node of `config` in parallel.
    ///
    /// # Errors
    /// [`LockError::Config`] for a configuration [`RedlockConfig::validate`] refuses (before any
    /// network call); [`LockError::Unavailable`] if fewer than a quorum of nodes answer within
    /// the connect timeout (the others are retried whenever they are needed).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        let hub = Arc::new(Hub::default());
        let holders = Arc::new(Holders::new(config.nodes.len()));
        let slots = connect_all(&config, |node| node_events(&hub, &holders, node)).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                slots,
                hub,
                holders,
                stats: Counters::default(),
                timer: dlock_api::raw::GuardTimer::new(),
                holdings: dlock_api::raw::Holdings::default(),
                waiters: dlock_api::raw::LocalQueue::new(),
            }),
        })
    }

    /// Parses `url` ([`RedlockConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad URL (before any network call), else as
    /// [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is locked by connecting.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(RedlockConfig::from_url(url)?).await
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// The keys and channel of `name` (the same on every node), for operators and tests.
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(&self.inner.config.prefix, name)
    }

    /// How this client's acquire rounds have gone so far.
    pub fn stats(&self) -> RedlockStats {
        let c = &self.inner.stats;
        RedlockStats {
            rounds: c.rounds.load(Ordering::Relaxed),
            granted: c.granted.load(Ordering::Relaxed),
            split_votes: c.split_votes.load(Ordering::Relaxed),
            first_in_line_rounds: c.first_in_line_rounds.load(Ordering::Relaxed),
        }
    }

    /// A random delay up to the configured retry delay, after a split vote or a failed round.
    fn retry_delay(&self) -> Duration {
        self.inner
            .config
            .retry_delay
            .mul_f64(rand::rng().random_range(0.0..=1.0))
    }

    /// One round: `SET NX PX` on every node at once, each within the per-node timeout; a grant if
    /// a quorum said yes with validity to spare (after writing the highest fencing token back
    /// to a majority if fewer returned it), else every node released and what was seen.
    ///
    /// A gated round (a waiter's, when others likely woke with it) first takes
    /// the agreed node alone, the lowest-numbered one this client reaches, and goes on to the
    /// others only once it has it: contenders woken together then do not split the nodes among
    /// them, at the price of one round trip. A busy agreed node ends the round there.
    async fn round(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        options: &LockOptions,
        kind: RoundKind,
    ) -> Round {
        let gated = kind == RoundKind::Gated;
        let inner = &self.inner;
        let config = &inner.config;
        let (n, quorum) = (inner.slots.len(), config.quorum());
        let ttl = options.ttl();
        let node_timeout = config.node_timeout_for(ttl);
        // Shared: the attempts still out when the round is decided outlive it.
        let owner: Arc<str> = dlock_api::raw::random_owner().into();
        inner.stats.rounds.fetch_add(1, Ordering::Relaxed);
        // Validity runs from before the first request.
        let started = Instant::now();
        // One start for every node's counter this round (see `fence_floor`).
        let floor = fence_floor();
        // Any node may have set our key, even one whose answer was lost or late: a dropped
        // round releases on every node.
        // Set once the round's keys are let go (the round failed, the acquire was dropped, the
        // guard released): an answer still out that set a key after that undoes it where a
        // release missed it (`LetGo`).
        let let_go = Arc::new(LetGo::default());
        let pending = {
            let (inner, keys, owner, let_go) =
                (inner.clone(), keys.clone(), owner.clone(), let_go.clone());
            PendingAcquire::arm(move || {
                let_go.let_go();
                release_everywhere(&inner, keys, owner, &let_go)
            })
        };
        let gate = if gated {
            inner.slots.iter().find(|slot| slot.get().is_ok())
        } else {
            None
        };
        let mut first = None;
        if let Some(slot) = gate {
            let reply = match slot.get() {
                Ok(node) => {
                    node.try_lock(keys, &owner, ttl, floor, node_timeout, Counting::OnGrant)
                        .await
                }
                Err(error) => Err(error),
            };
            match reply {
                Ok(NodeAttempt::Busy { pttl, .. }) => {
                    // Someone else is ahead; nothing of ours was set anywhere.
                    pending.disarm();
                    return Round::Busy {
                        free: 0,
                        held_until: Some(after(started, pttl.unwrap_or(ttl))),
                        split: false,
                        gate: Some(slot.index),
                    };
                }
                Ok(taken) => first = Some((slot.index, taken)),
                // The agreed node fails: a plain round on every node instead.
                Err(_) => {}
            }
        }
        // A first round reaches every node at once, so the counters advance alike; a waiter's
        // round may stop at the agreed node.
        let counting = match kind {
            RoundKind::Gated => Counting::OnGrant,
            RoundKind::FirstInLine => Counting::EveryAttempt,
            // Its busy answer is not waited on: no remaining TTL asked for.
            RoundKind::First => Counting::EveryAttemptUntimed,
        };
        // The round is decided once a quorum said yes (the slower nodes are not waited for: a
        // key they set is ours, and release and extend reach every node) or once every node
        // answered.
        let mut taken: Vec<(usize, u64)> = Vec::new();
        let mut busy: Vec<(usize, String, Option<Duration>)> = Vec::new();
        let mut failures: Vec<String> = Vec::new();
        // The same commands for every node: built once.
        let request = Arc::new(AttemptRequest::new(keys, &owner, ttl, floor, counting));
        fanout::until_decided(
            &inner.slots,
            |slot| {
                let (slot, keys, owner) = (slot.clone(), keys.clone(), owner.clone());
                let request = request.clone();
                let answered = first
                    .as_ref()
                    .filter(|(index, _)| *index == slot.index)
                    .map(|(_, taken)| taken.clone());
                async move {
                    match answered {
                        Some(taken) => Ok(taken),
                        None => {
                            slot.get()?
                                .send_attempt(&keys, &owner, &request, node_timeout)
                                .await
                        }
                    }
                }
            },
            |slot, reply| {
                match reply {
                    Ok(NodeAttempt::Taken { token }) => taken.push((slot.index, token)),
                    Ok(NodeAttempt::Busy { holder, pttl }) => busy.push((slot.index, holder, pttl)),
                    Ok(other) => failures.push(format!("{}: {other:?}", slot.addr())),
                    Err(error) => failures.push(format!(
                        "{}: {}",
                        slot.addr(),
                        dlock_api::error_chain(&error)
                    )),
                }
                taken.len() >= quorum
            },
            undo_late_grant(inner, keys, &owner, &let_go),
        )
        .await;
        let valid_until = after(started, ttl.saturating_sub(config.drift_for(ttl)));
        if taken.len() >= quorum {
            match self.fence(keys, &owner, &taken, node_timeout).await {
                Ok(token) => {
                    let left = valid_until.saturating_duration_since(Instant::now());
                    if left > config.min_validity {
                        pending.disarm();
                        inner.stats.granted.fetch_add(1, Ordering::Relaxed);
                        return Round::Granted(self.grant(
                            name,
                            keys,
                            Held {
                                owner,
                                token,
                                valid_until,
                                let_go,
                            },
                            options,
                        ));
                    }
                    drop(pending);
                    return Round::Failed(LockError::unavailable_because(
                        BACKEND,
                        format!(
                            "a quorum granted `{name}` only after {:?} of its {ttl:?} lease: too slow to leave the minimum validity",
                            started.elapsed()
                        ),
                    ));
                }
                Err(error) => {
                    drop(pending);
                    return Round::Failed(error);
                }
            }
        }
        // Not ours: release on every node at once (the nodes that answered busy hold someone
        // else's key and are left alone by the owner check; the ones that did not answer may
        // have set ours after all), waiting for the nodes that set it.
        let free = taken.iter().fold(0u64, |mask, (i, _)| mask | (1 << i));
        pending.disarm();
        let_go.let_go();
        let waited_for = (free, node_timeout);
        release_everywhere_waiting(inner, keys.clone(), owner, &let_go, waited_for).await;
        if n.saturating_sub(failures.len()) < quorum {
            return Round::Failed(LockError::unavailable_because(
                BACKEND,
                format!(
                    "only {} of {n} nodes answered, {quorum} needed ({})",
                    n.saturating_sub(failures.len()),
                    failures.join("; ")
                ),
            ));
        }
        // Could any one client hold a quorum? Count each holder's nodes, plus the nodes that did
        // not answer (it may hold those too).
        let mut per_holder: HashMap<&str, usize> = HashMap::new();
        for (_, holder, _) in &busy {
            let count = per_holder.entry(holder.as_str()).or_default();
            *count = count.saturating_add(1);
        }
        let most = per_holder.values().copied().max().unwrap_or(0);
        if most.saturating_add(failures.len()) < quorum {
            inner.stats.split_votes.fetch_add(1, Ordering::Relaxed);
            return Round::Busy {
                free,
                held_until: None,
                split: true,
                gate: None,
            };
        }
        // Held: the lock can be ours once `quorum - free` of the busy nodes expire, so wake at
        // the (quorum - free)-th smallest remaining TTL, if no announcement comes first.
        let mut pttls: Vec<Duration> = busy.iter().filter_map(|(_, _, pttl)| *pttl).collect();
        pttls.sort_unstable();
        let need = quorum.saturating_sub(taken.len());
        let held_until = need
            .checked_sub(1)
            .and_then(|k| pttls.get(k))
            .map(|pttl| after(started, *pttl));
        Round::Busy {
            free,
            held_until,
            split: false,
            gate: None,
        }
    }

    /// The fencing token of a grant: the highest token of the quorum, written back (owner
    /// checked) to a majority unless a majority returned it already.
    async fn fence(
        &self,
        keys: &LockKeys,
        owner: &str,
        taken: &[(usize, u64)],
        node_timeout: Duration,
    ) -> Result<u64> {
        let n = self.inner.slots.len();
        let highest = taken.iter().map(|(_, t)| *t).max().unwrap_or(0);
        let at_highest = taken.iter().filter(|(_, t)| *t == highest).count();
        if at_highest >= majority(n) {
            return Ok(highest);
        }
        let timeout = node_timeout.max(
            self.inner
                .config
                .command_timeout
                .min(node_timeout.saturating_mul(4)),
        );
        let raised = join_all(taken.iter().filter(|(_, t)| *t < highest).map(
            |(i, _)| async move {
                let node = self.inner.slots[*i].get()?;
                node.raise_fence_if_held(keys, owner, highest, timeout)
                    .await
            },
        ))
        .await;
        let raised = raised.iter().filter(|r| matches!(r, Ok(true))).count();
        if at_highest.saturating_add(raised) >= majority(n) {
            Ok(highest)
        } else {
            Err(LockError::unavailable_because(
                BACKEND,
                format!(
                    "the fencing token reached only {} of the {} nodes it must",
                    at_highest.saturating_add(raised),
                    majority(n)
                ),
            ))
        }
    }

    fn grant(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        held: Held,
        options: &LockOptions,
    ) -> Grant {
        let Held {
            owner,
            token,
            valid_until,
            let_go,
        } = held;
        let session = Arc::new(Session::new());
        let state = Arc::new(LeaseState::on_session(Some(valid_until), session.clone()));
        let watch = schedule_watch(
            &self.inner,
            HeldLock {
                keys: keys.clone(),
                owner: owner.clone(),
                state: state.clone(),
            },
        );
        let lease = Arc::new(RedlockLease::new(
            self.inner.clone(),
            name.clone(),
            keys.clone(),
            owner,
            valid_until,
            session,
            options.renewal_interval().is_some(),
            watch,
            let_go,
        ));
        Grant::new(
            name.clone(),
            FencingToken::new(token),
            lease,
            state,
            RenewedBy::Guard,
        )
    }
}

/// What a won round hands its guard.
struct Held {
    owner: Arc<str>,
    token: u64,
    valid_until: Instant,
    /// Set when the guard lets the lock go (see [`undo_late_grant`]).
    let_go: Arc<LetGo>,
}

/// What a round does with a node's answer that comes after the round was decided: a key set
/// after its lock was let go, where a release missed it, is deleted again (see [`LetGo`]).
fn undo_late_grant(
    inner: &Arc<Inner>,
    keys: &Arc<LockKeys>,
    owner: &Arc<str>,
    let_go: &Arc<LetGo>,
) -> impl FnMut(&Arc<Slot>, Result<NodeAttempt>) + Send + 'static {
    let (inner, keys, owner, let_go) = (inner.clone(), keys.clone(), owner.clone(), let_go.clone());
    move |slot, reply| {
        if matches!(reply, Ok(NodeAttempt::Taken { .. })) && let_go.taken_late(slot.index) {
            release_on(&inner, slot.clone(), (keys.clone(), owner.clone()), None);
        }
    }
}

/// What the nodes that answered say together (see [`Redlock`]'s `inspect`): `failures` names
/// the nodes that did not.
fn quorum_view(views: &[NodeView], failures: Vec<String>, quorum: usize) -> Result<Inspection> {
    let silent = failures.len();
    let mut by_owner: HashMap<&str, Vec<&NodeView>> = HashMap::new();
    for view in views {
        if let Some(owner) = &view.holder {
            by_owner.entry(owner).or_default().push(view);
        }
    }
    if let Some((owner, held)) = by_owner.iter().find(|(_, held)| held.len() >= quorum) {
        // The lock lasts while a quorum keeps the key: the quorum-th longest TTL left.
        let mut ttls: Vec<Duration> = held.iter().filter_map(|v| v.pttl).collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        let token = held.iter().filter_map(|v| v.fence).max();
        let inspection = Inspection::held(token.map(FencingToken::new)).with_holder(*owner);
        return Ok(match quorum.checked_sub(1).and_then(|i| ttls.get(i)) {
            Some(left) => inspection.with_remaining(*left),
            None => inspection,
        });
    }
    let most = by_owner.values().map(Vec::len).max().unwrap_or(0);
    if most.saturating_add(silent) < quorum {
        return Ok(Inspection::free(None));
    }
    Err(LockError::unavailable_because(
        BACKEND,
        format!(
            "cannot tell whether the lock is held: one owner holds {most} node(s), {silent} did \
             not answer, {quorum} make a quorum ({})",
            failures.join("; ")
        ),
    ))
}

#[async_trait]
impl RawLock for Redlock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &dlock_api::raw::Holdings {
        &self.inner.holdings
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::BestEffort,
            survives_failover: true,
            min_ttl: Some(self.inner.config.min_ttl()),
            inspect: true,
            takeover_signal: true,
            ..Capabilities::TTL_LEASE
        }
    }

    /// Asks every node at once (one read-only script each) and reports what a quorum says:
    /// held when one owner holds the key on a quorum, free when no owner could (even counting
    /// the nodes that did not answer); anything between cannot be told and is `Unavailable`.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let inner = &self.inner;
        let keys = self.keys(name);
        let timeout = inner.config.command_timeout;
        let replies = join_all(inner.slots.iter().map(|slot| {
            let keys = &keys;
            async move { slot.get()?.inspect(keys, timeout).await }
        }))
        .await;
        let mut views = Vec::new();
        let mut failures = Vec::new();
        for (slot, reply) in inner.slots.iter().zip(replies) {
            match reply {
                Ok(view) => views.push(view),
                Err(error) => failures.push(format!(
                    "{}: {}",
                    slot.addr(),
                    dlock_api::error_chain(&error)
                )),
            }
        }
        quorum_view(&views, failures, inner.config.quorum())
    }

    /// `limit` is always 1: Redlock has no semaphores (see the crate docs).
    async fn try_grant(
        &self,
        name: &LockName,
        _limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        let keys = Arc::new(self.keys(name));
        match self.round(name, &keys, options, RoundKind::First).await {
            Round::Granted(grant) => Ok(Some(grant)),
            Round::Busy { .. } => Ok(None),
            Round::Failed(error) => Err(error),
        }
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        _limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let inner = &self.inner;
        let keys = Arc::new(self.keys(name));
        let quorum = inner.config.quorum();
        let ttl = options.ttl();
        // One waiter per client and name at the nodes: a release wakes every waiter that
        // listens, and each answers with a round, so the others wait their turn here (a line of
        // 1,000 waiters over a few clients made every release a thousand rounds, and their
        // first rounds, all at once, timed out).
        let Some(_turn) = inner.waiters.turn(name, deadline).await else {
            return Ok(None);
        };
        // A first round without a quorum (nodes down, or a connection killed under it) is
        // ridden out as any later round's is: only a quorum that stays unreachable for the
        // connect timeout ends the wait, with the error.
        // The failure being ridden out: since when, and the last error, which a deadline that
        // comes meanwhile ends the wait with (an outage reads as one, never as `Timeout`).
        let mut unavailable: Option<(Instant, LockError)> = None;
        match self.round(name, &keys, options, RoundKind::First).await {
            Round::Granted(grant) => return Ok(Some(grant)),
            Round::Failed(error) if !error.is_retryable() => return Err(error),
            Round::Failed(error) => {
                tracing::debug!(lock = %name, %error, "redlock: first round failed; retrying");
                unavailable = Some((Instant::now(), error));
            }
            Round::Busy { .. } => {}
        }
        let mut waiting = inner.hub.register(&keys.channel, inner.slots.len());
        let subscribe_timeout = inner
            .config
            .node_timeout_for(ttl)
            .max(inner.config.command_timeout.min(Duration::from_millis(100)));
        let mut line = Line::new(inner.clone(), keys.clone());
        let node_timeout = inner.config.node_timeout_for(ttl);
        loop {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return match unavailable {
                    Some((_, error)) => Err(error),
                    None => Ok(None),
                };
            }
            // Subscribed before the attempt, and announcements counted from just before it, so a
            // release during the attempt is not missed.
            waiting
                .ensure_subscribed(&inner.slots, subscribe_timeout)
                .await;
            waiting.reset();
            let gated = !line.first();
            if !gated {
                inner
                    .stats
                    .first_in_line_rounds
                    .fetch_add(1, Ordering::Relaxed);
                // Out of the line before the round lands, so that the waiters it beats find
                // the next one first.
                line.leave();
            }
            let round_started = Instant::now();
            let kind = if gated {
                RoundKind::Gated
            } else {
                RoundKind::FirstInLine
            };
            let round = self.round(name, &keys, options, kind).await;
            let round_took = round_started.elapsed();
            let wake_at = match round {
                Round::Granted(grant) => return Ok(Some(grant)),
                Round::Failed(error) if !error.is_retryable() => return Err(error),
                Round::Failed(error) => {
                    // Ride out a quorum that is unreachable for a while, up to the connect
                    // timeout.
                    let since = unavailable.map_or_else(Instant::now, |(since, _)| since);
                    if since.elapsed() >= inner.config.connect_timeout {
                        return Err(error);
                    }
                    tracing::debug!(lock = %name, %error, "redlock: round failed; retrying");
                    unavailable = Some((since, error));
                    after(
                        Instant::now(),
                        self.retry_delay().max(Duration::from_millis(1)),
                    )
                }
                Round::Busy {
                    free,
                    held_until,
                    split,
                    gate,
                } => {
                    unavailable = None;
                    if split {
                        let retry_at = after(Instant::now(), self.retry_delay());
                        line.check(retry_at, node_timeout).await;
                        retry_at
                    } else {
                        // Wait for a quorum's announcements, or until enough keys expire, or
                        // look again a while later: keys deleted on the nodes (by an operator, a
                        // restart without persistence) go without an announcement.
                        let fallback = held_until
                            .unwrap_or_else(|| after(Instant::now(), ttl))
                            .min(after(Instant::now(), LOOK_AGAIN_EVERY));
                        let fallback = match deadline {
                            Some(d) => fallback.min(d),
                            None => fallback,
                        };
                        // A release during the check is not missed: announcements count from
                        // before the round.
                        line.check(fallback, node_timeout).await;
                        // The first in line goes to every node next: it waits for a quorum's
                        // announcements, not the agreed node's alone.
                        let gate = gate.filter(|_| !line.first());
                        tokio::select! {
                            _ = waiting.freed(free, quorum, gate) => {}
                            _ = sleep_until(fallback) => {}
                        }
                        if !line.first() {
                            // A head start for the first in line, about a round trip: it takes
                            // the agreed node before us, so that the nodes whose release had not
                            // landed when it woke cannot leave it short of a quorum.
                            tokio::time::sleep(
                                round_took.saturating_mul(2).min(inner.config.retry_delay),
                            )
                            .await;
                        }
                        continue;
                    }
                }
            };
            let wake_at = match deadline {
                Some(d) => wake_at.min(d),
                None => wake_at,
            };
            sleep_until(wake_at).await;
        }
    }
}

/// How long a waiter waits for announcements before it looks at the nodes again: a bound on
/// how late it finds keys that went without a release announcing it (Redis waits on its
/// presence refresh, under a second by default).
const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(1);

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redlock({})", self.inner.config)
    }
}
