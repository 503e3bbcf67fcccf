//! etcd 3.4: a single member, and a three-member cluster.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::control::process_control;
use crate::error::{Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, find_program, temp_dir};
use crate::tls::make_certificates;

const KIND: &str = "etcd";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `GET /health` on `addr` says `"health":"true"` (etcd answers that only when it has a leader).
fn healthy(addr: SocketAddr) -> bool {
    let attempt = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    attempt().is_ok_and(|r| r.replace(' ', "").contains("\"health\":\"true\""))
}

/// A lone member elects itself after one election timeout: keep it short (nobody can contest it). Clusters keep
/// the defaults (100 ms heartbeat, 1 s election), which tolerate a busy 2-core machine.
const SOLO_TIMING: &[&str] = &["--heartbeat-interval", "50", "--election-timeout", "250"];

/// A token unique to one cluster, so members of different test clusters never talk to each other.
fn cluster_token(first_client_port: u16) -> String {
    format!("dlock-{}-{first_client_port}", std::process::id())
}

/// One etcd member: its name, client port, peer port.
struct Member {
    name: String,
    client: u16,
    peer: u16,
}

impl Member {
    fn new(name: String) -> Result<Self> {
        let port = || free_port().map_err(ServerError::io(KIND, "cannot find a free port"));
        Ok(Member {
            name,
            client: port()?,
            peer: port()?,
        })
    }

    fn initial_cluster_entry(&self) -> String {
        format!("{}=http://127.0.0.1:{}", self.name, self.peer)
    }
}

/// One etcd member (alone, or part of an [`EtcdCluster`]).
///
/// Data is on disk in its directory and survives [`restart`](Self::restart), also after a
/// [`kill`](Self::kill). Stopped with SIGTERM. Readiness is `GET /health`, which needs a leader: a lone
/// member of a cluster whose peers are down never becomes ready.
pub struct Etcd {
    proc: Proc,
    client: u16,
    etcdctl: Option<PathBuf>,
    tls: Option<Tls>,
}

/// The TLS side of a member from [`Etcd::start_tls`]: its port and its private CA.
struct Tls {
    port: u16,
    dir: tempfile::TempDir,
}

process_control!(Etcd);

impl Etcd {
    /// Starts a single-member etcd and waits until it is healthy.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `etcd`; [`ServerError::StartFailed`] with its log.
    pub fn start() -> Result<Self> {
        let member = Member::new("solo".to_owned())?;
        let cluster = member.initial_cluster_entry();
        let etcd = Self::prepare(
            &member,
            &cluster,
            &cluster_token(member.client),
            SOLO_TIMING,
            None,
        )?;
        etcd.proc.start()?;
        Ok(etcd)
    }

