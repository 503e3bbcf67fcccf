//! Redis: a single node, independent nodes (Redlock), Sentinel, Cluster.

use std::fmt;
use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use crate::control::process_control;
use crate::error::{Result, ServerError};
use crate::ports::{free_port, free_port_pair};
use crate::process::{Launch, Proc, find_program, temp_dir};
use crate::resp::{Resp, redis_command};

const KIND: &str = "redis";
const SENTINEL_KIND: &str = "redis-sentinel";
const CLUSTER_KIND: &str = "redis-cluster";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on topology changes: sentinel discovery, failover, cluster convergence.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);

/// The master name the Sentinels of [`RedisSentinel`] monitor.
pub const SENTINEL_MASTER_NAME: &str = "mymaster";

/// The ids of the clients in a `CLIENT LIST` reply that hold a channel subscription: a dlock
/// client's waiters, for a test that cuts them off with `CLIENT KILL ID`.
pub fn subscribed_client_ids(client_list: &str) -> Vec<&str> {
    client_list
        .lines()
        .filter_map(|line| {
            let field = |key: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            };
            field("sub")
                .is_some_and(|n| n != "0")
                .then(|| field("id"))
                .flatten()
        })
        .collect()
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn answers_ping(addr: SocketAddr) -> bool {
    matches!(redis_command(addr, &["PING"]), Ok(Resp::Simple(s)) if s == "PONG")
}

/// Polls `check` every 100 ms until it returns `Some`, or fails after `timeout` with `what`.
fn wait_for<T>(
    server: &'static str,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(ServerError::io(
                server,
                format!("gave up after {timeout:?} waiting for {what}"),
            )(io::ErrorKind::TimedOut.into()));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A CA (`ca.pem`) and a server certificate for `127.0.0.1` (`server.pem`, `server.key`) in `dir`.
pub(crate) fn make_certificates(dir: &std::path::Path) -> Result<()> {
    let openssl = find_program(KIND, "openssl")?;
    let ext = dir.join("server.ext");
    fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(ServerError::io(
        KIND,
        "cannot write the certificate extensions",
    ))?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=dlock test CA",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    ];
    for step in steps {
        Launch::new(openssl.clone())
            .args(step)
            .cwd(dir)
            .run(KIND, Duration::from_secs(30))?;
    }
    Ok(())
}

/// One `redis-server` process (a plain node, a replica, a cluster node or a Sentinel).
///
/// Started with a config file in its own directory (so `CONFIG REWRITE`, used by Sentinel failovers, works),
/// persistence off (`save ""`, `appendonly no`): a [`restart`](Self::restart) gives an **empty** server (a
/// cluster node keeps its identity from `nodes.conf`, a Sentinel its rewritten config). Stopped with SIGTERM.
pub struct RedisServer {
    proc: Proc,
    port: u16,
    tls: Option<TlsFiles>,
}

/// The TLS side of a node from [`RedisServer::start_tls`]: its port and its private CA.
struct TlsFiles {
    port: u16,
    dir: tempfile::TempDir,
}

process_control!(RedisServer);

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("addr", &self.addr())
            .field("pid", &self.pid())
            .finish()
    }
}

impl RedisServer {
    /// Starts a single Redis node on a free loopback port and waits until it answers `PING`.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `redis-server`; [`ServerError::StartFailed`] with its log.
    pub fn start() -> Result<Self> {
        let server = Self::prepare(KIND, free_port_for(KIND)?, "")?;
        server.proc.start()?;
        Ok(server)
    }

    /// Starts a single node that serves **TLS** on a second port (certificates from a private CA made
    /// with `openssl`, valid for `127.0.0.1`), besides its plain port, which readiness checks and
    /// [`command`](Self::command) keep using. Clients connect to [`tls_url`](Self::tls_url) and
    /// trust [`ca_cert`](Self::ca_cert).
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `redis-server` or `openssl`; [`ServerError::CommandFailed`]
    /// if a certificate cannot be made; [`ServerError::StartFailed`] with the server's log.
    pub fn start_tls() -> Result<Self> {
        let dir = temp_dir(KIND)?;
        make_certificates(dir.path())?;
        let tls_port = free_port_for(KIND)?;
        let file = |name: &str| dir.path().join(name).display().to_string();
        let extra = format!(
            "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n",
            file("server.pem"),
            file("server.key"),
            file("ca.pem"),
        );
        let mut server = Self::prepare(KIND, free_port_for(KIND)?, &extra)?;
        server.tls = Some(TlsFiles {
            port: tls_port,
            dir,
        });
        server.proc.start()?;
        Ok(server)
    }

