//! The ZooKeeper conformance harness: a standalone server (plain or TLS), or a three-node
//! ensemble, started by dlock-test-servers, or the deployment `DLOCK_TEST_ZOOKEEPER_URL` (or
//! `…_TLS_URL`, `…_ENSEMBLE_URL`) names; fresh clients; fault
//! hooks that expire a holder's session and cut a client off through a fault proxy; and a
//! residue check that lists the nodes under each case's names.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::raw::SessionStatus;
use dlock_api::{DistributedLock, LockName, LockOptions, Result};
use dlock_conformance::{
    Deployment, Fault, Faults, Harness, OwnServer, ProxyTarget, SessionControl, Timing,
};
use dlock_test_servers::{FaultProxy, ProxyMode, ServerProcess, ZooKeeper, ZooKeeperEnsemble};
use dlock_zookeeper::{ZkConfig, ZkLock};
use zookeeper_client::Client;

pub struct ZkHarness {
    deployment: Deployment,
    /// A single server the harness started (faults that need one server apply).
    single: bool,
    clients: Mutex<Vec<Weak<ZkLock>>>,
}

const STANDALONE_URL_VAR: &str = "DLOCK_TEST_ZOOKEEPER_URL";
const TLS_URL_VAR: &str = "DLOCK_TEST_ZOOKEEPER_TLS_URL";
const ENSEMBLE_URL_VAR: &str = "DLOCK_TEST_ZOOKEEPER_ENSEMBLE_URL";

fn text(e: impl ToString) -> String {
    e.to_string()
}

impl ZkHarness {
    fn new(deployment: Deployment, single: bool) -> Self {
        Self {
            deployment,
            single,
            clients: Mutex::new(Vec::new()),
        }
    }

    /// A standalone server: `DLOCK_TEST_ZOOKEEPER_URL` if set, else a private one.
    pub fn standalone() -> Self {
        let deployment = Deployment::from_env_or_start("zookeeper", STANDALONE_URL_VAR, || {
            ZooKeeper::start().map(|server| (server.url(), server))
        });
        let single = deployment.started();
        Self::new(deployment, single)
    }

    /// A standalone server serving TLS (`zks://`): `DLOCK_TEST_ZOOKEEPER_TLS_URL` if set, else
    /// a private one with a private CA.
    pub fn tls() -> Self {
        let deployment = Deployment::from_env_or_start("zookeeper-tls", TLS_URL_VAR, || {
            ZooKeeper::start_tls().map(|server| (server.tls_url().expect("a TLS server"), server))
        });
        let single = deployment.started();
        Self::new(deployment, single)
    }

    /// Three nodes: `DLOCK_TEST_ZOOKEEPER_ENSEMBLE_URL` if set, else a private ensemble.
    pub fn ensemble() -> Self {
        let deployment = Deployment::from_env_or_start("zk-ensemble", ENSEMBLE_URL_VAR, || {
            ZooKeeperEnsemble::start()
                .map(|ensemble| (format!("zk://{}", ensemble.connect_string()), ensemble))
        });
        Self::new(deployment, false)
    }

    /// A harness for a server of a case's own at `url`.
    fn own(url: String) -> Arc<Self> {
        let var = if url.starts_with("zks:") {
            TLS_URL_VAR
        } else {
            STANDALONE_URL_VAR
        };
        Arc::new(Self::new(Deployment::at("zookeeper", var, url), true))
    }

    fn url(&self) -> &str {
        self.deployment.url()
    }

    fn config(&self) -> ZkConfig {
        ZkConfig::from_url(self.url()).expect("a valid URL")
    }

    /// The servers' connect string, reached directly.
    fn hosts(&self) -> String {
        self.config().hosts.join(",")
    }

    async fn new_client(&self, url: &str) -> Result<Arc<ZkLock>> {
        let client = Arc::new(ZkLock::connect_url(url).await?);
        let mut clients = self.clients.lock().unwrap();
        clients.retain(|c| c.strong_count() > 0);
        clients.push(Arc::downgrade(&client));
        Ok(client)
    }

    /// A fresh client as its own type (its session id readable), registered like
    /// [`Harness::client`]'s.
    pub async fn zk_client(&self) -> Result<Arc<ZkLock>> {
        self.new_client(self.url()).await
    }

    /// A plain client of the library, for reading the server (over TLS to a TLS server).
    async fn raw(&self) -> std::result::Result<Client, String> {
        let config = self.config();
        if config.tls {
            return raw_tls_client(&config).await;
        }
        raw_client(&self.hosts()).await
    }

