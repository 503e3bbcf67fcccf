//! ZooKeeper 3.8: a standalone server, and a three-node ensemble.

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::control::process_control;
use crate::error::{INSTALL_HINT, Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, find_program, temp_dir};
use crate::tls::make_certificates;

const KIND: &str = "zookeeper";
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// A logging backend for slf4j, so the server's log reaches its log file (optional).
const SLF4J_SIMPLE_JAR: &str = "/usr/share/java/slf4j-simple.jar";
/// Netty's codecs: its TLS handler is a decoder from this jar, which the class path in Debian's
/// `zookeeper.jar` manifest leaves out (without it every TLS connection is closed at once with
/// `NoClassDefFoundError: io/netty/handler/codec/ByteToMessageDecoder`).
const NETTY_CODEC_JAR: &str = "/usr/share/java/netty-codec.jar";

/// The ZooKeeper tick: session timeouts are checked on tick boundaries.
pub const ZOOKEEPER_TICK: Duration = Duration::from_millis(500);
/// The shortest session timeout the test servers grant.
pub const ZOOKEEPER_MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(1000);
/// The longest session timeout the test servers grant.
pub const ZOOKEEPER_MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(60_000);

/// Sends a four-letter command (`ruok`, `srvr`, `stat`, `mntr`, `cons`, …; all are enabled) and returns the
/// answer.
///
/// # Errors
/// When the server cannot be reached or does not answer within 2 s.
pub fn zookeeper_four_letter(addr: SocketAddr, command: &str) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The `Mode:` line of `srvr` (`standalone`, `leader`, `follower`), once the server serves requests.
fn mode(addr: SocketAddr) -> Option<String> {
    let answer = zookeeper_four_letter(addr, "srvr").ok()?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_owned())
}

struct Node {
    id: usize,
    client: u16,
    quorum: u16,
    election: u16,
}

impl Node {
    fn new(id: usize) -> Result<Self> {
        let port = || free_port().map_err(ServerError::io(KIND, "cannot find a free port"));
        Ok(Node {
            id,
            client: port()?,
            quorum: port()?,
            election: port()?,
        })
    }
}

/// One ZooKeeper server (standalone, or part of a [`ZooKeeperEnsemble`]).
///
/// Runs `java -Xmx256m … QuorumPeerMain zoo.cfg` with `tickTime=500`, session timeouts between 1 s and 60 s
/// ([`ZOOKEEPER_MIN_SESSION_TIMEOUT`], [`ZOOKEEPER_MAX_SESSION_TIMEOUT`]), `forceSync=no`, all four-letter
/// commands enabled, admin server off, empty container nodes removed within a second. Data (snapshots, transaction log) is in its directory and survives
/// [`restart`](Self::restart). Ready when `srvr` reports a `Mode:` (it serves requests). Stopped with SIGTERM.
/// The JVM is the slowest of the servers to start: share one where a test does no harm.
pub struct ZooKeeper {
    proc: Proc,
    client: u16,
    /// The TLS client port, for a server from [`ZooKeeper::start_tls`].
    secure: Option<u16>,
}

process_control!(ZooKeeper);

impl ZooKeeper {
    /// Starts a standalone server and waits until it serves requests.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `java` or `zookeeper.jar`; [`ServerError::StartFailed`] with its
    /// log.
    pub fn start() -> Result<Self> {
        let node = Node::new(0)?;
        let zk = Self::prepare(&node, &[], None)?;
        zk.proc.start()?;
        Ok(zk)
    }