    /// `rediss://127.0.0.1:TLS_PORT` for a node from [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|tls| format!("rediss://{}", loopback(tls.port)))
    }

    /// The PEM file of the private CA that signed the TLS certificate, for clients to trust.
    pub fn ca_cert(&self) -> Option<std::path::PathBuf> {
        self.tls.as_ref().map(|tls| tls.dir.path().join("ca.pem"))
    }

    /// Writes the config and prepares the process; does not start it.
    fn prepare(kind: &'static str, port: u16, extra_config: &str) -> Result<Self> {
        let program = find_program(kind, "redis-server")?;
        let dir = temp_dir(kind)?;
        let sentinel = kind == SENTINEL_KIND;
        let config = dir.path().join(if sentinel {
            "sentinel.conf"
        } else {
            "redis.conf"
        });
        let text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\nlogfile \"\"\ndir {}\n{}{extra_config}",
            dir.path().display(),
            if sentinel {
                ""
            } else {
                "save \"\"\nappendonly no\nrepl-diskless-sync-delay 0\n"
            },
        );
        fs::write(&config, text).map_err(ServerError::io(
            kind,
            format!("cannot write {}", config.display()),
        ))?;
        let mut launch = Launch::new(program).arg(&config).cwd(dir.path());
        if sentinel {
            launch = launch.arg("--sentinel");
        }
        let addr = loopback(port);
        let proc = Proc::new(
            kind,
            addr.to_string(),
            dir,
            launch,
            Box::new(move || answers_ping(addr)),
            READY_TIMEOUT,
            libc::SIGTERM,
        );
        Ok(RedisServer {
            proc,
            port,
            tls: None,
        })
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends one command on a fresh connection and returns the reply (an error reply is `Ok(Resp::Error)`).
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer within 5 s.
    pub fn command(&self, args: &[&str]) -> io::Result<Resp> {
        redis_command(self.addr(), args)
    }

    /// One field of `INFO <section>`, e.g. `info_field("replication", "role")`.
    ///
    /// # Errors
    /// When the server cannot be reached, or the field is absent.
    pub fn info_field(&self, section: &str, field: &str) -> io::Result<String> {
        let info = self
            .command(&["INFO", section])?
            .as_text()
            .unwrap_or_default();
        info.lines()
            .find_map(|line| {
                line.strip_prefix(field)?
                    .strip_prefix(':')
                    .map(str::to_owned)
            })
            .ok_or_else(|| io::Error::other(format!("no field {field} in INFO {section}")))
    }
}

fn free_port_for(kind: &'static str) -> Result<u16> {
    free_port().map_err(ServerError::io(kind, "cannot find a free port"))
}

