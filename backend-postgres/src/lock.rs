//! `PostgresLock`: session advisory locks behind the `DistributedLock` trait.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::raw::{
    Claim, Grant, GrantedAtOnce, Holdings, RawLock, SessionPool, acquire_by, try_acquire_by,
};
use dlock_api::{
    Capabilities, Fencing, Inspection, KeyMapper, LockGuard, LockName, LockOptions, Result,
};
use sqlx::Connection;
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::PostgresConfig;
use crate::driver::{MAX_PERMITS, PgDriver, open_connection, slot_keys};
use crate::election::LeaderSql;
use crate::fence::Fence;
use crate::inspect::Inspector;
use crate::key::AdvisoryKey;
use crate::pooler::ensure_own_sessions;
use crate::sql::Sql;

/// Distributed locks on Postgres session advisory locks.
///
/// Each `PostgresLock` is one client with its own connections (at most `max_connections`):
/// a few **sessions** that each hold many locks, plus connections borrowed for server-side
/// blocking waits. Clone it (cheap) to share; call [`PostgresLock::connect`] again for an
/// independent client. Dropping the last clone and every guard closes the connections, which
/// frees their locks on the server.
#[doc = include_str!("docs.md")]
#[derive(Clone)]
pub struct PostgresLock {
    pool: SessionPool<PgDriver>,
    inspector: Arc<Inspector>,
}

impl PostgresLock {
    /// Connects to the server `config` names and checks (or creates) the fence sequence.
    ///
    /// The connection it opens stays as the client's first session.
    ///
    /// # Errors
    /// - [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server does not answer within the connect timeout;
    /// - [`LockError::Config`](dlock_api::LockError::Config) if the server refuses the credentials or database, or the fence
    ///   sequence is missing (with `create_fence=false`), cannot be created, or has a cache;
    ///   or if the connections' server sessions change between transactions: a pooler in
    ///   transaction mode (PgBouncer `pool_mode=transaction`) sits in front, where session
    ///   locks are unsafe. `connect` checks this with a second, short-lived connection.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future closes the half-open connections; nothing is locked.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        // Checked before any network call.
        if config.fencing {
            config.quoted_sequence()?;
        }
        let mut conn = open_connection(&config).await?;
        {
            let mut second = open_connection(&config).await?;
            let checked = ensure_own_sessions(&mut conn, &mut second, config.command_timeout).await;
            // Closed politely either way; the pool opens what it needs.
            let _ = second.close().await;
            checked?;
        }
        let fence = if config.fencing {
            Some(Fence::ensure(&mut conn, &config, config.create_fence).await?)
        } else {
            None
        };
        let leaders = if let Some(fence) = &fence {
            let leaders =
                LeaderSql::new(&config)?.with_grant(&fence.draw_sql(), fence.draws_unlogged());
            if config.create_fence {
                leaders.create(&mut conn, config.command_timeout).await?;
            }
            Some(leaders)
        } else {
            None
        };
        let sql = Sql::new(fence.as_ref().map(Fence::draw_sql).as_deref());
        let driver = PgDriver::new(config, sql, fence, leaders)?;
        let pid = driver.prepare(&mut conn).await?;
        let pool_config = driver.pool_config();
        let pool = SessionPool::new(driver, pool_config);
        pool.adopt_idle(conn, pid);
        Ok(Self {
            pool,
            inspector: Arc::default(),
        })
    }

    /// Parses `url` ([`PostgresConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL (before any network call), else as
    /// [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// As [`connect`](Self::connect).
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(PostgresConfig::from_url(url)?).await
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &PostgresConfig {
        &self.pool.driver().config
    }

    /// How many connections this client has open right now (sessions and waits): for dlock's
    /// tests; not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn connections(&self) -> usize {
        self.pool.connections()
    }

    /// Creates the fence sequence (`CREATE SEQUENCE IF NOT EXISTS … CACHE 1`) and, unless
    /// `fence_window=0` or the server predates PostgreSQL 15, the fence window next to it (an
    /// unlogged sequence `NAME_fast`, a one-row table `NAME_window` and a function
    /// `NAME_renew(bigint)`) if they are missing or the function is out of date, and the
    /// elections' leaders table `NAME_leaders`: for deployments that run with
    /// `create_fence=false` and migrate with a privileged user. The user the clients connect
    /// as then needs `USAGE, UPDATE` on the sequences `NAME` and `NAME_fast` and `SELECT,
    /// INSERT, UPDATE` on the table `NAME_window` (the renewal runs with the caller's rights);
    /// with `fence_window=0`, `USAGE` on `NAME`; and for elections `SELECT, INSERT, UPDATE,
    /// DELETE` on `NAME_leaders`.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) if they cannot be created or the sequence exists with a cache;
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the DDL is one statement; it either ran or not.
    pub async fn migrate(&self) -> Result<()> {
        let config = self.config();
        let mut conn = open_connection(config).await?;
        Fence::ensure(&mut conn, config, true).await?;
        LeaderSql::new(config)?
            .create(&mut conn, config.command_timeout)
            .await
    }

    /// [`try_acquire`](dlock_api::DistributedLock::try_acquire) with an [`AdvisoryKey`]: an integer key
    /// (or pair) you already have, used as is. The guard's name is
    /// [`AdvisoryKey::lock_name`].
    ///
    /// # Errors
    /// As [`try_acquire`](dlock_api::DistributedLock::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call queues an owner-checked unlock on the session it used.
    pub async fn try_acquire_key(
        &self,
        key: &AdvisoryKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let name = key.lock_name();
        let raw = key.raw();
        let attempt = self.pool.try_grant(&name, &raw, 1);
        try_acquire_by(self, options, attempt).await
    }

    /// [`acquire`](dlock_api::DistributedLock::acquire) with an [`AdvisoryKey`].
    ///
    /// # Errors
    /// As [`acquire`](dlock_api::DistributedLock::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call cancels its server-side wait (`pg_cancel_backend`) and
    /// releases the lock if the server granted it meanwhile.
    pub async fn acquire_key(&self, key: &AdvisoryKey, options: &LockOptions) -> Result<LockGuard> {
        let name = key.lock_name();
        let raw = key.raw();
        acquire_by(self, &name, options, |deadline| {
            self.pool.wait_grant(&name, &raw, 1, options, deadline)
        })
        .await
    }

    /// [`inspect`](dlock_api::DistributedLock::inspect) with an [`AdvisoryKey`]: who holds the
    /// key (`pid N`) and how many wait for it, from `pg_locks`.
    ///
    /// # Errors
    /// As [`inspect`](dlock_api::DistributedLock::inspect).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn inspect_key(&self, key: &AdvisoryKey) -> Result<Inspection> {
        self.inspector.inspect(self.config(), key).await
    }
}