    /// Starts a standalone server that also serves **TLS** on a second port, through Netty
    /// (`NettyServerCnxnFactory`), with PEM files from a private CA made by `openssl` (a
    /// certificate for `127.0.0.1`; clients are not asked for one). The plain port stays open for
    /// readiness checks and for reading the server. Clients connect to
    /// [`tls_url`](Self::tls_url), which names [`ca_cert`](Self::ca_cert).
    ///
    /// # Errors
    /// As [`start`](Self::start); [`ServerError::NotInstalled`] without `openssl` or Netty's
    /// codec jar; [`ServerError::CommandFailed`] if a certificate cannot be made.
    pub fn start_tls() -> Result<Self> {
        if !Path::new(NETTY_CODEC_JAR).is_file() {
            return Err(ServerError::NotInstalled {
                server: KIND,
                missing: NETTY_CODEC_JAR.to_owned(),
                hint: INSTALL_HINT,
            });
        }
        let node = Node::new(0)?;
        let secure = free_port().map_err(ServerError::io(KIND, "cannot find a free port"))?;
        let zk = Self::prepare(&node, &[], Some(secure))?;
        zk.proc.start()?;
        Ok(zk)
    }

    /// Writes `zoo.cfg` (and `myid` in an ensemble, the certificates with a TLS port) and
    /// prepares the process.
    fn prepare(node: &Node, ensemble: &[Node], secure: Option<u16>) -> Result<Self> {
        let java = find_program(KIND, "java")?;
        if !Path::new(ZOOKEEPER_JAR).is_file() {
            return Err(ServerError::NotInstalled {
                server: KIND,
                missing: ZOOKEEPER_JAR.to_owned(),
                hint: INSTALL_HINT,
            });
        }
        let dir = temp_dir(KIND)?;
        let data = dir.path().join("data");
        let io_err = |what: &str| ServerError::io(KIND, format!("cannot write {what}"));
        fs::create_dir(&data).map_err(io_err("the data directory"))?;
        let mut config = format!(
            "tickTime={tick}\ninitLimit=20\nsyncLimit=10\ndataDir={data}\nclientPort={client}\n\
             clientPortAddress=127.0.0.1\nminSessionTimeout={min}\nmaxSessionTimeout={max}\n\
             admin.enableServer=false\nforceSync=no\n4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
            tick = ZOOKEEPER_TICK.as_millis(),
            data = data.display(),
            client = node.client,
            min = ZOOKEEPER_MIN_SESSION_TIMEOUT.as_millis(),
            max = ZOOKEEPER_MAX_SESSION_TIMEOUT.as_millis(),
        );
        if let Some(port) = secure {
            make_certificates(KIND, dir.path())?;
            // A PEM key store is the key and its certificate in one file.
            let key = fs::read_to_string(dir.path().join("server.key"))
                .map_err(ServerError::io(KIND, "cannot read server.key"))?;
            let cert = fs::read_to_string(dir.path().join("server.pem"))
                .map_err(ServerError::io(KIND, "cannot read server.pem"))?;
            let key_store = dir.path().join("keystore.pem");
            fs::write(&key_store, format!("{key}{cert}")).map_err(io_err("keystore.pem"))?;
            config.push_str(&format!(
                "secureClientPort={port}\nsecureClientPortAddress=127.0.0.1\n\
                 serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=none\n",
                key_store.display(),
                dir.path().join("ca.pem").display(),
            ));
        }
        if !ensemble.is_empty() {
            config.push_str("standaloneEnabled=false\nreconfigEnabled=false\n");
            for peer in ensemble {
                config.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    peer.id, peer.quorum, peer.election
                ));
            }
            fs::write(data.join("myid"), format!("{}\n", node.id)).map_err(io_err("myid"))?;
        }
        let config_path = dir.path().join("zoo.cfg");
        fs::write(&config_path, config).map_err(io_err("zoo.cfg"))?;

        let mut classpath = ZOOKEEPER_JAR.to_owned();
        if Path::new(SLF4J_SIMPLE_JAR).is_file() {
            classpath = format!("{classpath}:{SLF4J_SIMPLE_JAR}");
        }
        if secure.is_some() {
            classpath = format!("{classpath}:{NETTY_CODEC_JAR}");
        }
        let launch = Launch::new(java)
            // Small heap, and a JIT and GC tuned for a fast start on a small machine.
            .args([
                "-Xmx256m",
                "-Xss512k",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
            ])
            .args([
                "-Djava.net.preferIPv4Stack=true",
                "-Dzookeeper.admin.enableServer=false",
            ])
            .arg(format!("-Dzookeeper.log.dir={}", dir.path().display()))
            // Leader election retries back off up to 60 s by default; keep the back-off short.
            .arg("-Dzookeeper.fastleader.maxNotificationInterval=1000")
            // Empty container nodes go within a second, not a minute, so a test finds no residue.
            .arg("-Dznode.container.checkIntervalMs=1000")
            .args([
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
            ])
            .args([
                "-cp",
                &classpath,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(&config_path)
            .cwd(dir.path());
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, node.client));
        let proc = Proc::new(
            KIND,
            addr.to_string(),
            dir,
            launch,
            Box::new(move || mode(addr).is_some()),
            READY_TIMEOUT,
            libc::SIGTERM,
        );
        Ok(ZooKeeper {
            proc,
            client: node.client,
            secure,
        })
    }

    /// `zks://127.0.0.1:TLS_PORT?ca_cert=CA` for a server from [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        Some(format!(
            "zks://{}?ca_cert={}",
            self.tls_addr()?,
            self.ca_cert()?.display()
        ))
    }

    /// The TLS client address of a server from [`start_tls`](Self::start_tls).
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.secure
            .map(|port| SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
    }

    /// The PEM file of the private CA that signed the TLS certificate, for clients to trust.
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.secure.map(|_| self.proc.dir().join("ca.pem"))
    }

    /// A `zk://` client URL for this server.
    pub fn url(&self) -> String {
        format!("zk://{}", self.addr())
    }

    /// The connect string, `127.0.0.1:PORT`.
    pub fn connect_string(&self) -> String {
        self.addr().to_string()
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client))
    }

    /// Sends a four-letter command (`srvr`, `cons`, `mntr`, …) and returns the answer.
    ///
    /// # Errors
    /// When the server cannot be reached or does not answer within 2 s.
    pub fn four_letter(&self, command: &str) -> io::Result<String> {
        zookeeper_four_letter(self.addr(), command)
    }

    /// The server's mode as `srvr` reports it (`standalone`, `leader`, `follower`), or `None` when it does not
    /// serve requests (down, paused, or without quorum).
    pub fn mode(&self) -> Option<String> {
        mode(self.addr())
    }
}

