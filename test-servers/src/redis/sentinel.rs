//! [`RedisSentinel`]: a primary, a replica and three Sentinels, with failover on demand.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    KIND, RedisServer, SENTINEL_KIND, TOPOLOGY_TIMEOUT, free_port_for, start_all, wait_for,
};
use crate::error::{Result, ServerError};
use crate::resp::{Resp, redis_command};

/// The master name the Sentinels of [`RedisSentinel`] monitor.
pub const SENTINEL_MASTER_NAME: &str = "mymaster";

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
    /// and waits until all Sentinels report a new primary that acts as one and the old primary has become its
    /// replica. Returns the new primary's address.
    ///
    /// Until the old primary is turned into a replica it still takes writes, which the resync from the new
    /// primary then discards: a test that wrote there in that window would see its key vanish. Returning only
    /// once it follows leaves no such window after this call.
    ///
    /// # Errors
    /// [`ServerError::Io`] when the failover does not complete within 60 s.
    pub fn failover(&self) -> Result<SocketAddr> {
        let old = self
            .primary_addr()
            .map_err(ServerError::io(SENTINEL_KIND, "cannot ask for the primary"))?;
        let deadline = crate::process::after(Instant::now(), TOPOLOGY_TIMEOUT);
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
        let new =
            self.wait_for_new_primary(old, deadline.saturating_duration_since(Instant::now()))?;
        wait_for(
            SENTINEL_KIND,
            "the old primary to follow the new one",
            deadline.saturating_duration_since(Instant::now()),
            || {
                let role = redis_command(old, &["ROLE"]).ok()?;
                (role.items().first()?.as_text()? == "slave").then_some(())
            },
        )?;
        Ok(new)
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
                        items.get(i.saturating_add(1))?.as_text()
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
                            .and_then(|i| items.get(i.saturating_add(1))?.as_text())
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

/// The whole deployment as one server, for the fault cases that crash, restart and freeze "the
/// server": every process (primary, replica, Sentinels) at once, so that no failover stands in
/// for the fault. Its URL is the `redis+sentinel://` one.
impl crate::ServerProcess for RedisSentinel {
    fn addr(&self) -> SocketAddr {
        self.sentinels[0].addr()
    }

    fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinel_addrs()
            .iter()
            .map(ToString::to_string)
            .collect();
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER_NAME}",
            sentinels.join(",")
        )
    }

    fn kill(&self) {
        for server in self.processes() {
            server.kill();
        }
    }

    /// Restarts every process, data nodes first (persistence is off: they come back empty), and
    /// waits until every Sentinel names one primary that acts as one.
    fn restart(&self) -> Result<()> {
        for server in self.processes() {
            server.restart()?;
        }
        wait_for(
            SENTINEL_KIND,
            "one primary after the restart",
            TOPOLOGY_TIMEOUT,
            || {
                let mut reported = None;
                for sentinel in &self.sentinels {
                    let reply = sentinel
                        .command(&["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME])
                        .ok()?;
                    let addr = parse_addr(&reply)?;
                    if reported.is_some_and(|r| r != addr) {
                        return None;
                    }
                    reported = Some(addr);
                }
                let role = redis_command(reported?, &["ROLE"]).ok()?;
                (role.items().first()?.as_text()? == "master").then_some(())
            },
        )
    }

    fn pause(&self) {
        for server in self.processes() {
            server.pause();
        }
    }

    fn resume(&self) {
        for server in self.processes() {
            server.resume();
        }
    }
}

impl RedisSentinel {
    /// Every process: the data nodes, then the Sentinels.
    fn processes(&self) -> impl Iterator<Item = &RedisServer> {
        [&self.primary, &self.replica]
            .into_iter()
            .chain(&self.sentinels)
    }
}

fn parse_addr(reply: &Resp) -> Option<SocketAddr> {
    let items = reply.items();
    let host: Ipv4Addr = items.first()?.as_text()?.parse().ok()?;
    let port: u16 = items.get(1)?.as_text()?.parse().ok()?;
    Some(SocketAddr::from((host, port)))
}