/// Starts prepared servers together and waits for all of them.
fn start_all<'a>(servers: impl IntoIterator<Item = &'a RedisServer>) -> Result<()> {
    let servers: Vec<&RedisServer> = servers.into_iter().collect();
    let begun: Vec<Instant> = servers
        .iter()
        .map(|s| s.proc.spawn())
        .collect::<Result<_>>()?;
    for (server, begun) in servers.iter().zip(begun) {
        server.proc.wait_ready(begun)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------

/// `n` independent Redis nodes, as Redlock needs. Dropping it stops them all.
#[derive(Debug)]
pub struct RedisNodes {
    nodes: Vec<RedisServer>,
}

impl RedisNodes {
    /// Starts `n` independent nodes in parallel.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start(n: usize) -> Result<Self> {
        Self::start_configured(n, "")
    }

    /// Starts `n` independent nodes that write every change to their append-only file before
    /// answering (`appendonly yes`, `appendfsync always`): a [`restart`](RedisServer::restart)
    /// keeps their keys.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_durable(n: usize) -> Result<Self> {
        Self::start_configured(n, "appendonly yes\nappendfsync always\n")
    }

    fn start_configured(n: usize, extra_config: &str) -> Result<Self> {
        let begun = Instant::now();
        let nodes = (0..n)
            .map(|_| RedisServer::prepare(KIND, free_port_for(KIND)?, extra_config))
            .collect::<Result<Vec<_>>>()?;
        start_all(&nodes)?;
        eprintln!(
            "dlock-test-servers: {n} redis nodes ready in {:.2?}",
            begun.elapsed()
        );
        Ok(RedisNodes { nodes })
    }

    /// The nodes' URLs, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Node `i` (panics when out of range).
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

// ---------------------------------------------------------------------------------------------------------------

/// A Redis primary, one replica, and three Sentinels monitoring them as [`SENTINEL_MASTER_NAME`] (quorum 2,
/// `down-after-milliseconds 1000`, `failover-timeout 2000`).
///
/// [`start`](Self::start) returns once the replica is in sync and every Sentinel knows the replica and the
/// other two Sentinels, so a failover can happen at once. After a failover, [`primary`](Self::primary) is still
/// the process *started* as primary; ask [`current_primary`](Self::current_primary) which one it is now.
#[derive(Debug)]
pub struct RedisSentinel {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the primary, the replica and three Sentinels, and waits until the setup is complete.
    ///
    /// # Errors
    /// As [`RedisServer::start`]; [`ServerError::Io`] when the topology does not settle within 60 s.
    pub fn start() -> Result<Self> {
        let begun = Instant::now();
        let primary_port = free_port_for(KIND)?;
        let primary = RedisServer::prepare(KIND, primary_port, "")?;
        let replica = RedisServer::prepare(
            KIND,
            free_port_for(KIND)?,
            &format!("replicaof 127.0.0.1 {primary_port}\n"),
        )?;
        let sentinel_config = format!(
            "sentinel monitor {SENTINEL_MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER_NAME} 1000\n\
             sentinel failover-timeout {SENTINEL_MASTER_NAME} 2000\n\
             sentinel parallel-syncs {SENTINEL_MASTER_NAME} 1\n"
        );
        let sentinels = (0..3)
            .map(|_| {
                RedisServer::prepare(
                    SENTINEL_KIND,
                    free_port_for(SENTINEL_KIND)?,
                    &sentinel_config,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        // Sentinels learn about replicas from the primary's INFO (every 10 s): start them once the replica is
        // in sync, so their first look finds it.
        start_all([&primary, &replica])?;
        wait_for(KIND, "the replica to sync", TOPOLOGY_TIMEOUT, || {
            (replica
                .info_field("replication", "master_link_status")
                .ok()?
                == "up")
                .then_some(())
        })?;
        start_all(&sentinels)?;
        let setup = RedisSentinel {
            primary,
            replica,
            sentinels,
        };
        setup.wait_settled()?;
        eprintln!(
            "dlock-test-servers: redis sentinel setup ready in {:.2?}",
            begun.elapsed()
        );
        Ok(setup)
    }

    /// The Sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// The Sentinels' URLs, `redis://127.0.0.1:PORT` each.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The master name the Sentinels monitor: [`SENTINEL_MASTER_NAME`].
    pub fn master_name(&self) -> &'static str {
        SENTINEL_MASTER_NAME
    }

    /// The process started as primary.
    pub fn primary(&self) -> &RedisServer {
        &self.primary
    }

    /// The process started as replica.
    pub fn replica(&self) -> &RedisServer {
        &self.replica
    }

    /// Sentinel `i` of 3.
    pub fn sentinel(&self, i: usize) -> &RedisServer {
        &self.sentinels[i]
    }

    /// The primary's address as the first Sentinel that answers reports it.
    ///
    /// # Errors
    /// When no Sentinel answers with an address.
    pub fn primary_addr(&self) -> io::Result<SocketAddr> {
        let mut last = io::Error::other("no sentinel answered");
        for sentinel in &self.sentinels {
            match sentinel.command(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME]) {
                Ok(reply) => match parse_addr(&reply) {
                    Some(addr) => return Ok(addr),
                    None => last = io::Error::other(format!("unexpected reply {reply}")),
                },
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The handle (primary or replica) that the Sentinels currently report as primary.
    pub fn current_primary(&self) -> Option<&RedisServer> {
        let addr = self.primary_addr().ok()?;
        [&self.primary, &self.replica]
            .into_iter()
            .find(|s| s.addr() == addr)
    }

    /// Asks a Sentinel to fail over now (`SENTINEL FAILOVER`), retrying while it refuses (no good replica yet),
    /// and waits until all Sentinels report a new primary that acts as one. Returns the new primary's address.
    ///
    /// # Errors
    /// [`ServerError::Io`] when the failover does not complete within 60 s.
    pub fn failover(&self) -> Result<SocketAddr> {
        let old = self
            .primary_addr()
            .map_err(ServerError::io(SENTINEL_KIND, "cannot ask for the primary"))?;
        let deadline = Instant::now() + TOPOLOGY_TIMEOUT;
        loop {
            match self.sentinels[0].command(&["SENTINEL", "FAILOVER", SENTINEL_MASTER_NAME]) {
                Ok(Resp::Simple(_)) => break,
                // `-INPROG` means one is already running: fine.
                Ok(Resp::Error(e)) if e.starts_with("INPROG") => break,
                reply if Instant::now() >= deadline => {
                    return Err(ServerError::io(
                        SENTINEL_KIND,
                        format!("SENTINEL FAILOVER refused: {reply:?}"),
                    )(io::ErrorKind::TimedOut.into()));
                }
                _ => thread::sleep(Duration::from_millis(200)),
            }
        }
        self.wait_for_new_primary(old, deadline.saturating_duration_since(Instant::now()))
    }

    /// Kills (SIGKILL) the server the Sentinels report as primary, and waits until they have promoted another
    /// (about 2–4 s: `down-after-milliseconds` is 1 s). Returns the new primary's address.
    ///
    /// # Errors
    /// [`ServerError::Io`] when the Sentinels cannot be asked, or no new primary appears within 60 s.
    pub fn kill_primary(&self) -> Result<SocketAddr> {
        let old = self
            .primary_addr()
            .map_err(ServerError::io(SENTINEL_KIND, "cannot ask for the primary"))?;
        if let Some(server) = [&self.primary, &self.replica]
            .into_iter()
            .find(|s| s.addr() == old)
        {
            server.kill();
        }
        self.wait_for_new_primary(old, TOPOLOGY_TIMEOUT)
    }

    /// Waits until every Sentinel reports a primary other than `old` and that server says `role:master`
    /// (use after killing the primary). Returns the new primary's address.
    ///
    /// # Errors
    /// [`ServerError::Io`] when that does not happen within `timeout`.
    pub fn wait_for_new_primary(&self, old: SocketAddr, timeout: Duration) -> Result<SocketAddr> {
        wait_for(SENTINEL_KIND, "a new primary", timeout, || {
            let mut reported = None;
            for sentinel in &self.sentinels {
                if !sentinel.is_running() || sentinel.is_paused() {
                    continue;
                }
                let reply = sentinel
                    .command(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME])
                    .ok()?;
                let addr = parse_addr(&reply)?;
                if addr == old || reported.is_some_and(|r| r != addr) {
                    return None;
                }
                reported = Some(addr);
            }
            let addr = reported?;
            let role = redis_command(addr, &["ROLE"]).ok()?;
            (role.items().first()?.as_text()? == "master").then_some(addr)
        })
    }

    fn wait_settled(&self) -> Result<()> {
        let replica_port = self.replica.port.to_string();
        wait_for(
            SENTINEL_KIND,
            "the replica to sync and the sentinels to find each other",
            TOPOLOGY_TIMEOUT,
            || {
                let linked = self
                    .replica
                    .info_field("replication", "master_link_status")
                    .ok()?;
                if linked != "up" {
                    return None;
                }
                for sentinel in &self.sentinels {
                    let master = sentinel
                        .command(&["SENTINEL", "MASTER", SENTINEL_MASTER_NAME])
                        .ok()?;
                    let field = |name: &str| {
                        let items = master.items();
                        let i = items
                            .iter()
                            .position(|x| x.as_text().as_deref() == Some(name))?;
                        items.get(i + 1)?.as_text()
                    };
                    if field("num-slaves")? != "1" || field("num-other-sentinels")? != "2" {
                        return None;
                    }
                    let replicas = sentinel
                        .command(&["SENTINEL", "REPLICAS", SENTINEL_MASTER_NAME])
                        .ok()?;
                    let known = replicas.items().iter().any(|r| {
                        let items = r.items();
                        items
                            .iter()
                            .position(|x| x.as_text().as_deref() == Some("port"))
                            .and_then(|i| items.get(i + 1)?.as_text())
                            .as_deref()
                            == Some(replica_port.as_str())
                    });
                    if !known {
                        return None;
                    }
                }
                Some(())
            },
        )
    }
}

fn parse_addr(reply: &Resp) -> Option<SocketAddr> {
    let items = reply.items();
    let host: Ipv4Addr = items.first()?.as_text()?.parse().ok()?;
    let port: u16 = items.get(1)?.as_text()?.parse().ok()?;
    Some(SocketAddr::from((host, port)))
}

// ---------------------------------------------------------------------------------------------------------------

/// A Redis Cluster: 3 primaries owning all 16384 slots, optionally with replicas (`cluster-node-timeout 2000`).
///
/// Node ports are drawn from 20000..30000 so each node's cluster bus port (`port + 10000`) is free too.
/// [`start`](Self::start) returns once every node reports `cluster_state:ok`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
}

impl RedisCluster {
    /// Starts a cluster of three primaries without replicas.
    ///
    /// # Errors
    /// As [`RedisServer::start`]; [`ServerError::NotInstalled`] without `redis-cli`; [`ServerError::CommandFailed`]
    /// when `redis-cli --cluster create` fails; [`ServerError::Io`] when the cluster does not become ok in 60 s.
    pub fn start() -> Result<Self> {
        Self::start_with_replicas(0)
    }

    /// Starts a cluster of three primaries with `replicas` replicas each (nodes `0..3` are the primaries at
    /// creation, the rest their replicas).
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub fn start_with_replicas(replicas: usize) -> Result<Self> {
        let begun = Instant::now();
        let cli = find_program(CLUSTER_KIND, "redis-cli")?;
        let primaries = 3;
        let config =
            "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 2000\n";
        let nodes = (0..primaries * (1 + replicas))
            .map(|_| {
                let port = free_port_pair(10_000)
                    .map_err(ServerError::io(CLUSTER_KIND, "cannot find free ports"))?;
                RedisServer::prepare(CLUSTER_KIND, port, config)
            })
            .collect::<Result<Vec<_>>>()?;
        start_all(&nodes)?;
        Launch::new(cli)
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| n.addr().to_string()))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .run(CLUSTER_KIND, TOPOLOGY_TIMEOUT)?;
        let cluster = RedisCluster { nodes, primaries };
        cluster.wait_ok()?;
        eprintln!(
            "dlock-test-servers: redis cluster of {} nodes ready in {:.2?}",
            cluster.nodes.len(),
            begun.elapsed()
        );
        Ok(cluster)
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok` and knows all nodes.
    ///
    /// # Errors
    /// [`ServerError::Io`] when that does not happen within 60 s.
    pub fn wait_ok(&self) -> Result<()> {
        let total = self.nodes.len().to_string();
        wait_for(
            CLUSTER_KIND,
            "cluster_state:ok on every node",
            TOPOLOGY_TIMEOUT,
            || {
                self.nodes
                    .iter()
                    .filter(|n| n.is_running() && !n.is_paused())
                    .all(|n| {
                        let info = n
                            .command(&["CLUSTER", "INFO"])
                            .ok()
                            .and_then(|r| r.as_text())
                            .unwrap_or_default();
                        info.contains("cluster_state:ok")
                            && info.contains(&format!("cluster_known_nodes:{total}"))
                    })
                    .then_some(())
            },
        )
    }

    /// All nodes' URLs (primaries first). Any of them is a valid seed for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// All nodes' addresses (primaries first).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// Node `i`; nodes `0..primaries()` were created as primaries.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The number of primaries at creation (3).
    pub fn primaries(&self) -> usize {
        self.primaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_subscribed_clients() {
        let list = "id=3 addr=127.0.0.1:1 sub=0 psub=0 cmd=get\n\
                    id=7 addr=127.0.0.1:2 sub=1 psub=0 cmd=subscribe\n\
                    id=9 addr=127.0.0.1:3 psub=0 cmd=client|list\n";
        assert_eq!(subscribed_client_ids(list), ["7"]);
    }
}
