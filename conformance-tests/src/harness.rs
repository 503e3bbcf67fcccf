//! What a deployment under test provides: fresh clients and, optionally, fault hooks.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, LockOptions, Renewal, Result};

/// One deployment under test: a backend in one topology (`redis`, `redis-cluster`, `memory`, …).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// Names the setup in reports, e.g. `redis-sentinel`.
    fn label(&self) -> &str;

    /// A **fresh, independent client** (its own connections or session) on every call: exclusion
    /// is tested between separate clients, as between separate processes.
    async fn client(&self) -> Result<Arc<dyn DistributedLock>>;

    /// Fault hooks backed by a server the harness controls; `None` when it cannot simulate faults
    /// (a deployed server reached by URL). Cases that need them are then not run.
    fn faults(&self) -> Option<&dyn Faults> {
        None
    }

    /// Environment variables that make this harness's setup, run in a **child process** (the
    /// same test binary, re-executed), reach the same deployment: typically
    /// `DLOCK_TEST_<BACKEND>_URL`. `None` (the default): cases that crash a holder process do not
    /// run.
    fn child_env(&self) -> Option<Vec<(String, String)>> {
        None
    }

    /// Time scale of the cases. The default suits servers on loopback.
    fn timing(&self) -> Timing {
        Timing::default()
    }

    /// How many waiters `scale::thousand_waiters_are_all_served_in_turn` lines up on one name:
    /// 1,000 by default. A deployment whose test client cannot keep that many waiters within its
    /// command timeout on a loaded two-core machine (a debug build's Redis Cluster client) says
    /// less, and why.
    fn line_at_scale(&self) -> usize {
        1_000
    }

    /// What is left on the server of `names`: locks held, waiters queued (not what a backend keeps
    /// by design, such as fencing counters). Empty means clean. The runner calls it after every
    /// case, with every name the case used, until it is empty or the timing's bound passes, so a
    /// lock or waiter that outlives the clients that made it fails the case instead of passing
    /// silently.
    ///
    /// The default asks a fresh client to take each name at once: it sees held locks, not queued
    /// waiters. Harnesses that can read the server (keys under a prefix, `pg_locks`,
    /// `IS_USED_LOCK`) say more.
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let client = self.client().await.map_err(|e| e.to_string())?;
        let mut left = Vec::new();
        for name in names {
            let mut options = LockOptions::new();
            if !client.capabilities().extend {
                options = options.with_renewal(Renewal::Off);
            }
            match client.try_acquire(name, &options).await {
                Ok(Some(guard)) => guard.release().await.map_err(|e| e.to_string())?,
                Ok(None) => left.push(format!("{name} is held")),
                Err(error) => return Err(format!("checking {name}: {error}")),
            }
        }
        Ok(left)
    }
}

/// A fault a harness may be able to inject; cases that need one it cannot show as not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// [`Faults::kill_holder`].
    KillHolder,
    /// [`Faults::kill_one_hold`].
    KillOneHold,
    /// [`Faults::kill_waiters`].
    KillWaiters,
    /// [`Faults::session_client`].
    SuspendSession,
    /// [`Faults::own_server`].
    OwnServer,
    /// [`Faults::amnesia`].
    Amnesia,
    /// [`Faults::amnesia_mitigated`].
    AmnesiaMitigated,
    /// [`Faults::proxy_target`]: offered by every harness with [`Fault::OwnServer`], and by
    /// harnesses of a deployed server that can rewrite its address.
    ProxyLink,
    /// [`Faults::task_client`]: the fault suite's workers run as tasks of this process.
    TaskWorkers,
}

/// A worker task's client, and its link to the deployment.
pub type TaskClient = (Arc<dyn DistributedLock>, Box<dyn ClientLink>);

/// A client's link to an in-process deployment, which a case can cut (see
/// [`Faults::task_client`]).
pub trait ClientLink: Send + Sync {
    /// The client's requests stop reaching the deployment (they fail), and its renewals with
    /// them: what a paused or killed process looks like from the store.
    fn cut(&self);
    /// They reach it again.
    fn restore(&self);
}

/// A server of one case's own, which the case may crash, restart and pause, and reach through a
/// fault proxy; the cases that do this to a server cannot share one with other cases.
pub struct OwnServer {
    /// The server process.
    pub process: Box<dyn dlock_test_servers::ServerProcess>,
    /// Clients of this server (and child processes that reach it).
    pub harness: Arc<dyn Harness>,
    /// A harness of the same backend and options that reaches this server at another address:
    /// a fault proxy in front of it.
    pub reach_at: Box<dyn Fn(std::net::SocketAddr) -> Arc<dyn Harness> + Send + Sync>,
}