    /// The harness's URL with its hosts replaced by `hosts` (credentials, prefix and options
    /// kept).
    fn url_via(&self, hosts: &str) -> String {
        let url = self.url();
        let start = url.find("://").map_or(0, |i| i + 3);
        let end = url[start..]
            .find(['/', '?'])
            .map_or(url.len(), |i| start + i);
        let user = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
        format!("{}{hosts}{}", &url[..user], &url[end..])
    }
}

#[cfg(feature = "tls")]
async fn raw_tls_client(config: &ZkConfig) -> std::result::Result<Client, String> {
    let ca = config
        .tls_files
        .ca_cert
        .as_ref()
        .ok_or("zks:// without a CA")?;
    let ca = std::fs::read_to_string(ca).map_err(text)?;
    // As the library does: a workspace build enables two rustls providers, and rustls then
    // cannot choose one by itself.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let tls = zookeeper_client::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(text)?;
    Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_tls(tls)
        .secure_connect(&config.hosts.join(","))
        .await
        .map_err(text)
}

#[cfg(not(feature = "tls"))]
async fn raw_tls_client(_: &ZkConfig) -> std::result::Result<Client, String> {
    Err("zks:// needs the feature `tls`".into())
}

pub async fn raw_client(hosts: &str) -> std::result::Result<Client, String> {
    Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .map_err(text)
}

/// The nodes under `name`'s node, as `(child, ephemeral owner)`, in queue order.
pub async fn queue_of(
    client: &Client,
    config: &ZkConfig,
    name: &LockName,
) -> std::result::Result<Vec<(String, i64)>, String> {
    let parent = config.name_path(name);
    let mut children = match client.list_children(&parent).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(text(e)),
    };
    children.sort_by_key(|c| c.rsplit('-').next().map(str::to_owned));
    let mut queue = Vec::new();
    for child in children {
        if let Some(stat) = client
            .check_stat(&format!("{parent}/{child}"))
            .await
            .map_err(text)?
        {
            queue.push((child, stat.ephemeral_owner));
        }
    }
    Ok(queue)
}

/// The queue under `name` on the servers at `hosts`, read by a client of its own.
pub async fn queue_at(hosts: &str, name: &LockName) -> Vec<(String, i64)> {
    let client = raw_client(hosts).await.unwrap();
    let config = ZkConfig::from_url(&format!("zk://{hosts}")).unwrap();
    queue_of(&client, &config, name).await.unwrap()
}