/// A three-node ZooKeeper ensemble on loopback ports. Dropping it stops all nodes.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    nodes: Vec<ZooKeeper>,
}

impl ZooKeeperEnsemble {
    /// Starts three nodes together and waits until each serves requests (a leader is elected).
    ///
    /// # Errors
    /// As [`ZooKeeper::start`].
    pub fn start() -> Result<Self> {
        let begun = Instant::now();
        let specs = (1..=3).map(Node::new).collect::<Result<Vec<_>>>()?;
        let nodes = specs
            .iter()
            .map(|node| ZooKeeper::prepare(node, &specs, None))
            .collect::<Result<Vec<_>>>()?;
        let spawned = nodes
            .iter()
            .map(|n| n.proc.spawn())
            .collect::<Result<Vec<_>>>()?;
        for (node, spawned) in nodes.iter().zip(spawned) {
            node.proc.wait_ready(spawned)?;
        }
        eprintln!(
            "dlock-test-servers: zookeeper ensemble of 3 ready in {:.2?}",
            begun.elapsed()
        );
        Ok(ZooKeeperEnsemble { nodes })
    }

    /// The connect string, `127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZooKeeper::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Node `i` of 3.
    pub fn node(&self, i: usize) -> &ZooKeeper {
        &self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[ZooKeeper] {
        &self.nodes
    }

    /// The index of the node that reports `Mode: leader`, if any.
    pub fn leader(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|n| n.mode().as_deref() == Some("leader"))
    }
}