    /// Starts a single-member etcd with the given raft timing (heartbeat interval and election
    /// timeout, in milliseconds), which sets its shortest lease (`ceil(1.5 × election timeout)`),
    /// and waits until it is healthy (one election timeout, at least).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_timing(heartbeat_ms: u32, election_ms: u32) -> Result<Self> {
        let member = Member::new("solo".to_owned())?;
        let cluster = member.initial_cluster_entry();
        let (heartbeat, election) = (heartbeat_ms.to_string(), election_ms.to_string());
        let timing = [
            "--heartbeat-interval",
            heartbeat.as_str(),
            "--election-timeout",
            election.as_str(),
        ];
        let etcd = Self::prepare(
            &member,
            &cluster,
            &cluster_token(member.client),
            &timing,
            None,
        )?;
        etcd.proc.start()?;
        Ok(etcd)
    }

    /// Starts a single member that also serves clients over **TLS** on a second port
    /// (certificates from a private CA made with `openssl`, valid for `127.0.0.1`), besides its
    /// plain port, which readiness checks and [`etcdctl`](Self::etcdctl) keep using. Clients
    /// connect to [`tls_url`](Self::tls_url) and trust [`ca_cert`](Self::ca_cert).
    ///
    /// # Errors
    /// As [`start`](Self::start); [`ServerError::NotInstalled`] without `openssl`;
    /// [`ServerError::CommandFailed`] if a certificate cannot be made.
    pub fn start_tls() -> Result<Self> {
        let member = Member::new("solo".to_owned())?;
        let cluster = member.initial_cluster_entry();
        let dir = temp_dir(KIND)?;
        make_certificates(KIND, dir.path())?;
        let tls = Tls {
            port: free_port().map_err(ServerError::io(KIND, "cannot find a free port"))?,
            dir,
        };
        let etcd = Self::prepare(
            &member,
            &cluster,
            &cluster_token(member.client),
            SOLO_TIMING,
            Some(tls),
        )?;
        etcd.proc.start()?;
        Ok(etcd)
    }

    /// `https://127.0.0.1:TLS_PORT` for a member from [`start_tls`](Self::start_tls).
    pub fn tls_url(&self) -> Option<String> {
        self.tls.as_ref().map(|tls| {
            format!(
                "https://{}",
                SocketAddr::from((Ipv4Addr::LOCALHOST, tls.port))
            )
        })
    }

    /// The PEM file of the private CA that signed the TLS certificate of a member from
    /// [`start_tls`](Self::start_tls), for clients to trust.
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.tls.as_ref().map(|tls| tls.dir.path().join("ca.pem"))
    }

    /// Starts a single-member etcd with authentication on: user `root` with `password`, and
    /// simple tokens that expire `token_ttl` after they were issued (`--auth-token-ttl`, whole
    /// seconds, at least 1). [`restart`](Self::restart) does not work on it (the readiness probe
    /// has no credentials).
    ///
    /// # Errors
    /// As [`start`](Self::start); [`ServerError::CommandFailed`] if `etcdctl` cannot add the user
    /// or enable authentication.
    pub fn start_with_auth(password: &str, token_ttl: Duration) -> Result<Self> {
        let member = Member::new("solo".to_owned())?;
        let cluster = member.initial_cluster_entry();
        let ttl = token_ttl.as_secs().max(1).to_string();
        let mut extra = SOLO_TIMING.to_vec();
        extra.extend(["--auth-token", "simple", "--auth-token-ttl", &ttl]);
        let etcd = Self::prepare(
            &member,
            &cluster,
            &cluster_token(member.client),
            &extra,
            None,
        )?;
        etcd.proc.start()?;
        etcd.etcdctl(&["user", "add", &format!("root:{password}")])?;
        etcd.etcdctl(&["auth", "enable"])?;
        Ok(etcd)
    }

    fn prepare(
        member: &Member,
        initial_cluster: &str,
        token: &str,
        extra: &[&str],
        tls: Option<Tls>,
    ) -> Result<Self> {
        let program = find_program(KIND, "etcd")?;
        let dir = temp_dir(KIND)?;
        let client_url = format!("http://127.0.0.1:{}", member.client);
        let peer_url = format!("http://127.0.0.1:{}", member.peer);
        // A TLS member listens on its plain port too: the readiness probe and etcdctl use it.
        let client_urls = match &tls {
            Some(tls) => format!("{client_url},https://127.0.0.1:{}", tls.port),
            None => client_url.clone(),
        };
        let mut launch = Launch::new(program)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client_urls,
                "--advertise-client-urls",
                &client_urls,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args([
                "--initial-cluster",
                initial_cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args(["--initial-cluster-token", token])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(extra)
            .cwd(dir.path());
        if let Some(tls) = &tls {
            launch = launch
                .arg("--cert-file")
                .arg(tls.dir.path().join("server.pem"))
                .arg("--key-file")
                .arg(tls.dir.path().join("server.key"));
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, member.client));
        let proc = Proc::new(
            KIND,
            format!("{client_url} (peer {peer_url})"),
            dir,
            launch,
            Box::new(move || healthy(addr)),
            READY_TIMEOUT,
            libc::SIGTERM,
        );
        Ok(Etcd {
            proc,
            client: member.client,
            etcdctl: find_program(KIND, "etcdctl").ok(),
            tls,
        })
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The client URL as a one-element list, for clients that take endpoints.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.url()]
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.client))
    }

    /// Whether `GET /health` succeeds now.
    pub fn is_healthy(&self) -> bool {
        healthy(self.addr())
    }

    /// Runs `etcdctl` (API v3) against this member, e.g. `etcdctl(&["put", "k", "v"])`; returns its output.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `etcdctl`; [`ServerError::CommandFailed`] when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let program = self
            .etcdctl
            .clone()
            .map_or_else(|| find_program(KIND, "etcdctl"), Ok)?;
        Launch::new(program)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.url()))
            .args(["--command-timeout=5s", "--dial-timeout=2s"])
            .args(args)
            .run(KIND, Duration::from_secs(15))
    }
}

/// A three-member etcd cluster on loopback ports. Dropping it stops all members.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts three members together and waits until each is healthy (the cluster has a leader).
    ///
    /// # Errors
    /// As [`Etcd::start`].
    pub fn start() -> Result<Self> {
        Self::start_with(3)
    }

    /// Starts `n` members (use an odd number).
    ///
    /// # Errors
    /// As [`Etcd::start`].
    pub fn start_with(n: usize) -> Result<Self> {
        let begun = Instant::now();
        let specs = (0..n)
            .map(|i| Member::new(format!("m{i}")))
            .collect::<Result<Vec<_>>>()?;
        let initial = specs
            .iter()
            .map(Member::initial_cluster_entry)
            .collect::<Vec<_>>()
            .join(",");
        let token = cluster_token(specs[0].client);
        let members = specs
            .iter()
            .map(|m| Etcd::prepare(m, &initial, &token, &[], None))
            .collect::<Result<Vec<_>>>()?;
        let spawned = members
            .iter()
            .map(|m| m.proc.spawn())
            .collect::<Result<Vec<_>>>()?;
        for (member, spawned) in members.iter().zip(spawned) {
            member.proc.wait_ready(spawned)?;
        }
        eprintln!(
            "dlock-test-servers: etcd cluster of {n} ready in {:.2?}",
            begun.elapsed()
        );
        Ok(EtcdCluster { members })
    }

    /// All members' client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::url).collect()
    }

    /// All client URLs joined with commas (`http://127.0.0.1:A,http://127.0.0.1:B,…`).
    pub fn url(&self) -> String {
        self.endpoints().join(",")
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &Etcd {
        &self.members[i]
    }

    /// All members.
    pub fn members(&self) -> &[Etcd] {
        &self.members
    }
}
