//! One lazily started server of each kind per test binary, for tests that do not harm it.

use std::sync::OnceLock;

use crate::error::Result;
use crate::{Etcd, MariaDb, Postgres, RedisServer, ZooKeeper};

/// Starts the server on first use; later calls (from any thread or runtime) get the same one. A failed start is
/// remembered, so every test that needs the server fails at once with the same message.
fn shared<T>(
    cell: &'static OnceLock<std::result::Result<T, String>>,
    start: fn() -> Result<T>,
) -> &'static T {
    match cell.get_or_init(|| start().map_err(|e| e.to_string())) {
        Ok(server) => server,
        Err(message) => panic!("{message}"),
    }
}

macro_rules! shared_fn {
    ($(#[$doc:meta])* $name:ident, $ty:ty) => {
        $(#[$doc])*
        ///
        /// Started on first use and shared by every test of this test binary; it lives until the process exits
        /// (an exit handler stops it and removes its directory). Only for tests that do not kill, pause,
        /// restart or reconfigure it, and that keep to their own keys or names: start your own instance for
        /// anything else.
        ///
        /// # Panics
        /// When the server cannot be started, with the [`ServerError`](crate::ServerError) message (which says
        /// to run `scripts/install-servers` when it is not installed).
        pub fn $name() -> &'static $ty {
            static CELL: OnceLock<std::result::Result<$ty, String>> = OnceLock::new();
            shared(&CELL, <$ty>::start)
        }
    };
}

shared_fn!(
    /// A shared single Redis node ([`RedisServer::start`]).
    shared_redis,
    RedisServer
);
shared_fn!(
    /// A shared MariaDB instance ([`MariaDb::start`]).
    shared_mariadb,
    MariaDb
);
shared_fn!(
    /// A shared Postgres instance ([`Postgres::start`]).
    shared_postgres,
    Postgres
);
shared_fn!(
    /// A shared single-member etcd ([`Etcd::start`]).
    shared_etcd,
    Etcd
);
shared_fn!(
    /// A shared standalone ZooKeeper ([`ZooKeeper::start`]).
    shared_zookeeper,
    ZooKeeper
);
