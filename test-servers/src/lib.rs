//! Real lock servers for dlock's tests: start them fresh, kill them, restart them, freeze them, cut them off.
//!
//! Every backend is tested against its real server, and the safety promises are about failures, so the tests
//! own their servers. This crate starts each server as a **child process** of the test, on a **free loopback
//! port**, in its **own temporary directory**, from the Debian packages that `scripts/install-servers` installs
//! (no Docker, no system-wide service: the machine's own Redis/Postgres/MariaDB on their default ports are never
//! touched).
//!
//! # What it starts
//!
//! | handle | what | client address | start, measured on 2 cores |
//! |---|---|---|---|
//! | [`RedisServer`] | one Redis node | [`url`](RedisServer::url) `redis://127.0.0.1:P` | 0.02–0.05 s |
//! | [`RedisNodes`] | `n` independent nodes (Redlock) | [`urls`](RedisNodes::urls) | 0.06 s for 5 |
//! | [`RedisSentinel`] | primary, replica, 3 Sentinels | [`sentinel_urls`](RedisSentinel::sentinel_urls), [`master_name`](RedisSentinel::master_name) | 2.1 s (replica sync, Sentinel discovery) |
//! | [`RedisCluster`] | 3 primaries (+ replicas) | [`urls`](RedisCluster::urls) | 2.1 s, 6 nodes (3 replicas) |
//! | [`MariaDb`] | private instance, database `test` | [`url`](MariaDb::url) `mysql://root@127.0.0.1:P/test` | 0.8 s (0.65 s of it `mariadb-install-db`) |
//! | [`Postgres`] | private instance | [`url`](Postgres::url) `postgres://postgres@127.0.0.1:P/postgres` | 0.75 s (0.65 s of it `initdb`) |
//! | [`PgBouncer`] | a pooler in front of a [`Postgres`], in [`PoolMode::Session`] or [`PoolMode::Transaction`] | [`url`](PgBouncer::url) `postgres://postgres@127.0.0.1:P/postgres` | 0.02 s |
//! | [`Etcd`] / [`EtcdCluster`] | one member / three members | [`url`](Etcd::url) `http://127.0.0.1:P`, [`endpoints`](EtcdCluster::endpoints) | 0.15–0.3 s / 0.5–2.3 s |
//! | [`ZooKeeper`] / [`ZooKeeperEnsemble`] | standalone / three nodes | [`connect_string`](ZooKeeper::connect_string) `127.0.0.1:P` | 0.3–0.5 s / 1.1–1.8 s (JVM) |
//!
//! `start()` returns once the server answers **its own protocol** (Redis `PING`, `pg_isready`, `select 1`,
//! etcd `/health`, ZooKeeper `srvr`), within a bound (30 s; 60–90 s for Postgres, MariaDB, ZooKeeper). Each
//! start prints its time to stderr (`dlock-test-servers: redis ready on 127.0.0.1:41234 in 51ms`), and
//! `started_in()` returns it.
//!
//! # Controlling a server
//!
//! Every single-process handle (including each node of a topology: [`RedisNodes::node`],
//! [`RedisSentinel::primary`], [`EtcdCluster::member`], [`ZooKeeperEnsemble::node`], …) has the same methods, all
//! taking `&self`, all synchronous:
//!
//! - `kill()`: SIGKILL to the server's process group, a crash; `stop()`: a clean shutdown;
//! - `restart()`: stop if running, start again on the **same port and directory**, wait until ready (what
//!   survives is the server's business: Redis runs without persistence, so it comes back empty; the others keep
//!   their data on disk);
//! - `pause()` / `resume()`: SIGSTOP / SIGCONT to the process group (Postgres backends freeze too);
//! - `pid()`, `is_running()`, `is_paused()`, `started_in()`, `dir()`, `log_path()`, `log_tail(n)`,
//!   `command_line()`.
//!
//! **Dropping a handle** kills the process and removes its directory. There are **no orphans**, even when a test
//! panics or the test process is killed: all children are spawned from one long-lived thread with
//! `PR_SET_PDEATHSIG = SIGKILL`, and an exit handler kills what `static`s still hold and removes their
//! directories. (Directories of a process killed outright are swept by the next test process.)
//!
//! # Sharing
//!
//! Server control is synchronous (`std::process`) and the proxy runs on its own threads, so all of this works
//! from any tokio runtime flavor or a plain thread. Tests that do **not** harm a server may share one instance
//! per test binary: [`shared_redis`], [`shared_mariadb`], [`shared_postgres`], [`shared_etcd`],
//! [`shared_zookeeper`] start it on first use. Such tests must keep to their own keys/lock names (never
//! `FLUSHALL`). A test that kills, pauses, restarts or partitions a server **starts its own**.
//!
//! # Faults on the network
//!
//! [`FaultProxy`] sits between a client and a server on loopback. Point the client at
//! [`FaultProxy::addr`] and switch [`ProxyMode`] while connections are open: pass-through, added latency,
//! blackhole (a partition), dropped replies, held replies (released with [`FaultProxy::release_held`]),
//! refused connections (a server down or restarting, counted by [`FaultProxy::refused`]); or
//! [`FaultProxy::reset`] every connection; then [`FaultProxy::heal`].
//!
//! ```no_run
//! use dlock_test_servers::{FaultProxy, ProxyMode, RedisServer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let redis = RedisServer::start()?; // our own: this test harms it
//! let proxy = FaultProxy::start(redis.addr())?;
//! let url = format!("redis://{}", proxy.addr()); // the client under test connects here
//! # let _ = url;
//! proxy.set_mode(ProxyMode::Blackhole); // the client is cut off
//! // ... assert what the client does when its server is unreachable ...
//! proxy.heal();
//! redis.pause(); // a frozen server
//! redis.resume();
//! redis.kill(); // a crash
//! redis.restart()?; // same port, empty (Redis runs without persistence)
//! # Ok(()) }
//! ```
//!
//! # When a server is missing or does not start
//!
//! Nothing is skipped silently. A missing binary gives [`ServerError::NotInstalled`], whose message ends with
//! "run scripts/install-servers"; a server that exits or does not answer in time gives
//! [`ServerError::StartFailed`] with the command line and the last lines of the server's log. The `shared_*`
//! functions panic with that message.
//!
//! # External servers
//!
//! The backend test harnesses (not this crate) first look at `DLOCK_TEST_<BACKEND>_URL`, e.g.
//! `DLOCK_TEST_REDIS_URL=redis://…`, to run against an external deployment instead of starting one here; fault
//! tests need a server started here.
//!
//! # Small tools
//!
//! Handles carry small clients so tests need no driver crate to set up or inspect a server:
//! [`RedisServer::command`] (and [`redis_command`], [`Resp`]), [`Postgres::query`] (`psql`),
//! [`MariaDb::query`] (`mariadb`), [`Etcd::etcdctl`], [`ZooKeeper::four_letter`]. [`free_port`] finds a free
//! loopback port.
// Bad input must never panic: arithmetic on instants, durations and counters is checked or
// saturating, so a server that misbehaves shows as its error, not as an overflow here.
#![warn(clippy::arithmetic_side_effects)]

mod control;
mod error;
mod etcd;
mod mariadb;
mod pgbouncer;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis;
mod resp;
mod shared;
mod tls;
mod zookeeper;

pub use control::ServerProcess;
pub use error::{INSTALL_HINT, Result, ServerError};
pub use etcd::{Etcd, EtcdCluster};
pub use mariadb::MariaDb;
pub use pgbouncer::{PgBouncer, PoolMode};
pub use ports::free_port;
pub use postgres::Postgres;
pub use proxy::{FaultProxy, ProxyMode};
pub use redis::{
    RedisCluster, RedisNodes, RedisSentinel, RedisServer, SENTINEL_MASTER_NAME,
    subscribed_client_ids,
};
pub use resp::{Resp, encode_command, read_reply, redis_command};
pub use shared::{shared_etcd, shared_mariadb, shared_postgres, shared_redis, shared_zookeeper};
pub use zookeeper::{
    ZOOKEEPER_MAX_SESSION_TIMEOUT, ZOOKEEPER_MIN_SESSION_TIMEOUT, ZOOKEEPER_TICK, ZooKeeper,
    ZooKeeperEnsemble, zookeeper_four_letter,
};
