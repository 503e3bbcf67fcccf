//! `MySqlLock`: `GET_LOCK` named locks over the shared session pool, fencing in the same
//! statement.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::raw::{Grant, GrantedAtOnce, Holdings, RawLock, SessionPool};
use dlock_api::{Capabilities, Fencing, Inspection, KeyMapper, LockName, LockOptions, Result};
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::MySqlConfig;
use crate::driver::{MAX_PERMITS, MySqlDriver, SUFFIX_CHARS, semaphore_key};
use crate::inspect::Inspector;

/// The server's limit on lock names, in characters.
const MAX_KEY_CHARS: usize = 64;

/// Keys may use printable ASCII without spaces (trailing spaces may compare equal under PAD SPACE
/// rules); anything else goes into the digest.
fn key_char(c: char) -> bool {
    c.is_ascii_graphic()
}

/// Locks on MySQL or MariaDB named locks (`GET_LOCK` / `RELEASE_LOCK`).
///
/// Each `MySqlLock` is one client: a small set of connections (at most `max_connections`) that
/// hold its locks. Clone it (cheap) to share; call [`MySqlLock::connect`] again for an independent
/// client. A lock is released on the connection that took it; a connection is reused only when it
/// holds nothing; dropping the last clone closes the connections, which frees their locks.
#[doc = include_str!("docs.md")]
#[derive(Clone)]
pub struct MySqlLock {
    pool: SessionPool<MySqlDriver>,
    keys: Arc<KeyMapper>,
    /// Names as semaphores' keys: shorter than a lock's by the slot suffix.
    semaphore_keys: Arc<KeyMapper>,
    inspector: Arc<Inspector>,
}

impl MySqlLock {
    /// Creates a client for the server `config` describes and checks that it answers.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for inconsistent options; [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server
    /// does not answer within the connect timeout; [`LockError::Backend`](dlock_api::LockError::Backend) if it refuses the login.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it leaves nothing behind.
    pub async fn connect(config: MySqlConfig) -> Result<Self> {
        config.check()?;
        let budget = MAX_KEY_CHARS.saturating_sub(config.prefix.len());
        let keys = KeyMapper::new(budget)
            .case_insensitive()
            .with_allowed(key_char);
        let semaphore_keys = KeyMapper::new(budget.saturating_sub(SUFFIX_CHARS))
            .case_insensitive()
            .with_allowed(key_char);
        let driver = MySqlDriver::new(config)?;
        let pool_config = driver.pool_config();
        let pool = SessionPool::new(driver, pool_config);
        // Open the first connection now, so a wrong address or password fails here.
        pool.open_idle().await?;
        Ok(Self {
            pool,
            keys: Arc::new(keys),
            semaphore_keys: Arc::new(semaphore_keys),
            inspector: Arc::default(),
        })
    }

    /// Parses `url` ([`MySqlConfig::from_url`]) and connects.
    ///
    /// # Errors
    /// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL (before any network call), else as
    /// [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn connect_url(url: &str) -> Result<Self> {
        Self::connect(MySqlConfig::from_url(url)?).await
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &MySqlConfig {
        &self.pool.driver().config
    }

    fn raw_key(&self, name: &LockName) -> Arc<str> {
        format!("{}{}", self.config().prefix, self.keys.map(name)).into()
    }

    /// The key of `name` as a semaphore's, before its number (`<key> <N>` is the semaphore of
    /// `N` permits, `<key> <N>/<i>` its slot `i`): a lock's key mapped to six characters fewer.
    fn semaphore_base(&self, name: &LockName) -> String {
        format!("{}{}", self.config().prefix, self.semaphore_keys.map(name))
    }

    /// The pool's key for one of `limit` places of `name`: the lock's key for one, the
    /// semaphore's otherwise.
    fn claim_key(&self, name: &LockName, limit: u32) -> Arc<str> {
        if limit > 1 {
            semaphore_key(&self.semaphore_base(name), limit)
        } else {
            self.raw_key(name)
        }
    }

