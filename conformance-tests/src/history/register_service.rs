//! The register as a TCP service, and the client workers use to reach it.
//!
//! The [`Register`] lives in the harness process; workers are other processes, so they reach
//! it over loopback TCP, on `127.0.0.1:0`. Being a network service is also what lets a harness
//! put a fault proxy between a worker and the register: a write held in flight past the
//! writer's lease is as stale as a write from a paused writer, and fencing must refuse both.
//!
//! The protocol is one JSON object per line each way: `{"op":"read","name":…}` or
//! `{"op":"write","name":…,"token":…,"holder":{"worker":…,"handle":…},"base":[…],"element":…}`,
//! answered by `{"reply":"read","set":[…],"max_token":…}`, `{"reply":"write","accepted":…,
//! "max_token":…}` or `{"reply":"error","message":…}`.

use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::event::HoldId;
use super::register::{Register, RegisterKind, RegisterSnapshot, RegisterValue};

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    Read {
        name: String,
    },
    Write {
        name: String,
        token: u64,
        holder: HoldId,
        base: BTreeSet<u64>,
        element: u64,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
enum Reply {
    Read {
        set: BTreeSet<u64>,
        max_token: Option<u64>,
    },
    Write {
        accepted: bool,
        max_token: Option<u64>,
    },
    Error {
        message: String,
    },
}

/// A [`Register`] served on `127.0.0.1:<port>`; dropping it stops the service.
#[derive(Debug)]
pub struct RegisterServer {
    addr: SocketAddr,
    register: Arc<Mutex<Register>>,
    task: JoinHandle<()>,
}

impl RegisterServer {
    /// Starts a register of `kind` on a free loopback port.
    pub async fn start(kind: RegisterKind) -> io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let register = Arc::new(Mutex::new(Register::new(kind)));
        let shared = Arc::clone(&register);
        let task = tokio::spawn(async move {
            // Dropped with the accept loop, which aborts every connection.
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, Arc::clone(&shared)));
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self {
            addr,
            register,
            task,
        })
    }

    /// Where workers (or a fault proxy in front of it) connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The log and final sets so far, for the checker.
    pub fn snapshot(&self) -> RegisterSnapshot {
        self.register
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot()
    }
}

impl Drop for RegisterServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, register: Arc<Mutex<Register>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let reply = match serde_json::from_str::<Request>(&line) {
            Err(e) => Reply::Error {
                message: format!("bad request: {e}"),
            },
            Ok(request) => {
                let mut register = register.lock().unwrap_or_else(|e| e.into_inner());
                match request {
                    Request::Read { name } => {
                        let value = register.read(&name);
                        Reply::Read {
                            set: value.set,
                            max_token: value.max_token,
                        }
                    }
                    Request::Write {
                        name,
                        token,
                        holder,
                        base,
                        element,
                    } => {
                        let accepted = register.write(&name, token, holder, base, element);
                        let max_token = register.read(&name).max_token;
                        Reply::Write {
                            accepted,
                            max_token,
                        }
                    }
                }
            }
        };
        let mut bytes = serde_json::to_vec(&reply).expect("replies serialize");
        bytes.push(b'\n');
        if write.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// What [`RegisterClient::rmw`] did: the value it read, and whether its write was accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rmw {
    /// The value read before thinking.
    pub read: RegisterValue,
    /// The write's fate.
    pub accepted: bool,
}

/// One connection to a register; requests go one at a time.
#[derive(Debug)]
pub struct RegisterClient {
    stream: BufReader<TcpStream>,
}

impl RegisterClient {
    /// Connects to the register (or its proxy) at `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
        })
    }

    /// The value of `name`.
    pub async fn read(&mut self, name: &str) -> io::Result<RegisterValue> {
        match self
            .call(&Request::Read {
                name: name.to_owned(),
            })
            .await?
        {
            Reply::Read { set, max_token } => Ok(RegisterValue { set, max_token }),
            other => Err(unexpected(other)),
        }
    }

    /// Asks to set `name` to `base` plus `element`, fenced by `token` under `holder`; returns
    /// whether the register accepted it.
    pub async fn write(
        &mut self,
        name: &str,
        token: u64,
        holder: HoldId,
        base: &BTreeSet<u64>,
        element: u64,
    ) -> io::Result<bool> {
        let request = Request::Write {
            name: name.to_owned(),
            token,
            holder,
            base: base.clone(),
            element,
        };
        match self.call(&request).await? {
            Reply::Write { accepted, .. } => Ok(accepted),
            other => Err(unexpected(other)),
        }
    }

    /// Read, await `think` (a sleep, or a point where the harness pauses the worker), then
    /// write back the set read plus `element`.
    pub async fn rmw(
        &mut self,
        name: &str,
        token: u64,
        holder: HoldId,
        element: u64,
        think: impl Future<Output = ()> + Send,
    ) -> io::Result<Rmw> {
        let read = self.read(name).await?;
        think.await;
        let accepted = self.write(name, token, holder, &read.set, element).await?;
        Ok(Rmw { read, accepted })
    }

    async fn call(&mut self, request: &Request) -> io::Result<Reply> {
        let mut bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.stream.get_mut().write_all(&bytes).await?;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        serde_json::from_str(&line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }
}

