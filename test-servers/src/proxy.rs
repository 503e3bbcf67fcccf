//! A TCP fault proxy: partitions, latency, lost and late replies, resets — switchable while connections are open.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// How often a pump looks at the mode while it waits (blackhole) or between reads.
const TICK: Duration = Duration::from_millis(5);
const READ_TIMEOUT: Duration = Duration::from_millis(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a [`FaultProxy`] does with traffic. Changing it affects open connections at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forward everything both ways.
    #[default]
    PassThrough,
    /// Forward everything, but deliver each chunk `d` late, in each direction (a request/reply round trip
    /// becomes `2·d` slower).
    Latency(Duration),
    /// Like [`Latency`](Self::Latency), but each chunk's delay is drawn afresh between `min` and `max`
    /// (a congested, jittery link). Chunks of one direction still arrive in order, as on one TCP stream.
    Jitter {
        /// The shortest delay of a chunk.
        min: Duration,
        /// The longest delay of a chunk.
        max: Duration,
    },
    /// A network partition: connections stay open (new ones are accepted too, but not connected upstream), and
    /// nothing is read or forwarded in either direction. Bytes sent meanwhile wait in the kernel's socket
    /// buffers and are delivered after a heal, as TCP retransmission would deliver them; use
    /// [`FaultProxy::reset`] to make them disappear instead.
    Blackhole,
    /// Requests reach the server; its replies are read and thrown away.
    DropReplies,
    /// Requests reach the server; its replies are kept back (in order) until [`FaultProxy::release_held`] or
    /// [`FaultProxy::heal`], or until the mode becomes [`PassThrough`](Self::PassThrough) or
    /// [`Latency`](Self::Latency) or [`Jitter`](Self::Jitter) again.
    HoldReplies,
    /// A server that is down or restarting: each new connection is closed as soon as it is
    /// accepted, before any byte is read or forwarded, so the client sees it closed before any
    /// reply. Open connections carry on as in [`PassThrough`](Self::PassThrough), except that
    /// replies held by [`HoldReplies`](Self::HoldReplies) stay held. [`FaultProxy::refused`]
    /// counts the connections closed this way, so a test can wait on a client's attempts.
    Refuse,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client to server.
    Request,
    /// Server to client.
    Reply,
}

struct Shared {
    upstream: SocketAddr,
    mode: Mutex<ProxyMode>,
    closed: AtomicBool,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Connections closed on arrival by [`ProxyMode::Refuse`].
    refused: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn mode(&self) -> ProxyMode {
        *lock(&self.mode)
    }

    /// Waits while the mode is `Blackhole`; returns the mode after, or `None` when the connection is closed.
    fn wait_out_blackhole(&self, conn: &Conn) -> Option<ProxyMode> {
        loop {
            if self.closed.load(Ordering::Relaxed) || conn.closed.load(Ordering::Relaxed) {
                return None;
            }
            match self.mode() {
                ProxyMode::Blackhole => thread::sleep(TICK),
                mode => return Some(mode),
            }
        }
    }
}

/// One proxied connection.
struct Conn {
    /// Write side towards the client; its lock also orders held replies against new ones.
    client: Mutex<TcpStream>,
    /// The client socket again, to shut it down without waiting for a blocked writer.
    client_ctl: TcpStream,
    /// Write side towards the server, once connected.
    server: Mutex<Option<TcpStream>>,
    /// Replies kept back by `HoldReplies`.
    held: Mutex<Vec<u8>>,
    closed: AtomicBool,
}

impl Conn {
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let _ = self.client_ctl.shutdown(Shutdown::Both);
        if let Some(server) = lock(&self.server).as_ref() {
            let _ = server.shutdown(Shutdown::Both);
        }
        lock(&self.held).clear();
    }

    /// Writes held replies, then `chunk`, to the client.
    fn deliver_reply(&self, chunk: &[u8]) -> io::Result<()> {
        let mut held = lock(&self.held);
        let mut client = lock(&self.client);
        if !held.is_empty() {
            client.write_all(&held)?;
            held.clear();
        }
        client.write_all(chunk)
    }

    fn release_held(&self) -> io::Result<()> {
        self.deliver_reply(&[])
    }
}