    /// The `GET_LOCK` key of `name`: the configured prefix, then the name itself when it is at
    /// most 64 characters of printable ASCII without upper-case letters or `~`, else
    /// `<readable prefix>~<160-bit digest>` (see [`dlock_api::KeyMapper`]). It is also the
    /// fencing table's row key.
    pub fn key(&self, name: &LockName) -> String {
        self.raw_key(name).to_string()
    }

    /// The server connection id (`CONNECTION_ID()`) holding `name` for this client, if it does:
    /// for dlock's fault tests (`KILL <id>`); not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn holder_connection_id(&self, name: &LockName) -> Option<u64> {
        self.pool.holder(&self.raw_key(name))
    }

    /// How many server connections this client has open (sessions, waiters and idle ones): for
    /// dlock's tests; not part of the API.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn connection_count(&self) -> usize {
        self.pool.connections()
    }

    /// Creates the fencing table (MySQL) or sequence (MariaDB), and the elections' leaders
    /// table (`TABLE_leaders`), if they do not exist (what the first acquire and the first
    /// proclaim do when `create_table` is on).
    ///
    /// # Errors
    /// [`LockError::Backend`](dlock_api::LockError::Backend) if the server refuses (no `CREATE` privilege);
    /// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if it cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the statement runs on a connection of its own, closed when dropped.
    pub async fn migrate(&self) -> Result<()> {
        self.pool.driver().migrate().await
    }
}

dlock_api::impl_distributed_lock!(MySqlLock);

#[async_trait]
impl RawLock for MySqlLock {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn holdings(&self) -> &Holdings {
        self.pool.holdings()
    }

    async fn shutdown(&self, _deadline: Instant) {
        self.pool.shutdown().await;
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: if self.config().fencing {
                Fencing::Strict
            } else {
                Fencing::None
            },
            max_name_bytes: Some(MAX_KEY_CHARS.saturating_sub(self.config().prefix.len())),
            inspect: true,
            takeover_signal: true,
            // A term is a fencing token: without fencing there is none.
            elections: self.config().fencing,
            max_permits: MAX_PERMITS,
            ..Capabilities::SESSION_LEASE
        }
    }

    /// `IS_USED_LOCK` (the holder's connection id), the connections waiting in `GET_LOCK`
    /// (performance_schema), and on MySQL the fence row (the holder's token; MariaDB's sequence
    /// keeps no token per key), on a connection kept for it.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        self.inspector
            .inspect(self.pool.driver(), &self.raw_key(name))
            .await
    }

    /// The key's row in the leaders table, counted while `IS_USED_LOCK` names the connection
    /// that wrote it.
    async fn leader(&self, name: &LockName) -> Result<Option<dlock_api::Leader>> {
        self.pool.leader(name, &self.raw_key(name)).await
    }

    /// The leader read again every `OBSERVE_RETRY` (250 ms): a connection that dies notifies
    /// nobody.
    async fn observe_leader(&self, name: &LockName) -> Result<dlock_api::LeaderStream> {
        Ok(self.pool.observe_leader(name, &self.raw_key(name)))
    }

    /// Every used slot of every semaphore the name can have (its numbers 2 to 64), in one
    /// statement on the inspection's connection.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        self.inspector
            .count_permits(self.pool.driver(), &self.semaphore_base(name))
            .await
    }

    /// A lock's `GET_LOCK`, or for several places one of the semaphore's slot locks (see the
    /// crate docs, *Semaphores*).
    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        _options: &LockOptions,
    ) -> Result<Option<Grant>> {
        self.pool
            .try_grant(name, &self.claim_key(name, limit), limit)
            .await
    }

    /// Every name's `GET_LOCK` on one pooled connection, in one statement where the fence
    /// allows (see the crate docs, *Several locks at once*).
    async fn try_grant_at_once(
        &self,
        names: &[LockName],
        _options: &LockOptions,
    ) -> Result<GrantedAtOnce> {
        let keys: Vec<_> = names.iter().map(|name| self.raw_key(name)).collect();
        self.pool.try_grant_all(names, &keys).await
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.pool
            .wait_grant(name, &self.claim_key(name, limit), limit, options, deadline)
            .await
    }
}

impl fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLock")
            .field("pool", &self.pool)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql({})", self.config())
    }
}
