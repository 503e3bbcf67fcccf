//! `RedisLock`: acquire with one script, wait on pub/sub, renew through the shared watchdog.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::time::after;
use dlock_api::raw::{
    Grant, GuardTimer, Holdings, LeaseState, PendingAcquire, RawLock, RenewedBy, WaitRecovery,
};
use dlock_api::{
    Capabilities, Fencing, FencingToken, Inspection, LockError, LockName, LockOptions, Result,
};
use tokio::time::{Instant, sleep_until};

use crate::BACKEND;
use crate::client::{HeldBy, Inner};
use crate::config::RedisConfig;
use crate::held::HeldLock;
use crate::keys::LockKeys;
use crate::lease::{Hold, RedisLease, announced_grant_end, lease_end};
use crate::scripts::Scripts;
use crate::wake::{Waiting, Wakeups};

/// Locks on Redis: a single node, a Sentinel-managed primary, or a Cluster.
///
/// Each `RedisLock` is one client: one multiplexed connection that carries commands and the
/// pub/sub subscriptions of all its waiters. Clone it (cheap) to share; call
/// [`RedisLock::connect`] again for an independent client.
#[doc = include_str!("docs.md")]
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
}

mod at_once;
mod election;
mod permits;

use permits::Share;

/// What the server granted: the fencing token, until when the lease surely lasts, and what the
/// owner holds (see [`RedisLease`]).
struct Held {
    token: i64,
    valid_until: Instant,
    hold: Hold,
    /// The value of the leader record the grant wrote with the token as its term (a campaign's
    /// grant), which the lease's first proclaim need not write again.
    record: Option<Arc<[u8]>>,
}

enum Attempt {
    Granted(Grant),
    /// Not ours. `pttl`: the holder's remaining lease in ms; -2 free but a live waiter is first;
    /// -1 a key without TTL (not dlock's). `fence`: the last token the name handed out.
    Busy {
        pttl: i64,
        fence: u64,
    },
}