impl OwnServer {
    /// Starts a server with `start` (off the runtime's threads: starting waits for it to
    /// answer) and makes it an [`OwnServer`] with [`new`](Self::new).
    ///
    /// # Errors
    /// When the server does not start (its message says how to install it, if it is missing).
    pub async fn start<P: dlock_test_servers::ServerProcess + 'static>(
        start: impl FnOnce() -> dlock_test_servers::Result<P> + Send + 'static,
        harness_for: impl Fn(String) -> Arc<dyn Harness> + Send + Sync + 'static,
    ) -> std::result::Result<Self, String> {
        let process = tokio::task::spawn_blocking(start)
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(Self::new(process, harness_for))
    }

    /// The usual shape: `process` serves at its URL, and `harness_for(url)` makes a harness of
    /// the backend for a URL (the process's own, or the same with a proxy's address).
    pub fn new(
        process: impl dlock_test_servers::ServerProcess + 'static,
        harness_for: impl Fn(String) -> Arc<dyn Harness> + Send + Sync + 'static,
    ) -> Self {
        let (url, addr) = (process.url(), process.addr().to_string());
        let harness = harness_for(url.clone());
        Self {
            process: Box::new(process),
            harness,
            reach_at: Box::new(move |at| harness_for(url.replace(&addr, &at.to_string()))),
        }
    }
}

impl std::fmt::Debug for OwnServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnServer")
            .field("url", &self.process.url())
            .field("harness", &self.harness.label())
            .finish_non_exhaustive()
    }
}

/// Makes a harness whose clients reach a deployment through proxies at the given addresses.
pub type ReachThrough = Box<dyn Fn(&[std::net::SocketAddr]) -> Arc<dyn Harness> + Send + Sync>;

/// A deployment a case reaches through fault proxies of its own (a partition, lost or late
/// replies, a slow link): where the proxies forward to (one per server a client talks to:
/// usually one, Redlock's N nodes), clients that connect directly, and clients that connect
/// through proxies listening at given addresses. No power over the servers themselves, so a
/// deployed server can be the target too.
pub struct ProxyTarget {
    /// The addresses the proxies forward to, one proxy each.
    pub upstreams: Vec<std::net::SocketAddr>,
    /// Clients that connect directly.
    pub harness: Arc<dyn Harness>,
    /// Clients (and child processes) that connect through proxies at the given addresses
    /// instead, one per upstream and in the same order.
    pub reach_at: ReachThrough,
    /// Servers of the case's own, kept running for the case.
    _servers: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl ProxyTarget {
    /// A target of one server the harness does not own (a deployed one).
    pub fn deployed(
        upstream: std::net::SocketAddr,
        harness: Arc<dyn Harness>,
        reach_at: impl Fn(std::net::SocketAddr) -> Arc<dyn Harness> + Send + Sync + 'static,
    ) -> Self {
        Self {
            upstreams: vec![upstream],
            harness,
            reach_at: Box::new(move |at| reach_at(at[0])),
            _servers: None,
        }
    }

    /// A target of several servers of the case's own (`servers`, kept running while the target
    /// lives), each behind a proxy of its own: Redlock's nodes, a cluster's members.
    pub fn owned(
        upstreams: Vec<std::net::SocketAddr>,
        harness: Arc<dyn Harness>,
        reach_at: impl Fn(&[std::net::SocketAddr]) -> Arc<dyn Harness> + Send + Sync + 'static,
        servers: impl std::any::Any + Send + Sync,
    ) -> Self {
        Self {
            upstreams,
            harness,
            reach_at: Box::new(reach_at),
            _servers: Some(Box::new(servers)),
        }
    }
}

impl From<OwnServer> for ProxyTarget {
    fn from(own: OwnServer) -> Self {
        let reach_at = own.reach_at;
        Self {
            upstreams: vec![own.process.addr()],
            harness: own.harness,
            reach_at: Box::new(move |at| reach_at(at[0])),
            _servers: Some(Box::new(own.process)),
        }
    }
}

impl std::fmt::Debug for ProxyTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyTarget")
            .field("upstreams", &self.upstreams)
            .field("harness", &self.harness.label())
            .finish_non_exhaustive()
    }
}

/// A deployment of a case's own that can be made to **forget a lock it granted**, the way a known
/// hazard of the backend does: Redis evicting keys under memory pressure, a Sentinel failover to a
/// replica the grant never reached, Redlock nodes restarted without persistence. The case that
/// uses it is a negative control of the suite itself: the history checker must report the
/// overlap that follows. Backends whose servers never forget a granted lock (consensus stores,
/// database sessions) do not offer it.
#[async_trait]
pub trait Amnesia: Send + Sync {
    /// Clients of this deployment (and child processes that reach it).
    fn harness(&self) -> Arc<dyn Harness>;

    /// What the deployment will be made to do, for the nemesis log: e.g. `evict keys under
    /// maxmemory-policy volatile-ttl`.
    fn hazard(&self) -> String;