/// Waits (within `bound`) until the queue under `name` is as `done` wants it, and returns it.
pub async fn until_queue(
    bound: Duration,
    what: &str,
    hosts: &str,
    name: &LockName,
    done: impl Fn(&[(String, i64)]) -> bool + Send + Sync,
) -> Vec<(String, i64)> {
    dlock_conformance::wait_for::within(bound, what, async {
        loop {
            let queue = queue_at(hosts, name).await;
            if done(&queue) {
                break queue;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Waits (within `bound`) until nothing is queued under `name`.
pub async fn until_empty(bound: Duration, hosts: &str, name: &LockName) {
    until_queue(
        bound,
        "the name's queue to empty",
        hosts,
        name,
        <[_]>::is_empty,
    )
    .await;
}

/// `client` takes one of `permits` places of `name` (a lock's own acquire for one), waiting up to
/// `bound` on a task of its own, without looking first.
pub fn spawned_place(
    bound: Duration,
    client: &ZkLock,
    name: &LockName,
    permits: u32,
) -> tokio::task::JoinHandle<dlock_api::Result<dlock_api::LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    let wait = LockOptions::new().with_wait_timeout(bound);
    tokio::spawn(async move {
        match permits {
            1 => client.acquire(&name, &wait).await,
            n => client.acquire_permit(&name, n, &wait).await,
        }
    })
}

/// Every one of `permits` places of `name`, free, taken at once by `client` (a lock's own
/// `try_acquire` for one).
pub async fn take_all(client: &ZkLock, name: &LockName, permits: u32) -> Vec<dlock_api::LockGuard> {
    let mut held = Vec::new();
    for _ in 0..permits {
        let guard = match permits {
            1 => client.try_acquire(name, &LockOptions::new()).await,
            n => {
                client
                    .try_acquire_permit(name, n, &LockOptions::new())
                    .await
            }
        };
        held.push(guard.unwrap().expect("a free place is granted"));
    }
    held
}

#[async_trait]
impl Harness for ZkHarness {
    fn label(&self) -> &str {
        self.deployment.label()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(self.new_client(self.url()).await?)
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        self.deployment.child_env()
    }

    /// A killed client's session lives on at the server until its timeout, plus the server's
    /// expiry tick: that, not a lease TTL, is how long its lock stays taken.
    fn timing(&self) -> Timing {
        Timing {
            crash_bound: self.config().session_timeout + Duration::from_secs(2),
            ..Timing::default()
        }
    }

    /// Every node under each name's node: a holder's or a waiter's.
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let client = self.raw().await?;
        let config = self.config();
        let mut left = Vec::new();
        for name in names {
            for (child, owner) in queue_of(&client, &config, name).await? {
                left.push(format!(
                    "node {}/{child} (session {owner:#x})",
                    config.name_path(name)
                ));
            }
        }
        Ok(left)
    }
}

/// A TLS server seen from its TLS port: its URL and address are the ones clients and fault
/// proxies use (the plain port stays open for reading the server).
struct TlsPort(ZooKeeper);

impl ServerProcess for TlsPort {
    fn addr(&self) -> SocketAddr {
        self.0.tls_addr().expect("a TLS server")
    }
    fn url(&self) -> String {
        self.0.tls_url().expect("a TLS server")
    }
    fn kill(&self) {
        self.0.kill();
    }
    fn restart(&self) -> dlock_test_servers::Result<()> {
        self.0.restart()
    }
    fn pause(&self) {
        self.0.pause();
    }
    fn resume(&self) {
        self.0.resume();
    }
}

/// A client cut off and brought back through fault proxies of its own, one per server.
struct ProxiedSession {
    client: Arc<ZkLock>,
    proxies: Vec<FaultProxy>,
    hosts: String,
    expiry: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl ProxiedSession {
    async fn until(
        &self,
        what: &str,
        check: impl Fn(Option<SessionStatus>) -> bool,
    ) -> std::result::Result<(), String> {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        while !check(self.client.session_status()) {
            if tokio::time::Instant::now() >= give_up {
                return Err(format!(
                    "the session was not {what} after 30 s: {:?}",
                    self.client.session_status()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

#[async_trait]
impl SessionControl for ProxiedSession {
    /// Cuts the link (a blackhole, and the open connection reset, so the client notices now
    /// rather than after its connection timeout), waits until the client reports its session
    /// suspended, and has the server expire the session if it is not resumed within `timeout`.
    async fn suspend(&self, timeout: Duration) -> std::result::Result<(), String> {
        for proxy in &self.proxies {
            proxy.set_mode(ProxyMode::Blackhole);
            proxy.reset();
        }
        self.until("suspended", |s| {
            matches!(s, Some(SessionStatus::Suspended { .. }))
        })
        .await?;
        let (client, hosts) = (self.client.clone(), self.hosts.clone());
        let expiry = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Err(e) = client.expire_session(Some(&hosts)).await {
                eprintln!("could not expire the suspended session: {e}");
            }
        });
        if let Some(old) = self.expiry.lock().unwrap().replace(expiry) {
            old.abort();
        }
        Ok(())
    }

    async fn resume(&self) -> std::result::Result<(), String> {
        if let Some(expiry) = self.expiry.lock().unwrap().take() {
            expiry.abort();
        }
        for proxy in &self.proxies {
            proxy.heal();
        }
        self.until("active again", |s| matches!(s, Some(SessionStatus::Active)))
            .await
    }

    async fn expire(&self) -> std::result::Result<(), String> {
        self.client
            .expire_session(Some(&self.hosts))
            .await
            .map_err(text)
    }
}

#[async_trait]
impl Faults for ZkHarness {
    fn supports(&self, fault: Fault) -> bool {
        match fault {
            Fault::KillHolder | Fault::KillWaiters | Fault::SuspendSession => true,
            Fault::OwnServer => self.single,
            // A standalone server: through its own server's proxy; an ensemble: a proxy per
            // member.
            Fault::ProxyLink => true,
            _ => false,
        }
    }

    /// A standalone server: one of the case's own. An ensemble: the shared one, each member
    /// behind a proxy of its own, so a link fault cuts a client off from every member at once
    /// (a cut to one member only makes the client move to another, which the ensemble's own
    /// tests cover).
    async fn proxy_target(&self) -> std::result::Result<ProxyTarget, String> {
        if self.single {
            return Ok(self.own_server().await?.into());
        }
        let members = self
            .config()
            .hosts
            .iter()
            .map(|h| h.parse::<std::net::SocketAddr>().map_err(text))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        // The deployment's own variable: child processes of this test binary read it.
        let var = self.deployment.url_var();
        let direct: Arc<dyn Harness> = Arc::new(Self::new(
            Deployment::at("zk-ensemble", var, self.url().to_owned()),
            false,
        ));
        let url = self.url().to_owned();
        Ok(ProxyTarget::owned(
            members,
            direct,
            move |proxies: &[std::net::SocketAddr]| -> Arc<dyn Harness> {
                let hosts: Vec<String> = proxies.iter().map(ToString::to_string).collect();
                let via = Self::new(Deployment::at("zk-ensemble", var, url.clone()), false);
                let url = via.url_via(&hosts.join(","));
                Arc::new(Self::new(
                    Deployment::at("zk-ensemble via fault proxies", var, url),
                    false,
                ))
            },
            (),
        ))
    }

    /// Expires the holder's session on the server (the owner of the first node in the queue),
    /// as the server does when the holder stays silent past its session timeout. The holder must
    /// be a client of this harness: the session's password is needed to end it.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        let client = self.raw().await?;
        let queue = queue_of(&client, &self.config(), name).await?;
        let (_, owner) = queue
            .first()
            .ok_or_else(|| format!("{name} has no holder"))?;
        let holder = self
            .clients
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .find(|c| c.session_id() == Some(*owner))
            .ok_or_else(|| format!("the holder of {name} is not a client of this harness"))?;
        holder
            .expire_session(Some(&self.hosts()))
            .await
            .map_err(text)
    }

    /// Expires, on the server, the sessions of the clients waiting for `name` (the owners of
    /// every node after the first, the holder's own session spared), once one waits: the closest
    /// ZooKeeper has to killing a waiter's connection. The waiters must be clients of this
    /// harness.
    async fn kill_waiters(&self, name: &LockName) -> std::result::Result<usize, String> {
        let client = self.raw().await?;
        let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
        let waiters = loop {
            let queue = queue_of(&client, &self.config(), name).await?;
            let holder = queue.first().map(|(_, owner)| *owner);
            let mut waiters: Vec<i64> = queue
                .iter()
                .skip(1)
                .map(|(_, owner)| *owner)
                .filter(|owner| Some(*owner) != holder)
                .collect();
            waiters.dedup();
            if !waiters.is_empty() {
                break waiters;
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(format!("nobody waits for {name} after 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let clients: Vec<Arc<ZkLock>> = self
            .clients
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.session_id().is_some_and(|id| waiters.contains(&id)))
            .collect();
        if clients.is_empty() {
            return Err(format!(
                "the waiters of {name} are not clients of this harness"
            ));
        }
        for waiter in &clients {
            waiter
                .expire_session(Some(&self.hosts()))
                .await
                .map_err(text)?;
        }
        Ok(clients.len())
    }

    async fn session_client(
        &self,
    ) -> std::result::Result<(Arc<dyn DistributedLock>, Box<dyn SessionControl>), String> {
        let hosts = self.hosts();
        let mut proxies = Vec::new();
        for host in hosts.split(',') {
            let server: SocketAddr = host.parse().map_err(text)?;
            proxies.push(FaultProxy::start(server).map_err(text)?);
        }
        let through: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        let client = self
            .new_client(&self.url_via(&through.join(",")))
            .await
            .map_err(text)?;
        let control = ProxiedSession {
            client: client.clone(),
            proxies,
            hosts,
            expiry: Mutex::new(None),
        };
        Ok((client, Box::new(control)))
    }

    /// A private standalone server (its data survives restarts), serving TLS if this
    /// harness's does.
    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        let harness = |url| ZkHarness::own(url) as Arc<dyn Harness>;
        if self.config().tls {
            let start = || ZooKeeper::start_tls().map(TlsPort);
            return OwnServer::start(start, harness).await;
        }
        OwnServer::start(ZooKeeper::start, harness).await
    }
}

/// Whether the server has a watch by session `session` on `path` (`wchp`: each watched path,
/// then its sessions indented).
pub fn watched_by(zk: &ZooKeeper, path: &str, session: i64) -> bool {
    let answer = zk.four_letter("wchp").unwrap_or_default();
    let session = format!("{session:#x}");
    let mut under = None;
    for line in answer.lines() {
        if line.starts_with('/') {
            under = Some(line.trim());
        } else if under == Some(path) && line.trim() == session {
            return true;
        }
    }
    false
}