fn unexpected(reply: Reply) -> io::Error {
    io::Error::other(format!("unexpected register reply: {reply:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(worker: u32, handle: u64) -> HoldId {
        HoldId { worker, handle }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_with_rising_tokens_keep_every_add() {
        let server = RegisterServer::start(RegisterKind::Fenced).await.unwrap();
        // A token dispenser and one register access at a time stand in for a correct lock.
        let lock = Arc::new(tokio::sync::Mutex::new(0u64));
        let mut tasks = JoinSet::new();
        for worker in 0..4u32 {
            let (lock, addr) = (Arc::clone(&lock), server.addr());
            tasks.spawn(async move {
                let mut client = RegisterClient::connect(addr).await.unwrap();
                for handle in 0..10u64 {
                    let mut token = lock.lock().await;
                    *token += 1;
                    let element = u64::from(worker) * 100 + handle;
                    let think = tokio::task::yield_now();
                    let rmw = client.rmw("n", *token, hold(worker, handle), element, think);
                    assert!(rmw.await.unwrap().accepted);
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let snapshot = server.snapshot();
        assert_eq!(snapshot.log.len(), 40);
        assert!(snapshot.log.iter().all(|w| w.accepted));
        assert!(
            snapshot
                .log
                .windows(2)
                .all(|w| w[0].token < w[1].token && w[0].t <= w[1].t)
        );
        assert_eq!(snapshot.sets["n"].len(), 40);
    }

    #[tokio::test]
    async fn a_stale_token_is_refused_and_logged() {
        let server = RegisterServer::start(RegisterKind::Fenced).await.unwrap();
        let mut old = RegisterClient::connect(server.addr()).await.unwrap();
        let mut new = RegisterClient::connect(server.addr()).await.unwrap();
        let stale = old.read("n").await.unwrap();
        assert!(
            new.rmw("n", 7, hold(2, 1), 2, async {})
                .await
                .unwrap()
                .accepted
        );
        assert!(!old.write("n", 6, hold(1, 1), &stale.set, 1).await.unwrap());
        assert_eq!(
            old.read("n").await.unwrap(),
            RegisterValue {
                set: BTreeSet::from([2]),
                max_token: Some(7),
            }
        );
        let last = server.snapshot().log.pop().unwrap();
        assert!(!last.accepted && last.token == 6 && last.max_token_before == Some(7));
        // Other names are untouched by the fence.
        assert!(
            old.write("m", 6, hold(1, 1), &BTreeSet::new(), 1)
                .await
                .unwrap()
        );
    }

    #[tokio::test]
    async fn an_equal_token_is_accepted_only_from_the_same_holder() {
        let server = RegisterServer::start(RegisterKind::Fenced).await.unwrap();
        let mut client = RegisterClient::connect(server.addr()).await.unwrap();
        assert!(
            client
                .rmw("n", 5, hold(1, 1), 1, async {})
                .await
                .unwrap()
                .accepted
        );
        assert!(
            client
                .rmw("n", 5, hold(1, 1), 2, async {})
                .await
                .unwrap()
                .accepted
        );
        assert!(
            !client
                .rmw("n", 5, hold(2, 1), 3, async {})
                .await
                .unwrap()
                .accepted
        );
        assert!(
            !client
                .rmw("n", 5, hold(1, 2), 3, async {})
                .await
                .unwrap()
                .accepted
        );
        assert_eq!(server.snapshot().sets["n"], BTreeSet::from([1, 2]));
    }

    #[tokio::test]
    async fn the_shadow_accepts_stale_writes_and_loses_the_update() {
        let server = RegisterServer::start(RegisterKind::Shadow).await.unwrap();
        let mut a = RegisterClient::connect(server.addr()).await.unwrap();
        let mut b = RegisterClient::connect(server.addr()).await.unwrap();
        let read = a.read("n").await.unwrap();
        assert!(
            b.rmw("n", 2, hold(2, 1), 20, async {})
                .await
                .unwrap()
                .accepted
        );
        assert!(a.write("n", 1, hold(1, 1), &read.set, 10).await.unwrap());
        // b's acknowledged 20 is gone: the lost update fencing prevents.
        assert_eq!(server.snapshot().sets["n"], BTreeSet::from([10]));
    }

    #[tokio::test]
    async fn a_bad_request_gets_an_error_and_the_connection_lives_on() {
        let server = RegisterServer::start(RegisterKind::Fenced).await.unwrap();
        let mut client = RegisterClient::connect(server.addr()).await.unwrap();
        client
            .stream
            .get_mut()
            .write_all(b"{\"op\":\"nope\"}\n")
            .await
            .unwrap();
        let mut line = String::new();
        client.stream.read_line(&mut line).await.unwrap();
        assert!(line.contains(r#""reply":"error""#), "{line}");
        assert_eq!(client.read("n").await.unwrap(), RegisterValue::default());
    }
}