impl RedisLock {
    /// Connects to the deployment `config` describes.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if no server answers within the connect timeout;
    /// [`LockError::Config`](dlock_api::LockError::Config) if the Sentinels do not know the master.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let hub = Arc::new(Wakeups::default());
        let conn = crate::connect::connect_checked(&config, Wakeups::handler(&hub)).await?;
        let scripts = Scripts::new(conn.may_resend());
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                scripts,
                hub,
                timer: GuardTimer::new(),
                holdings: Holdings::default(),
                held_by: HeldBy::new(&config.prefix),
                watch_conn: tokio::sync::OnceCell::new(),
                config,
            }),
        })
    }

    /// Parses `url` ([`RedisConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL (before any network call), else as [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(RedisConfig::from_url(url)?).await
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The Redis keys and channel of `name`, for operators and tests.
    pub fn keys(&self, name: &LockName) -> LockKeys {
        LockKeys::new(&self.inner.config.prefix, name)
    }

    /// The recovery of one wait: it rides out a lost connection for this long before it gives
    /// up with `Unavailable`.
    fn wait_recovery(&self) -> WaitRecovery {
        let config = &self.inner.config;
        WaitRecovery::new(
            config
                .connect_timeout
                .max(config.command_timeout.saturating_mul(3)),
        )
    }

    /// How long a waiter stays in the queue without refreshing: a waiter that vanished is skipped
    /// by releases after this long. Waiters refresh every third of it.
    fn presence(&self) -> Duration {
        self.inner
            .config
            .command_timeout
            .saturating_mul(2)
            .max(Duration::from_secs(2))
    }

    fn guard(&self, name: &LockName, keys: &Arc<LockKeys>, owner: &Arc<str>, held: Held) -> Grant {
        let state = Arc::new(LeaseState::new(Some(held.valid_until)));
        // The watch looks at the lease weakly: whether it proclaimed, while it lives.
        let lease = Arc::new_cyclic(|lease| {
            // A permit is not watched: its place in the set goes only by its release or its lease.
            // A reader's share also goes when a writer takes the name over its deleted mark.
            let watch = match held.hold {
                Hold::Lock { .. } | Hold::Reader => crate::held::schedule_watch(
                    &self.inner,
                    HeldLock {
                        keys: keys.clone(),
                        owner: owner.clone(),
                        token: held.token as u64,
                        state: state.clone(),
                        lease: lease.clone(),
                        reader: held.hold == Hold::Reader,
                    },
                ),
                Hold::Permit => None,
            };
            let lease = RedisLease::new(
                self.inner.clone(),
                name.clone(),
                keys.clone(),
                owner.clone(),
                held.hold,
                watch,
            );
            match held.record {
                Some(value) => lease.with_record(held.token as u64, value),
                None => lease,
            }
        });
        Grant::new(
            name.clone(),
            FencingToken::new(held.token as u64),
            lease,
            state,
            RenewedBy::Guard,
        )
    }

    /// The first attempt of an acquire: one round trip with the smallest script, which takes the
    /// lock if it is free with nobody queued. `None` if someone holds it; when it is free but
    /// waiters may be queued (the fence is marked), the full [`attempt`](Self::attempt) decides,
    /// without queueing.
    async fn attempt_first(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        if options.is_campaign() {
            // The full acquire writes a candidate's leader record with its grant, which saves
            // the campaign's proclaim a round trip. Boxed, as below.
            return match Box::pin(self.attempt(name, keys, owner, options, false)).await? {
                Attempt::Granted(grant) => Ok(Some(grant)),
                Attempt::Busy { .. } => Ok(None),
            };
        }
        let ttl_ms = ttl_ms(options);
        let (reply, started, pending) = self
            .send_acquire(
                (&self.inner.scripts.acquire_first, LOCK),
                keys,
                owner,
                &[&keys.lock, &keys.fence],
                &[owner.as_bytes(), ttl_ms.as_bytes()],
                options.ttl(),
            )
            .await?;
        match reply {
            redis::Value::Int(0) => {
                pending.disarm();
                Ok(None)
            }
            redis::Value::Int(negative) if negative < 0 => {
                pending.disarm();
                Err(in_use_as(name, 1, negative.unsigned_abs()))
            }
            // Taken just now: the lease is the TTL the script set.
            redis::Value::Int(token) => self
                .granted(
                    pending,
                    name,
                    keys,
                    owner,
                    Held {
                        token,
                        valid_until: lease_end(started, options.ttl()),
                        hold: Hold::Lock { uncontended: true },
                        record: None,
                    },
                )
                .await
                .map(Some),
            redis::Value::Nil => {
                pending.disarm();
                // Boxed, as rare (free, with waiters queued): keeps the first attempt small.
                match Box::pin(self.attempt(name, keys, owner, options, false)).await? {
                    Attempt::Granted(grant) => Ok(Some(grant)),
                    Attempt::Busy { .. } => Ok(None),
                }
            }
            reply => Err(LockError::backend(
                BACKEND,
                format!("unexpected acquire reply {reply:?}"),
            )),
        }
    }

    /// One round trip: take the lock if free and nobody is first in line, or (with `enqueue`)
    /// join or refresh the queue.
    async fn attempt(
        &self,
        name: &LockName,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        options: &LockOptions,
        enqueue: bool,
    ) -> Result<Attempt> {
        let ttl_ms = ttl_ms(options);
        let presence_ms = self.presence().as_millis().to_string();
        let (readers, reader_watchers) = (keys.permits(), keys.reader_watchers());
        let (reply, started, pending) = self
            .send_acquire(
                (&self.inner.scripts.acquire, LOCK),
                keys,
                owner,
                &[
                    &keys.lock,
                    &keys.fence,
                    &keys.queue,
                    &keys.waiters,
                    &readers,
                    &reader_watchers,
                ],
                &[
                    owner.as_bytes(),
                    ttl_ms.as_bytes(),
                    if enqueue { b"1" } else { b"0" },
                    presence_ms.as_bytes(),
                    keys.channel.as_bytes(),
                    self.inner.held_by.prefix.as_bytes(),
                    // A candidate's: its grant writes its leader record (ARGV[7]).
                    options.campaign_value().unwrap_or_default(),
                ][..if options.is_campaign() { 7 } else { 6 }],
                options.ttl(),
            )
            .await?;
        let answer = match &reply {
            redis::Value::Array(items) => match items.as_slice() {
                [
                    redis::Value::Int(a),
                    redis::Value::Int(b),
                    redis::Value::Int(c),
                ] => Some([*a, *b, *c]),
                _ => None,
            },
            _ => None,
        };
        match answer {
            Some([1, token, pttl]) => {
                let lease = Duration::from_millis(pttl.max(0) as u64).min(options.ttl());
                let valid_until = lease_end(started, lease);
                let held = Held {
                    token,
                    valid_until,
                    hold: LOCK,
                    record: campaign_record(options),
                };
                self.granted(pending, name, keys, owner, held)
                    .await
                    .map(Attempt::Granted)
            }
            Some([-1, in_use, _]) => {
                pending.disarm();
                Err(in_use_as(name, 1, in_use.unsigned_abs()))
            }
            Some([0, pttl, fence]) => {
                // Queued or not, the caller's own cleanup covers the queue from here.
                pending.disarm();
                Ok(Attempt::Busy {
                    pttl,
                    fence: fence.max(0) as u64,
                })
            }
            _ => Err(LockError::backend(
                BACKEND,
                format!("unexpected acquire reply {reply:?}"),
            )),
        }
    }

    /// The cleanup of whatever the server may have done for `owner` (taken the lock, queued it,
    /// granted it the lock or a permit), run unless disarmed.
    fn arm_cleanup(&self, keys: &Arc<LockKeys>, owner: &Arc<str>, hold: Hold) -> PendingAcquire {
        let (inner, keys, owner) = (self.inner.clone(), keys.clone(), owner.clone());
        PendingAcquire::arm(move || RedisLease::spawn_cleanup(inner, keys, owner, hold))
    }

    /// A waiter's registration, as `owner`, for the grants announced on the name's channel, and
    /// its cleanup armed: from here the server may queue it or grant it the name, and a dropped
    /// wait undoes both.
    fn join_wait(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        hold: Hold,
    ) -> (Waiting, PendingAcquire) {
        let waiting = self.inner.hub.register(
            &self.inner.conn,
            &keys.channel,
            owner,
            self.inner.config.command_timeout,
        );
        (waiting, self.arm_cleanup(keys, owner, hold))
    }

    /// Runs an acquire script for `owner` with its cleanup armed (the script may take effect even
    /// if this future is dropped or the reply is lost), the cleanup undoing what `hold` says the
    /// script takes: the reply, when the script was sent, and the cleanup, to disarm once the
    /// reply is handled.
    async fn send_acquire(
        &self,
        (script, hold): (&redis::Script, Hold),
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        key_names: &[&str],
        args: &[&[u8]],
        ttl: Duration,
    ) -> Result<(redis::Value, Instant, PendingAcquire)> {
        let started = Instant::now();
        let pending = self.arm_cleanup(keys, owner, hold);
        let reply = self
            .inner
            .conn
            .run_script_bytes(self.inner.config.command_timeout, script, key_names, args)
            .await;
        match reply {
            Ok(reply) => Ok((reply, started, pending)),
            Err(error) => {
                // The script may have run, or may still run, without our knowing.
                pending.disarm();
                RedisLease::spawn_cleanup_of_lost_reply(
                    self.inner.clone(),
                    keys.clone(),
                    owner.clone(),
                    hold,
                    ttl,
                );
                Err(error)
            }
        }
    }

    /// The guard of a grant the server just made: once enough replicas have it, if asked to wait
    /// for them (else the pending cleanup releases it).
    async fn granted(
        &self,
        pending: PendingAcquire,
        name: &LockName,
        keys: &Arc<LockKeys>,
        owner: &Arc<str>,
        held: Held,
    ) -> Result<Grant> {
        if self.inner.config.wait_replicas > 0 {
            self.wait_for_replicas().await?;
        }
        pending.disarm();
        Ok(self.guard(name, keys, owner, held))
    }

    /// `WAIT n timeout`: fails the acquire (the pending cleanup then releases) if too few replicas
    /// acknowledged the write.
    async fn wait_for_replicas(&self) -> Result<()> {
        let config = &self.inner.config;
        let mut wait = redis::cmd("WAIT");
        wait.arg(config.wait_replicas)
            .arg(config.wait_replicas_timeout.as_millis() as u64);
        let acked: usize = self
            .inner
            .conn
            .query(
                config
                    .command_timeout
                    .saturating_add(config.wait_replicas_timeout),
                &wait,
            )
            .await?;
        if acked < config.wait_replicas {
            return Err(LockError::unavailable(
                BACKEND,
                format!(
                    "only {acked} of {} replicas acknowledged the lock in time",
                    config.wait_replicas
                ),
            ));
        }
        Ok(())
    }

    /// The blocking wait after a first attempt found the lock busy: queue, then wait for a grant
    /// announced on the name's channel, re-checking when the holder's lease should end.
    async fn wait_queued(
        &self,
        name: &LockName,
        options: &LockOptions,
        deadline: Option<Instant>,
        (keys, mut owner): (Arc<LockKeys>, Arc<str>),
        mut recovery: WaitRecovery,
    ) -> Result<Option<Grant>> {
        let (mut waiting, mut pending) = self.join_wait(&keys, &owner, LOCK);
        let refresh = self.presence().checked_div(3).unwrap_or_default();
        let mut backoff = 0;
        // The latest attempt that found the lock busy, which dates a grant announced to us
        // (`announced_grant_end`).
        let mut last_busy: Option<(Instant, u64)> = None;
        let mut reply_lost = false;
        loop {
            if std::mem::take(&mut reply_lost) {
                owner = owner_token();
                pending.disarm();
                (waiting, pending) = self.join_wait(&keys, &owner, LOCK);
                last_busy = None;
            }
            let notified = waiting.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(token) = waiting.take_grant() {
                if let Some(valid_until) = announced_grant_end(last_busy, token, options.ttl()) {
                    pending.disarm();
                    return Ok(Some(self.guard(
                        name,
                        &keys,
                        &owner,
                        Held {
                            token: token as i64,
                            valid_until,
                            hold: LOCK,
                            // A candidate's entry in the queue carries its value, and the release
                            // that granted it the lock wrote its record.
                            record: campaign_record(options),
                        },
                    )));
                }
                // An ended grant, or too little of the lease is certain: the attempt below asks
                // the server (the lock is still ours: the lease it has left, counted from this
                // request; it is not: we wait on).
            }
            // A connection killed under a step of the wait (a proxy reset, `CLIENT KILL`) is
            // reconnected and the wait goes on. Only a server that stays unreachable ends it
            // early.
            if let Err(error) = waiting.ensure_subscribed().await {
                recovery
                    .pause_or_give_up(error, options.retry(), deadline)
                    .await?;
                continue;
            }
            let sent = Instant::now();
            let attempt = match self.attempt(name, &keys, &owner, options, true).await {
                Ok(attempt) => {
                    recovery.reached_server();
                    attempt
                }
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                    // The attempt's reply was lost, so its cleanup now undoes whatever the
                    // server did for this owner, a grant a release may give it meanwhile
                    // included: the wait goes on as a new owner, at the end of the queue.
                    reply_lost = true;
                    continue;
                }
            };
            let pttl = match attempt {
                Attempt::Granted(grant) => {
                    pending.disarm();
                    return Ok(Some(grant));
                }
                Attempt::Busy { pttl, fence } => {
                    last_busy = Some((sent, fence));
                    pttl
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                // Leave the queue (or pass on a grant that raced in) before reporting the timeout.
                RedisLease::cancel(&self.inner, &keys, &owner, LOCK).await?;
                pending.disarm();
                return Ok(None);
            }
            // Re-check at the latest when our presence needs refreshing, when the holder's lease
            // ends (a lost announcement must not strand us), or, if the lock is free with a live
            // waiter first, after a short back-off.
            let mut wake_at = after(now, refresh);
            if pttl >= 0 {
                wake_at = wake_at.min(after(now, Duration::from_millis(pttl as u64)));
            } else if pttl == -2 {
                wake_at = wake_at.min(after(now, options.retry().delay(backoff)));
                backoff = backoff.saturating_add(1);
            }
            if let Some(deadline) = deadline {
                wake_at = wake_at.min(deadline);
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = waiting.granted_signal() => {}
                _ = sleep_until(wake_at) => {}
            }
        }
    }
}

