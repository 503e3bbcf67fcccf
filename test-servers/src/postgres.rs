//! Postgres: a private instance (`initdb` into a temporary directory, own port and socket directory).

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::control::process_control;
use crate::error::{INSTALL_HINT, Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, RunAs, temp_dir};
use crate::tls::make_certificates;

const KIND: &str = "postgres";
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// The newest `/usr/lib/postgresql/<version>/bin` that has `initdb` and `postgres`.
fn bin_dir() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("postgres").is_file())
                .then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(ServerError::NotInstalled {
            server: KIND,
            missing: "/usr/lib/postgresql/<version>/bin/{initdb,postgres}".to_owned(),
            hint: INSTALL_HINT,
        })
}

/// Postgres refuses to run as root: then run it as the `postgres` user (the Debian package creates it).
pub(crate) fn run_as() -> Result<Option<RunAs>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    RunAs::user("postgres")
        .map(Some)
        .ok_or(ServerError::NotInstalled {
            server: KIND,
            missing: "user `postgres`".to_owned(),
            hint: INSTALL_HINT,
        })
}

/// A private Postgres instance: `initdb -A trust -U postgres` into its own directory, then `postgres` on a free
/// loopback port with its socket in that directory, `fsync=off`. Superuser `postgres`, no password.
///
/// Data survives [`restart`](Self::restart) (it is on disk; a [`kill`](Self::kill) is a crash, and Postgres
/// recovers). Stopped with SIGINT (fast shutdown). When the tests run as root, `initdb` and `postgres` run as the
/// `postgres` user (set in the child before `exec`, so the handle's PID is the postmaster's).
/// [`pause`](Self::pause) freezes the postmaster *and* its backends.
pub struct Postgres {
    proc: Proc,
    port: u16,
    bin: PathBuf,
}

process_control!(Postgres);

impl Postgres {
    /// Creates the cluster with `initdb` and starts the server; returns once `pg_isready` succeeds.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without the binaries; [`ServerError::CommandFailed`] when `initdb` fails;
    /// [`ServerError::StartFailed`] with the server's log.
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// Starts a server as [`start`](Self::start) does that accepts TCP connections **only over
    /// TLS** (`hostnossl … reject`), with a certificate for `127.0.0.1` from a private CA made
    /// with `openssl`; clients trust [`ca_cert`](Self::ca_cert).
    ///
    /// # Errors
    /// As [`start`](Self::start), and [`ServerError::NotInstalled`] without `openssl`.
    pub fn start_tls() -> Result<Self> {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Result<Self> {
        let bin = bin_dir()?;
        let user = run_as()?;
        let port = free_port().map_err(ServerError::io(KIND, "cannot find a free port"))?;
        let dir = temp_dir(KIND)?;
        if let Some(user) = user {
            user.chown(dir.path()).map_err(ServerError::io(
                KIND,
                "cannot give the directory to user postgres",
            ))?;
        }
        let data = dir.path().join("data");
        let begun = std::time::Instant::now();
        Launch::new(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .cwd(dir.path())
            .run_as(user)
            .run(KIND, TOOL_TIMEOUT)?;
        let initdb_took = begun.elapsed();
        let tls_settings = if tls {
            require_tls(dir.path(), &data, user)?
        } else {
            Vec::new()
        };

        let launch = Launch::new(bin.join("postgres"))
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ])
            .args(["-c", "shared_buffers=32MB", "-c", "max_connections=200"])
            .args(tls_settings)
            .cwd(dir.path())
            .run_as(user);
        let ready = Launch::new(bin.join("pg_isready")).args([
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "2",
        ]);
        let proc = Proc::new(
            KIND,
            format!("127.0.0.1:{port}"),
            dir,
            launch,
            Box::new(move || ready.run(KIND, Duration::from_secs(5)).is_ok()),
            READY_TIMEOUT,
            libc::SIGINT,
        );
        proc.start()?;
        eprintln!("dlock-test-servers: postgres initdb took {initdb_took:.2?}");
        Ok(Postgres { proc, port, bin })
    }

    /// The PEM file of the private CA that signed the certificate of a server from
    /// [`start_tls`](Self::start_tls).
    pub fn ca_cert(&self) -> PathBuf {
        self.proc.dir().join("ca.pem")
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the server's Unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        self.proc.dir()
    }

    /// Runs SQL with `psql` (unaligned, tuples only) as `postgres` on database `postgres`; returns its output.
    ///
    /// # Errors
    /// [`ServerError::CommandFailed`] when `psql` fails (its message is in the error).
    pub fn query(&self, sql: &str) -> Result<String> {
        Launch::new(self.bin.join("psql"))
            .args([
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-p", &self.port.to_string(), "-c", sql])
            .env("PGCONNECT_TIMEOUT", "2")
            .run(KIND, Duration::from_secs(30))
    }
}

/// Makes the certificates in `dir`, lets only TLS connections in over TCP (`pg_hba.conf`), and
/// returns the server settings that turn TLS on.
fn require_tls(dir: &Path, data: &Path, user: Option<RunAs>) -> Result<Vec<String>> {
    make_certificates(KIND, dir)?;
    let key = dir.join("server.key");
    let io = |what: &'static str| ServerError::io(KIND, what);
    // Postgres refuses a key that others can read, or that its own user cannot.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600))
        .map_err(io("cannot restrict the server key"))?;
    if let Some(user) = user {
        for file in ["server.key", "server.pem"] {
            user.chown(&dir.join(file))
                .map_err(io("cannot give the certificate to user postgres"))?;
        }
    }
    fs::write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
    )
    .map_err(io("cannot write pg_hba.conf"))?;
    Ok(vec![
        "-c".into(),
        "ssl=on".into(),
        "-c".into(),
        format!("ssl_cert_file={}", dir.join("server.pem").display()),
        "-c".into(),
        format!("ssl_key_file={}", key.display()),
    ])
}