/// A TCP proxy on `127.0.0.1` between clients and one server, which a test switches at run time between
/// [`ProxyMode`]s: pass-through, added latency, blackhole (a partition), dropped replies, held replies; and
/// which can [`reset`](Self::reset) every connection.
///
/// Point the client at [`addr`](Self::addr) instead of the server (rewriting the URL is the caller's job). The
/// proxy runs on its own threads (plain `std` threads, one accept thread and two per connection), so it works
/// the same from any tokio runtime flavor or from a plain thread, and a `static` proxy outlives any one
/// `#[tokio::test]`. Dropping it closes every connection.
///
/// ```no_run
/// # fn demo() -> std::io::Result<()> {
/// use dlock_test_servers::{FaultProxy, ProxyMode, RedisServer};
/// let redis = RedisServer::start().expect("redis");
/// let proxy = FaultProxy::start(redis.addr())?;
/// let url = format!("redis://{}", proxy.addr()); // give this to the client under test
/// proxy.set_mode(ProxyMode::Blackhole); // partition: the client's requests go unanswered
/// proxy.heal(); // back to pass-through; what was sent meanwhile is delivered now
/// # Ok(()) }
/// ```
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Option<JoinHandle<()>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("mode", &self.mode())
            .field("connections", &self.connections())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port, in [`ProxyMode::PassThrough`].
    ///
    /// # Errors
    /// When the listening socket cannot be created.
    pub fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            mode: Mutex::new(ProxyMode::PassThrough),
            closed: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
            refused: AtomicUsize::new(0),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("fault-proxy-{addr}"))
                .spawn(move || accept_loop(&listener, &shared))?
        };
        Ok(FaultProxy {
            shared,
            addr,
            accept: Some(accept),
        })
    }

    /// The proxy's own address: connect clients here.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        self.shared.mode()
    }

    /// Switches the mode; open connections follow at once (within a few milliseconds for data already in
    /// flight inside the proxy).
    pub fn set_mode(&self, mode: ProxyMode) {
        *lock(&self.shared.mode) = mode;
    }

    /// Delivers every reply held by [`ProxyMode::HoldReplies`] so far (in order), and returns once it is
    /// written to the clients' sockets. The mode does not change: later replies are held again.
    pub fn release_held(&self) {
        for conn in self.open_connections() {
            if conn.release_held().is_err() {
                conn.close();
            }
        }
    }

    /// Ends every fault: back to [`ProxyMode::PassThrough`], held replies delivered.
    pub fn heal(&self) {
        self.set_mode(ProxyMode::PassThrough);
        self.release_held();
    }

    /// Closes every open connection, both towards the client and towards the server (held replies are
    /// discarded). The mode does not change, and new connections are accepted as usual.
    pub fn reset(&self) {
        let conns = std::mem::take(&mut *lock(&self.shared.conns));
        for conn in conns {
            conn.close();
        }
    }

    /// How many connections [`ProxyMode::Refuse`] has closed on arrival since the proxy started.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// The bytes of replies [`ProxyMode::HoldReplies`] holds back now, over every open
    /// connection: a test waits for it to know a request is in flight.
    pub fn held_bytes(&self) -> usize {
        self.open_connections()
            .iter()
            .map(|conn| lock(&conn.held).len())
            .sum()
    }

    /// The number of open connections.
    pub fn connections(&self) -> usize {
        self.open_connections().len()
    }

    fn open_connections(&self) -> Vec<Arc<Conn>> {
        let mut conns = lock(&self.shared.conns);
        conns.retain(|c| !c.closed.load(Ordering::Relaxed));
        conns.clone()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        self.reset();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.closed.load(Ordering::Relaxed) {
            break;
        }
        let Ok(client) = stream else { continue };
        if shared.mode() == ProxyMode::Refuse {
            let _ = client.shutdown(Shutdown::Both);
            shared.refused.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let (Ok(client_write), Ok(client_ctl)) = (client.try_clone(), client.try_clone()) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let conn = Arc::new(Conn {
            client: Mutex::new(client_write),
            client_ctl,
            server: Mutex::new(None),
            held: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        });
        lock(&shared.conns).push(Arc::clone(&conn));
        let shared = Arc::clone(shared);
        let spawned = thread::Builder::new()
            .name("fault-proxy-conn".into())
            .spawn(move || serve(&shared, &conn, client));
        if spawned.is_err() {
            continue;
        }
    }
}