/// A lock taken after the first attempt (others may be queued for it).
const LOCK: Hold = Hold::Lock { uncontended: false };

/// The error for asking `asked` permits of `name` (a lock asks one), which the server says is
/// in use with `in_use`.
fn in_use_as(name: &LockName, asked: u32, in_use: u64) -> LockError {
    dlock_api::raw::permits_mismatch(name, asked, u32::try_from(in_use).unwrap_or(u32::MAX))
}

/// The leader record a grant under `options` writes: a campaign's value ([`Held::record`]).
fn campaign_record(options: &LockOptions) -> Option<Arc<[u8]>> {
    options.campaign_value().map(Arc::from)
}

/// The lease the acquire scripts set, in whole milliseconds (at least 1: `PX 0` is an error).
fn ttl_ms(options: &LockOptions) -> String {
    options.ttl().as_millis().max(1).to_string()
}

/// A random owner value, shared by the acquire's keys, cleanup and lease.
fn owner_token() -> Arc<str> {
    dlock_api::raw::random_owner().into()
}

dlock_api::impl_distributed_lock!(RedisLock);

#[async_trait]
impl RawLock for RedisLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &Holdings {
        &self.inner.holdings
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::BestEffort,
            fifo: true,
            inspect: true,
            takeover_signal: true,
            max_permits: permits::MAX_PERMITS,
            one_limit_per_name: true,
            elections: true,
            reader_writer: true,
            ..Capabilities::TTL_LEASE
        }
    }

    /// One read-only script: the lock key's owner and PTTL (the readers' mark and the last
    /// reader's lease while readers hold), the fence counter (the holder's token), the live
    /// readers, and the live waiters in the queue with the readers among them.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let inner = &self.inner;
        let view = crate::node::inspect_on(
            &inner.conn,
            &inner.scripts.inspect,
            &self.keys(name),
            inner.config.command_timeout,
        )
        .await?;
        let inspection = match view.holder {
            Some(owner) => {
                let held = Inspection::held(view.fence.map(FencingToken::new))
                    .with_waiters(view.waiters)
                    .with_holder(owner);
                match view.pttl {
                    Some(pttl) => held.with_remaining(pttl),
                    None => held,
                }
            }
            None => Inspection::free(Some(view.waiters)),
        };
        Ok(inspection.with_readers(view.readers, view.waiting_readers))
    }

    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        if options.is_shared() {
            return self.try_permit(name, Share::Reader, options).await;
        }
        if limit > 1 {
            return self.try_permit(name, Share::Permits(limit), options).await;
        }
        let keys = Arc::new(self.keys(name));
        self.attempt_first(name, &keys, &owner_token(), options)
            .await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        if options.is_shared() || limit > 1 {
            let share = match options.is_shared() {
                true => Share::Reader,
                false => Share::Permits(limit),
            };
            // Boxed, as the lock's wait below: most acquires never wait.
            return Box::pin(self.wait_permit(name, share, options, deadline)).await;
        }
        let keys = Arc::new(self.keys(name));
        let mut recovery = self.wait_recovery();
        let owner = loop {
            let owner = owner_token();
            match self.attempt_first(name, &keys, &owner, options).await {
                Ok(Some(grant)) => return Ok(Some(grant)),
                Ok(None) => break owner,
                // The first attempt is a step of the wait too: a connection killed under it is
                // ridden out. Its lost reply's cleanup undoes what the server did for that owner,
                // so the next try is a new owner.
                Err(error) => {
                    recovery
                        .pause_or_give_up(error, options.retry(), deadline)
                        .await?;
                }
            }
        };
        // Boxed: the wait is a large future, and most acquires never get here. In place it would
        // make every acquire's future (which the trait boxes) as large, to be moved and freed.
        Box::pin(self.wait_queued(name, options, deadline, (keys, owner), recovery)).await
    }

    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        self.count(name).await
    }

    /// One read-only script: the lock key's holder and the leader record, which counts only if
    /// its owner is that holder.
    async fn leader(&self, name: &LockName) -> Result<Option<dlock_api::Leader>> {
        self.read_leader(name).await
    }

    async fn observe_leader(&self, name: &LockName) -> Result<dlock_api::LeaderStream> {
        self.leader_changes(name).await
    }

    /// One script for the whole set (`scripts/set.rs`), where its keys may share a script.
    async fn try_grant_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<dlock_api::raw::GrantedAtOnce> {
        self.try_set_at_once(names, options).await
    }
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis({})", self.inner.config)
    }
}