dlock_api::impl_distributed_lock!(PostgresLock);

#[async_trait]
impl RawLock for PostgresLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &Holdings {
        self.pool.holdings()
    }

    async fn shutdown(&self, _deadline: Instant) {
        self.pool.driver().listener.close();
        self.pool.shutdown().await;
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: if self.config().fencing {
                Fencing::Strict
            } else {
                Fencing::None
            },
            inspect: true,
            takeover_signal: true,
            // See `MAX_PERMITS` for why so few.
            max_permits: MAX_PERMITS,
            one_limit_per_name: true,
            // A term is a fencing token: without fencing there is none.
            elections: self.config().fencing,
            // Shared advisory locks on the name's key; see the crate docs.
            reader_writer: true,
            ..Capabilities::SESSION_LEASE
        }
    }

    /// The name's advisory key in `pg_locks`: the holder's backend pid and how many wait. No
    /// token: the fence sequence is shared by every name.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        self.inspector
            .inspect(self.config(), &AdvisoryKey::Name(name.clone()))
            .await
    }

    /// The name's advisory lock, or for `limit` above 1 one of `limit` slot locks of the name on
    /// a pooled session (see the crate docs, *Semaphores*), or for a reader the name's key held
    /// shared (*Reader-writer locks*).
    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        let key = AdvisoryKey::Name(name.clone());
        let claim = Claim::new(limit, options);
        self.pool.try_claim(name, &key.raw(), claim).await
    }

    /// Every name's advisory lock on one pooled session, in one statement (see the crate
    /// docs, *Several locks at once*).
    async fn try_grant_at_once(
        &self,
        names: &[LockName],
        _options: &LockOptions,
    ) -> Result<GrantedAtOnce> {
        let keys: Vec<_> = names
            .iter()
            .map(|name| AdvisoryKey::Name(name.clone()).raw())
            .collect();
        self.pool.try_grant_all(names, &keys).await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let key = AdvisoryKey::Name(name.clone());
        self.pool
            .wait_grant(name, &key.raw(), limit, options, deadline)
            .await
    }

    /// The name's row in the leaders table, counted while its writer's backend holds the
    /// name's advisory key (`pg_locks`).
    async fn leader(&self, name: &LockName) -> Result<Option<dlock_api::Leader>> {
        let key = AdvisoryKey::Name(name.clone());
        self.pool.leader(name, &key.raw()).await
    }

    /// The leader read again every `OBSERVE_RETRY` (250 ms): a backend that dies notifies
    /// nobody.
    async fn observe_leader(&self, name: &LockName) -> Result<dlock_api::LeaderStream> {
        let key = AdvisoryKey::Name(name.clone());
        Ok(self.pool.observe_leader(name, &key.raw()))
    }

    /// The name's slot locks held now, in `pg_locks` (every slot a semaphore of the most
    /// permits could use), or 1 for a lock.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        let k = KeyMapper::hash_i64(name);
        self.inspector
            .count_held(self.config(), slot_keys(k, MAX_PERMITS, 0), k)
            .await
    }
}

impl fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLock")
            .field("pool", &self.pool)
            .finish()
    }
}

impl fmt::Display for PostgresLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "postgres({})", self.config())
    }
}
