//! MariaDB: a private instance (`mariadb-install-db` into a temporary directory, own socket and port).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::control::process_control;
use crate::error::{Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, find_program, temp_dir};
use crate::tls::make_certificates;

const KIND: &str = "mariadb";
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Options both `mariadb-install-db` and `mariadbd` get, so the files the one creates suit the other.
const COMMON: &[&str] = &[
    "--innodb-log-file-size=16M",
    "--innodb-buffer-pool-size=32M",
];

fn user_args() -> Vec<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        vec!["--user=root"]
    } else {
        Vec::new()
    }
}

/// A private MariaDB instance: `mariadb-install-db` into its own directory, then `mariadbd` on a free loopback
/// port with its own socket, binary log off, `innodb-flush-log-at-trx-commit=0`. User `root`, no password;
/// database `test` is created after the first start.
///
/// Data survives [`restart`](Self::restart) (on disk; a [`kill`](Self::kill) is a crash and InnoDB recovers).
/// Stopped with SIGTERM.
pub struct MariaDb {
    proc: Proc,
    port: u16,
    client: PathBuf,
    /// Whether the server takes only TLS connections, so that its tools must use TLS too.
    tls: bool,
}

process_control!(MariaDb);

impl MariaDb {
    /// Initializes the data directory, starts the server, waits until `select 1` works, and creates database
    /// `test`.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without the binaries; [`ServerError::CommandFailed`] when
    /// `mariadb-install-db` or the `create database` fails; [`ServerError::StartFailed`] with the server's log.
    pub fn start() -> Result<Self> {
        Self::start_with_env(&[])
    }

    /// [`start`](Self::start), with `env` set in the server's environment only (not the
    /// bootstrap's): a preloaded libfaketime, say, to step the server's wall clock.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_env(env: &[(String, String)]) -> Result<Self> {
        Self::start_with(env, false)
    }

    /// Starts a server as [`start`](Self::start) does that accepts connections **only over TLS**
    /// (`require_secure_transport`), with a certificate for `127.0.0.1` from a private CA made
    /// with `openssl`; clients trust [`ca_cert`](Self::ca_cert).
    ///
    /// # Errors
    /// As [`start`](Self::start), and [`ServerError::NotInstalled`] without `openssl`.
    pub fn start_tls() -> Result<Self> {
        Self::start_with(&[], true)
    }

    fn start_with(env: &[(String, String)], tls: bool) -> Result<Self> {
        let server = find_program(KIND, "mariadbd")?;
        let install = find_program(KIND, "mariadb-install-db")?;
        let client = find_program(KIND, "mariadb")?;
        let port = free_port().map_err(ServerError::io(KIND, "cannot find a free port"))?;
        let dir = temp_dir(KIND)?;
        let data = dir.path().join("data");
        // Its own tmpdir: concurrent bootstraps sharing /tmp trip over each other's temporary
        // tables ("Could not remove temporary table", then "Unknown table 'mysql.tmp_user_sys'").
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).map_err(ServerError::io(KIND, "cannot create the tmpdir"))?;
        let tmpdir = format!("--tmpdir={}", tmp.display());
        let begun = Instant::now();
        Launch::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(user_args())
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .arg(&tmpdir)
            .args(COMMON)
            .cwd(dir.path())
            .run(KIND, TOOL_TIMEOUT)?;
        let install_took = begun.elapsed();
        let tls_settings = if tls {
            make_certificates(KIND, dir.path())?;
            let file = |name: &str| dir.path().join(name).display().to_string();
            vec![
                format!("--ssl-cert={}", file("server.pem")),
                format!("--ssl-key={}", file("server.key")),
                format!("--ssl-ca={}", file("ca.pem")),
                "--require-secure-transport=ON".to_owned(),
            ]
        } else {
            Vec::new()
        };

        let launch = Launch::new(server)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(user_args())
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!(
                "--socket={}",
                dir.path().join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mysqld.pid").display()
            ))
            .args([
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-name-resolve",
            ])
            .args(["--max-connections=300"])
            // Tests find who waits for which `GET_LOCK` key in performance_schema.metadata_locks
            // (PROCESSLIST shows a prepared statement's placeholders, not its key).
            .args([
                "--performance-schema=ON",
                "--performance-schema-instrument=wait/lock/metadata/sql/mdl=ON",
            ])
            .arg(&tmpdir)
            .args(COMMON)
            .args(tls_settings)
            .cwd(dir.path());
        let launch = env
            .iter()
            .fold(launch, |launch, (key, value)| launch.env(key, value));
        let ready = Self::client_command(&client, port, tls, "select 1");
        let proc = Proc::new(
            KIND,
            format!("127.0.0.1:{port}"),
            dir,
            launch,
            Box::new(move || ready.run(KIND, Duration::from_secs(5)).is_ok()),
            READY_TIMEOUT,
            libc::SIGTERM,
        );
        proc.start()?;
        let db = MariaDb {
            proc,
            port,
            client,
            tls,
        };
        db.query("create database if not exists test")?;
        eprintln!("dlock-test-servers: mariadb install-db took {install_took:.2?}");
        Ok(db)
    }

    fn client_command(client: &Path, port: u16, tls: bool, sql: &str) -> Launch {
        let launch = Launch::new(client)
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "--connect-timeout=2",
                "-N",
                "-B",
            ])
            .arg(format!("--port={port}"))
            .args(["-e", sql]);
        // The server of `start_tls` refuses plain connections; the tools trust it unchecked.
        if tls { launch.arg("--ssl") } else { launch }
    }

    /// The PEM file of the private CA that signed the certificate of a server from
    /// [`start_tls`](Self::start_tls).
    pub fn ca_cert(&self) -> PathBuf {
        self.proc.dir().join("ca.pem")
    }

    /// `mysql://root@127.0.0.1:PORT/test`
    pub fn url(&self) -> String {
        format!("mysql://root@{}/test", self.addr())
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's Unix socket.
    pub fn socket_path(&self) -> PathBuf {
        self.proc.dir().join("mysqld.sock")
    }

    /// Runs SQL with the `mariadb` client as `root` (batch mode, no column names); returns its output.
    ///
    /// # Errors
    /// [`ServerError::CommandFailed`] when the client fails (its message is in the error).
    pub fn query(&self, sql: &str) -> Result<String> {
        Self::client_command(&self.client, self.port, self.tls, sql)
            .run(KIND, Duration::from_secs(30))
    }
}
