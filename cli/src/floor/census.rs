//! What the server says of the work a bench gave it, for `dlock bench --scale`: a counter of the
//! requests it served (read before and after a phase, the difference divided by the work), and
//! what it stores (keys, rows, nodes, bytes), read before and after many names were used.
//!
//! Each reading goes to the server with the backend's driver alone, on a connection of its own,
//! so it counts nothing of dlock's: the one request a reading costs is in the next difference.

use dlock::BackendScheme;
use dlock_api::Result;

/// One reading of a server's request counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Requests(pub(crate) u64);

/// What the server stores, at one reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    /// Keys, rows or nodes (what [`Census::stored_what`] says).
    pub(crate) items: u64,
    /// Bytes, where the server says.
    pub(crate) bytes: Option<u64>,
    /// Of the items, those the server will never drop by itself (no expiry), where items can
    /// expire and the server says how many do.
    pub(crate) unexpiring: Option<u64>,
}

/// The readings one backend's server gives.
#[derive(Debug)]
pub(crate) enum Census {
    #[cfg(feature = "redis")]
    Redis(dlock_redis::RedisConfig),
    #[cfg(feature = "postgres")]
    Postgres(dlock_postgres::PostgresConfig),
    #[cfg(feature = "mysql")]
    MySql(dlock_mysql::MySqlConfig),
    #[cfg(feature = "etcd")]
    Etcd(dlock_etcd::EtcdConfig),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(dlock_zookeeper::ZkConfig),
}

impl Census {
    /// The census of the server `url` names; `None` for a backend that has none (memory,
    /// Redlock's several nodes).
    ///
    /// # Errors
    /// [`dlock_api::LockError::Config`] for a URL the backend refuses.
    pub(crate) fn for_url(url: &str) -> Result<Option<Self>> {
        let backend = BackendScheme::parse(url)?;
        Ok(match backend.name() {
            #[cfg(feature = "redis")]
            "redis" => Some(Self::Redis(dlock_redis::RedisConfig::from_url(url)?)),
            #[cfg(feature = "postgres")]
            "postgres" => Some(Self::Postgres(dlock_postgres::PostgresConfig::from_url(
                url,
            )?)),
            #[cfg(feature = "mysql")]
            "mysql" => Some(Self::MySql(dlock_mysql::MySqlConfig::from_url(url)?)),
            #[cfg(feature = "etcd")]
            "etcd" => Some(Self::Etcd(dlock_etcd::EtcdConfig::from_url(url)?)),
            #[cfg(feature = "zookeeper")]
            "zookeeper" => Some(Self::ZooKeeper(dlock_zookeeper::ZkConfig::from_url(url)?)),
            _ => None,
        })
    }

    /// What the request counter counts.
    pub(crate) fn requests_what(&self) -> &'static str {
        match *self {
            #[cfg(feature = "redis")]
            Self::Redis(_) => {
                "commands (INFO total_commands_processed: each script's inner commands too)"
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "transactions (pg_stat_database, flushed within a second)",
            #[cfg(feature = "mysql")]
            Self::MySql(_) => "statements (global status Questions)",
            #[cfg(feature = "etcd")]
            Self::Etcd(_) => "gRPC messages received (/metrics)",
            #[cfg(feature = "zookeeper")]
            Self::ZooKeeper(_) => "packets received (srvr)",
        }
    }

    /// What the stored count counts.
    pub(crate) fn stored_what(&self) -> &'static str {
        match *self {
            #[cfg(feature = "redis")]
            Self::Redis(_) => {
                "keys (DBSIZE; INFO keyspace: those without expiry), bytes (INFO used_memory)"
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(_) => "rows in user tables + advisory locks held",
            #[cfg(feature = "mysql")]
            Self::MySql(_) => "rows in dlock's tables",
            #[cfg(feature = "etcd")]
            Self::Etcd(_) => "keys under the prefix",
            #[cfg(feature = "zookeeper")]
            Self::ZooKeeper(_) => "znodes (srvr Node count)",
        }
    }

    /// The server's request counter now.
    ///
    /// # Errors
    /// The server could not be reached or answered something else.
    ///
    /// # Cancel safety
    /// Cancel safe: a reading changes nothing on the server.
    pub(crate) async fn requests(&self) -> Result<Requests> {
        match *self {
            #[cfg(feature = "redis")]
            Self::Redis(ref config) => backends::redis_info(config, "total_commands_processed")
                .await
                .map(|(n, _)| Requests(n)),
            #[cfg(feature = "postgres")]
            Self::Postgres(ref config) => backends::postgres_transactions(config).await,
            #[cfg(feature = "mysql")]
            Self::MySql(ref config) => backends::mysql_questions(config).await,
            #[cfg(feature = "etcd")]
            Self::Etcd(ref config) => backends::etcd_messages(config).await,
            #[cfg(feature = "zookeeper")]
            Self::ZooKeeper(ref config) => backends::zookeeper_srvr(config, "Received:")
                .await
                .map(Requests),
        }
    }

    /// What the server stores now.
    ///
    /// # Errors
    /// The server could not be reached or answered something else.
    ///
    /// # Cancel safety
    /// Cancel safe: a reading changes nothing on the server.
    pub(crate) async fn stored(&self) -> Result<Stored> {
        match *self {
            #[cfg(feature = "redis")]
            Self::Redis(ref config) => backends::redis_stored(config).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(ref config) => backends::postgres_stored(config).await,
            #[cfg(feature = "mysql")]
            Self::MySql(ref config) => backends::mysql_stored(config).await,
            #[cfg(feature = "etcd")]
            Self::Etcd(ref config) => backends::etcd_stored(config).await,
            #[cfg(feature = "zookeeper")]
            Self::ZooKeeper(ref config) => Ok(Stored {
                items: backends::zookeeper_srvr(config, "Node count:").await?,
                ..Stored::default()
            }),
        }
    }
}

#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper"
))]
mod backends;
