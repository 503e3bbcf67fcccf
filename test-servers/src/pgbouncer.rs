//! PgBouncer: a connection pooler in front of a [`Postgres`](crate::Postgres), in the pooling
//! mode a test asks for.

use std::fmt;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::control::process_control;
use crate::error::{Result, ServerError};
use crate::ports::free_port;
use crate::process::{Launch, Proc, find_program, temp_dir};

const KIND: &str = "pgbouncer";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// When PgBouncer gives a client a server connection, and so what a session-level lock means
/// through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps one server connection while it is connected: session state, session
    /// advisory locks included, behaves as on a direct connection (`server_reset_query = DISCARD
    /// ALL` cleans up after a client disconnects).
    Session,
    /// A client gets a server connection per transaction: a session advisory lock stays with a
    /// server connection that other clients then use.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A private PgBouncer on a free loopback port, pooling every database of `upstream` (user
/// `postgres`, `auth_type = any`) with `pool_size` server connections per database and user.
/// Runs as user `postgres` when the tests run as root (PgBouncer refuses root).
pub struct PgBouncer {
    proc: Proc,
    port: u16,
    mode: PoolMode,
}

process_control!(PgBouncer, custom_debug);

impl fmt::Debug for PgBouncer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgBouncer")
            .field("addr", &self.addr())
            .field("mode", &self.mode)
            .field("pid", &self.pid())
            .finish()
    }
}

impl PgBouncer {
    /// Starts PgBouncer in front of the Postgres at `upstream`; returns once it accepts
    /// connections.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `pgbouncer`; [`ServerError::StartFailed`] with its log.
    pub fn start(upstream: SocketAddr, mode: PoolMode, pool_size: u32) -> Result<Self> {
        let program = find_program(KIND, "pgbouncer")?;
        // Like Postgres, PgBouncer refuses to run as root.
        let user = crate::postgres::run_as()?;
        let port = free_port().map_err(ServerError::io(KIND, "cannot find a free port"))?;
        let dir = temp_dir(KIND)?;
        let ini = dir.path().join("pgbouncer.ini");
        let config = format!(
            "[databases]\n\
             * = host={host} port={up_port} user=postgres\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 200\n\
             server_reset_query = DISCARD ALL\n\
             ignore_startup_parameters = extra_float_digits\n",
            host = upstream.ip(),
            up_port = upstream.port(),
            mode = mode.as_str(),
        );
        fs::write(&ini, config).map_err(ServerError::io(KIND, "cannot write pgbouncer.ini"))?;
        if let Some(user) = user {
            for path in [dir.path(), ini.as_path()] {
                user.chown(path).map_err(ServerError::io(
                    KIND,
                    "cannot give the directory to user postgres",
                ))?;
            }
        }
        let launch = Launch::new(program).arg(&ini).cwd(dir.path()).run_as(user);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let proc = Proc::new(
            KIND,
            addr.to_string(),
            dir,
            launch,
            Box::new(move || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()),
            READY_TIMEOUT,
            libc::SIGINT,
        );
        proc.start()?;
        Ok(PgBouncer { proc, port, mode })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr())
    }

    /// `127.0.0.1:PORT`
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The pooling mode it runs in.
    pub fn mode(&self) -> PoolMode {
        self.mode
    }
}
