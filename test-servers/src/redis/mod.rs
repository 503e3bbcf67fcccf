//! Redis: a single node ([`RedisServer`], here), independent nodes for Redlock ([`nodes`]), a
//! Sentinel-managed primary ([`sentinel`]) and a Cluster ([`cluster`]), all made of
//! [`RedisServer`] processes.

mod cluster;
mod nodes;
mod sentinel;

pub use cluster::RedisCluster;
pub use nodes::RedisNodes;
pub use sentinel::{RedisSentinel, SENTINEL_MASTER_NAME};

use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use crate::control::process_control;
use crate::error::{Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, after, find_program, temp_dir};
use crate::resp::{Resp, redis_command};
use crate::tls::make_certificates;

const KIND: &str = "redis";
const SENTINEL_KIND: &str = "redis-sentinel";
const CLUSTER_KIND: &str = "redis-cluster";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on topology changes: sentinel discovery, failover, cluster convergence.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);

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
    let deadline = after(Instant::now(), timeout);
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
        make_certificates(KIND, dir.path())?;
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

    /// Every key on the server that has no expiry (`PTTL` -1): what a name used once would leave
    /// behind for ever.
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer within 5 s.
    pub fn keys_without_expiry(&self) -> io::Result<Vec<String>> {
        let keys = self.command(&["KEYS", "*"])?;
        let mut forever = Vec::new();
        for key in keys.items().iter().filter_map(Resp::as_text) {
            if self.command(&["PTTL", &key])?.as_text().as_deref() == Some("-1") {
                forever.push(key);
            }
        }
        Ok(forever)
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