    /// Prepares the fault before the lock is taken (a Sentinel deployment cuts the replication
    /// link here, so the grant never reaches the replica). The default does nothing.
    async fn arm(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Makes the deployment forget the lock held on `name`; returns once it has (the lock's
    /// key is gone from wherever clients will look next).
    async fn forget(&self, name: &LockName) -> std::result::Result<(), String>;

    /// What the checker must find once the act is done and a second client took the lock. The
    /// default, [`Expect::NEGATIVE_CONTROL`](crate::history::Expect::NEGATIVE_CONTROL): an
    /// overlap, and no stale write accepted. A deployment whose act also loses the fencing
    /// counter (Redlock nodes restarted empty) asks for the token regression too.
    fn expect(&self) -> crate::history::Expect {
        crate::history::Expect::NEGATIVE_CONTROL
    }
}

/// A client's session, under a case's control: lose the connection, get it back, or lose the
/// session.
#[async_trait]
pub trait SessionControl: Send + Sync {
    /// The connection is lost; the session expires if it is not resumed within `timeout`.
    async fn suspend(&self, timeout: Duration) -> std::result::Result<(), String>;
    /// The connection is back.
    async fn resume(&self) -> std::result::Result<(), String>;
    /// The server expires the session now.
    async fn expire(&self) -> std::result::Result<(), String>;
}

/// Server-side faults a harness can inject.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Whether this harness can inject `fault`. The default: [`Fault::KillHolder`] only.
    fn supports(&self, fault: Fault) -> bool {
        fault == Fault::KillHolder
    }

    /// Ends the current holder's hold on `name` from the server side, as a crashed server, a
    /// killed connection (`KILL`, `pg_terminate_backend`) or an expired session would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String>;

    /// Ends the current holder's hold on `name` only: the same client's other holds stay (the
    /// lock's key deleted, where [`kill_holder`](Self::kill_holder) may end a lease or session
    /// all of them share). By default, `kill_holder`, for harnesses whose kill ends one hold.
    async fn kill_one_hold(&self, name: &LockName) -> std::result::Result<(), String> {
        self.kill_holder(name).await
    }

    /// Ends, from the server side, the connections of clients **waiting** for `name` (as `KILL`,
    /// `pg_terminate_backend`, `CLIENT KILL` or a network reset would), leaving its holder alone
    /// where the backend allows. Waits (within the timing's bound) until a waiter shows on the
    /// server first; returns how many connections it ended. The case that calls it runs alone,
    /// so a harness that cannot single out `name`'s waiters may end every waiting connection.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let _ = name;
        Err("this harness cannot kill waiters".into())
    }

    /// A fresh client, and control over its session.
    async fn session_client(
        &self,
    ) -> std::result::Result<(Arc<dyn DistributedLock>, Box<dyn SessionControl>), String> {
        Err("this harness cannot control sessions".into())
    }

    /// For a deployment that lives in this process (the memory backend), where no child process
    /// can reach it: a fresh client for a fault case's worker **task**, and its link. The suite
    /// then simulates what it does to worker processes: a paused worker is not polled and its
    /// link is cut (its renewals fail, as a stopped process's do); a killed one is aborted with
    /// its link cut for good (its dropped guards cannot release, as a dead process's cannot).
    fn task_client(&self) -> std::result::Result<TaskClient, String> {
        Err("this harness runs no worker tasks".into())
    }

    /// Starts a server of the case's own (see [`OwnServer`]).
    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        Err("this harness cannot start a server of its own".into())
    }

    /// A deployment to reach through a fault proxy (see [`ProxyTarget`]). The default: a server
    /// of the case's own ([`own_server`](Self::own_server)).
    async fn proxy_target(&self) -> std::result::Result<ProxyTarget, String> {
        Ok(self.own_server().await?.into())
    }

    /// Starts a deployment of the case's own that can be made to forget a granted lock (see
    /// [`Amnesia`]).
    async fn amnesia(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        Err("this harness has no way to make its server forget a lock".into())
    }

    /// The same deployment and the same act as [`amnesia`](Self::amnesia), configured the way
    /// the backend's docs say guards against the hazard (Redis `noeviction`, Redlock nodes with
    /// `appendfsync always`): [`Amnesia::forget`] does the same thing, and the lock must survive
    /// it.
    async fn amnesia_mitigated(&self) -> std::result::Result<Box<dyn Amnesia>, String> {
        Err("this harness has no mitigated configuration of its hazard".into())
    }
}

/// Durations the cases use.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A lease short enough to wait out in a test; at least a second of margin on 2 cores.
    pub short_ttl: Duration,
    /// The generous upper bound for any awaited event. Reaching it fails the case.
    pub bound: Duration,
    /// How long a lock that a killed client process held (or was being handed) may stay taken:
    /// the lease TTL where leases run out ([`short_ttl`](Self::short_ttl), the default), the
    /// session timeout where the server waits a dead client's session out (ZooKeeper), and at
    /// most that where a closed connection ends it at once (SQL sessions).
    pub crash_bound: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        let short_ttl = Duration::from_secs(2);
        Self {
            short_ttl,
            bound: Duration::from_secs(30),
            crash_bound: short_ttl,
        }
    }
}