/// Connects upstream (after any blackhole), starts the reply pump, and pumps requests.
fn serve(shared: &Arc<Shared>, conn: &Arc<Conn>, client: TcpStream) {
    if shared.wait_out_blackhole(conn).is_none() {
        return;
    }
    let server = match TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) {
        Ok(server) => server,
        Err(_) => return conn.close(),
    };
    let _ = server.set_nodelay(true);
    let (Ok(server_read), Ok(server_write)) = (server.try_clone(), server.try_clone()) else {
        return conn.close();
    };
    *lock(&conn.server) = Some(server);
    if conn.closed.load(Ordering::Relaxed) {
        // reset() ran before the server stream was recorded.
        return conn.close();
    }
    let replies = {
        let (shared, conn) = (Arc::clone(shared), Arc::clone(conn));
        thread::Builder::new()
            .name("fault-proxy-reply".into())
            .spawn(move || pump(&shared, &conn, server_read, None, Direction::Reply))
    };
    if replies.is_err() {
        return conn.close();
    }
    pump(shared, conn, client, Some(server_write), Direction::Request);
}

/// Moves bytes from `from` in one direction until either side closes. Requests are written to `to`; replies
/// go through [`Conn::deliver_reply`].
fn pump(
    shared: &Shared,
    conn: &Conn,
    mut from: TcpStream,
    mut to: Option<TcpStream>,
    direction: Direction,
) {
    if from.set_read_timeout(Some(READ_TIMEOUT)).is_err() {
        return conn.close();
    }
    let mut buf = vec![0; 64 * 1024];
    loop {
        // Don't read while partitioned: the bytes stay in the kernel, as on a real partition.
        let Some(mode) = shared.wait_out_blackhole(conn) else {
            return;
        };
        if direction == Direction::Reply
            && matches!(
                mode,
                ProxyMode::PassThrough | ProxyMode::Latency(_) | ProxyMode::Jitter { .. }
            )
            && !lock(&conn.held).is_empty()
            && conn.release_held().is_err()
        {
            return conn.close();
        }
        let n = match from.read(&mut buf) {
            Ok(0) => return half_close(shared, conn, to.as_ref(), direction),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return conn.close(),
        };
        // The mode may have changed while we were reading: a chunk read as a partition began is held back
        // until it ends.
        let Some(mode) = shared.wait_out_blackhole(conn) else {
            return;
        };
        match mode {
            ProxyMode::Latency(delay) => thread::sleep(delay),
            ProxyMode::Jitter { min, max } if min < max => {
                thread::sleep(rand::random_range(min..=max));
            }
            ProxyMode::Jitter { min, .. } => thread::sleep(min),
            _ => {}
        }
        let chunk = &buf[..n];
        let written = match (direction, mode) {
            (Direction::Request, _) => match to.as_mut() {
                Some(server) => server.write_all(chunk),
                None => Ok(()),
            },
            (Direction::Reply, ProxyMode::DropReplies) => Ok(()),
            (Direction::Reply, ProxyMode::HoldReplies) => {
                lock(&conn.held).extend_from_slice(chunk);
                Ok(())
            }
            (Direction::Reply, _) => conn.deliver_reply(chunk),
        };
        if written.is_err() {
            return conn.close();
        }
    }
}

/// One side closed its sending half: pass that on (after any held replies), and close the connection once
/// both directions are done.
fn half_close(shared: &Shared, conn: &Conn, to: Option<&TcpStream>, direction: Direction) {
    match direction {
        Direction::Request => {
            if let Some(server) = to {
                let _ = server.shutdown(Shutdown::Write);
            }
        }
        Direction::Reply => {
            // Held replies are still owed to the client: wait until they are released or the connection closes.
            while !conn.closed.load(Ordering::Relaxed) && !lock(&conn.held).is_empty() {
                if matches!(
                    shared.mode(),
                    ProxyMode::PassThrough | ProxyMode::Latency(_) | ProxyMode::Jitter { .. }
                ) && conn.release_held().is_err()
                {
                    break;
                }
                thread::sleep(TICK);
            }
            let _ = conn.client_ctl.shutdown(Shutdown::Write);
            // The server is gone: nothing more can be forwarded.
            conn.close();
        }
    }
}
