//! `RedisLock`: acquire with one script, wait on pub/sub, renew through the shared watchdog.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::{LeaseState, PendingAcquire};
use dlock_api::{
    Capabilities, DistributedLock, Fencing, FencingToken, LeaseKind, LockError, LockGuard,
    LockName, LockOptions, Result,
};
use tokio::time::{Instant, sleep_until};

use crate::BACKEND;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::keys::LockKeys;
use crate::lease::RedisLease;
use crate::scripts::Scripts;
use crate::wake::Wakeups;

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

pub(crate) struct Inner {
    pub(crate) config: RedisConfig,
    pub(crate) conn: Conn,
    pub(crate) scripts: Scripts,
    hub: Arc<Wakeups>,
}

enum Attempt {
    Granted(LockGuard),
    Busy { retry_after: Option<Duration> },
}

impl RedisLock {
    /// Connects to the deployment `config` describes.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if no server answers within the connect timeout;
    /// [`LockError::Config`] if the Sentinels do not know the master.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let hub = Arc::new(Wakeups::default());
        let conn = Conn::connect(&config, Wakeups::handler(&hub)).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                conn,
                scripts: Scripts::new(),
                hub,
            }),
        })
    }

    /// Parses `url` ([`RedisConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad URL (before any network call), else as [`connect`](Self::connect).
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

    async fn attempt(
        &self,
        name: &LockName,
        keys: &LockKeys,
        owner: &str,
        options: &LockOptions,
    ) -> Result<Attempt> {
        let inner = &self.inner;
        let ttl_ms = options.ttl().as_millis().max(1).to_string();
        let started = Instant::now();
        // The SET may take effect even if this future is dropped or the reply is lost.
        let pending = {
            let (inner, keys, owner) = (inner.clone(), keys.clone(), owner.to_owned());
            PendingAcquire::arm(move || RedisLease::spawn_cleanup(inner, keys, owner))
        };
        let (granted, value): (i64, i64) = inner
            .conn
            .run_script(
                inner.config.command_timeout,
                &inner.scripts.acquire,
                &[&keys.lock, &keys.fence],
                &[owner, &ttl_ms],
            )
            .await?;
        if granted != 1 {
            pending.disarm();
            // PTTL: -2 gone meanwhile, -1 no TTL (not ours): re-check at once, or after the lease.
            let retry_after = (value >= 0).then(|| Duration::from_millis(value as u64));
            return Ok(Attempt::Busy {
                retry_after: retry_after.or(Some(Duration::ZERO)),
            });
        }
        if inner.config.wait_replicas > 0 {
            self.wait_for_replicas().await?;
        }
        pending.disarm();
        let state = Arc::new(LeaseState::new(Some(started + options.ttl())));
        let lease = Arc::new(RedisLease::new(
            inner.clone(),
            name.clone(),
            keys.clone(),
            owner.to_owned(),
        ));
        Ok(Attempt::Granted(LockGuard::new(
            name.clone(),
            FencingToken::new(value as u64),
            lease,
            state,
            options,
        )))
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
            .query(config.command_timeout + config.wait_replicas_timeout, &wait)
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
}

fn owner_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::BestEffort,
            lease: LeaseKind::Ttl,
            extend: true,
            fifo: false,
            wake_on_release: true,
            lost_signal: true,
            survives_failover: false,
            reentrant: false,
            max_name_bytes: None,
            max_ttl: None,
        }
    }

    async fn try_acquire(
        &self,
        name: &LockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.capabilities().check(BACKEND, options)?;
        let keys = self.keys(name);
        match self.attempt(name, &keys, &owner_token(), options).await? {
            Attempt::Granted(guard) => Ok(Some(guard)),
            Attempt::Busy { .. } => Ok(None),
        }
    }

    async fn acquire(&self, name: &LockName, options: &LockOptions) -> Result<LockGuard> {
        self.capabilities().check(BACKEND, options)?;
        let started = Instant::now();
        let deadline = options.wait_timeout().map(|wait| started + wait);
        let keys = self.keys(name);
        let owner = owner_token();
        if let Attempt::Granted(guard) = self.attempt(name, &keys, &owner, options).await? {
            return Ok(guard);
        }
        let timeout = self.inner.config.command_timeout;
        let waiting = self
            .inner
            .hub
            .register(&self.inner.conn, &keys.channel, timeout)
            .await?;
        loop {
            let notified = waiting.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            waiting.ensure_subscribed().await?;
            let retry_after = match self.attempt(name, &keys, &owner, options).await? {
                Attempt::Granted(guard) => return Ok(guard),
                Attempt::Busy { retry_after } => retry_after,
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                });
            }
            // The fallback re-check at the holder's remaining TTL guards against a lost message.
            let recheck = retry_after.map(|d| Instant::now() + d);
            let wake_at = match (recheck, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake_at {
                Some(at) => tokio::select! {
                    _ = &mut notified => {}
                    _ = sleep_until(at) => {}
                },
                None => notified.await,
            }
        }
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
