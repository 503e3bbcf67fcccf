//! Each backend's readings for [`Census`](super::Census), with its driver alone.

use std::time::Duration;

use dlock_api::{LockError, Result};

#[cfg(any(feature = "postgres", feature = "mysql", feature = "etcd"))]
use super::Requests;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd"
))]
use super::Stored;

/// `future` within `within`, its error as the backend's unavailability.
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
async fn bounded<T, E: std::error::Error + Send + Sync + 'static>(
    backend: &'static str,
    within: Duration,
    future: impl Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    tokio::time::timeout(within, future)
        .await
        .map_err(|_| LockError::command_timeout(backend, within))?
        .map_err(|e| LockError::unavailable(backend, e))
}

/// The number after `field` in a `field<sep>value` line of `text`.
#[cfg(any(feature = "redis", feature = "zookeeper"))]
fn field_value(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.trim().strip_prefix(field))
        .and_then(|rest| rest.trim_start_matches([':', ' ']).trim().parse().ok())
}

/// A field of the INFO section that holds it, on the primary.
#[cfg(feature = "redis")]
pub(super) async fn redis_info(
    config: &dlock_redis::RedisConfig,
    field: &str,
) -> Result<(u64, redis::aio::MultiplexedConnection)> {
    let node = dlock_redis::driver::primary(config).await?;
    let client = dlock_redis::driver::node_client(config, &node)?;
    let within = config.connect_timeout;
    let mut conn = bounded("redis", within, client.get_multiplexed_async_connection()).await?;
    let info: String = bounded(
        "redis",
        within,
        redis::cmd("INFO").arg("everything").query_async(&mut conn),
    )
    .await?;
    let value = field_value(&info, field)
        .ok_or_else(|| LockError::unexpected("redis", format!("INFO without {field}")))?;
    Ok((value, conn))
}

#[cfg(feature = "redis")]
pub(super) async fn redis_stored(config: &dlock_redis::RedisConfig) -> Result<Stored> {
    let (bytes, mut conn) = redis_info(config, "used_memory").await?;
    let keys: u64 = bounded(
        "redis",
        config.connect_timeout,
        redis::cmd("DBSIZE").query_async(&mut conn),
    )
    .await?;
    // `db0:keys=K,expires=E,avg_ttl=T`: the keys of every database, and those with an expiry.
    let keyspace: String = bounded(
        "redis",
        config.connect_timeout,
        redis::cmd("INFO").arg("keyspace").query_async(&mut conn),
    )
    .await?;
    let expiring: u64 = keyspace
        .lines()
        .filter_map(|line| {
            line.split("expires=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    Ok(Stored {
        items: keys,
        bytes: Some(bytes),
        unexpiring: Some(keys.saturating_sub(expiring)),
    })
}

#[cfg(feature = "postgres")]
async fn postgres_conn(config: &dlock_postgres::PostgresConfig) -> Result<sqlx::PgConnection> {
    use sqlx::Connection;
    let options = config.connect_options()?;
    bounded(
        "postgres",
        config.connect_timeout,
        sqlx::PgConnection::connect_with(&options),
    )
    .await
}

#[cfg(feature = "postgres")]
pub(super) async fn postgres_transactions(
    config: &dlock_postgres::PostgresConfig,
) -> Result<Requests> {
    let mut conn = postgres_conn(config).await?;
    let count: i64 = bounded(
        "postgres",
        config.connect_timeout,
        sqlx::query_scalar(
            "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&mut conn),
    )
    .await?;
    Ok(Requests(u64::try_from(count).unwrap_or(0)))
}

/// Every row of every user table (counted exactly, not estimated), and the advisory locks held.
#[cfg(feature = "postgres")]
pub(super) async fn postgres_stored(config: &dlock_postgres::PostgresConfig) -> Result<Stored> {
    let mut conn = postgres_conn(config).await?;
    let (items, bytes): (i64, i64) = bounded(
        "postgres",
        config.connect_timeout,
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory') \
             + COALESCE((SELECT sum((xpath('/row/c/text()', query_to_xml(format( \
                 'SELECT count(*) AS c FROM %I.%I', schemaname, tablename), false, true, '')) \
               )[1]::text::int8) FROM pg_tables \
               WHERE schemaname NOT IN ('pg_catalog', 'information_schema')), 0)::int8, \
             pg_database_size(current_database())::int8",
        )
        .fetch_one(&mut conn),
    )
    .await?;
    Ok(Stored {
        items: u64::try_from(items).unwrap_or(0),
        bytes: u64::try_from(bytes).ok(),
        unexpiring: None,
    })
}

#[cfg(feature = "mysql")]
async fn mysql_conn(config: &dlock_mysql::MySqlConfig) -> Result<sqlx::MySqlConnection> {
    use sqlx::Connection;
    let options = config.connect_options()?;
    bounded(
        "mysql",
        config.connect_timeout,
        sqlx::MySqlConnection::connect_with(&options),
    )
    .await
}

#[cfg(feature = "mysql")]
pub(super) async fn mysql_questions(config: &dlock_mysql::MySqlConfig) -> Result<Requests> {
    let mut conn = mysql_conn(config).await?;
    let (_, value): (String, String) = bounded(
        "mysql",
        config.connect_timeout,
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'").fetch_one(&mut conn),
    )
    .await?;
    value
        .parse()
        .map(Requests)
        .map_err(|_| LockError::unexpected("mysql", format!("Questions = {value}")))
}

/// The rows of dlock's fencing table and its elections' table, each counted if it exists.
#[cfg(feature = "mysql")]
pub(super) async fn mysql_stored(config: &dlock_mysql::MySqlConfig) -> Result<Stored> {
    let mut conn = mysql_conn(config).await?;
    let mut items = 0u64;
    for table in [config.table.clone(), format!("{}_leaders", config.table)] {
        let quoted = table
            .split('.')
            .map(|part| format!("`{part}`"))
            .collect::<Vec<_>>()
            .join(".");
        let counted = tokio::time::timeout(
            config.connect_timeout,
            sqlx::query_scalar::<_, i64>(&format!("SELECT COUNT(*) FROM {quoted}"))
                .fetch_one(&mut conn),
        )
        .await
        .map_err(|_| LockError::command_timeout("mysql", config.connect_timeout))?;
        // A table dlock never created (no fencing, no elections) holds nothing.
        if let Ok(rows) = counted {
            items = items.saturating_add(u64::try_from(rows).unwrap_or(0));
        }
    }
    Ok(Stored {
        items,
        ..Stored::default()
    })
}

/// The first endpoint's `host:port`.
#[cfg(feature = "etcd")]
fn etcd_authority(config: &dlock_etcd::EtcdConfig) -> Result<String> {
    let first = config
        .endpoint_urls()
        .into_iter()
        .next()
        .unwrap_or_default();
    let authority = first
        .strip_prefix("http://")
        .ok_or_else(|| LockError::unexpected("etcd", "metrics are read over plain HTTP only"))?;
    Ok(authority.trim_end_matches('/').to_owned())
}

/// The sum of every `grpc_server_msg_received_total` series on the first endpoint's
/// `/metrics`: unary requests and stream messages (a lease keep-alive is one) alike.
#[cfg(feature = "etcd")]
pub(super) async fn etcd_messages(config: &dlock_etcd::EtcdConfig) -> Result<Requests> {
    let authority = etcd_authority(config)?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    let page = exchange("etcd", &authority, &request, config.connect_timeout).await?;
    let total: f64 = page
        .lines()
        .filter(|line| line.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok(Requests(total as u64))
}

#[cfg(feature = "etcd")]
pub(super) async fn etcd_stored(config: &dlock_etcd::EtcdConfig) -> Result<Stored> {
    let options = config.connect_options()?;
    let within = config.connect_timeout;
    let fail = |e| LockError::unavailable("etcd", e);
    let mut client = tokio::time::timeout(
        within,
        etcd_client::Client::connect(config.endpoint_urls(), Some(options)),
    )
    .await
    .map_err(|_| LockError::command_timeout("etcd", within))?
    .map_err(fail)?;
    let counting = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let answer = tokio::time::timeout(within, client.get(config.prefix.as_bytes(), Some(counting)))
        .await
        .map_err(|_| LockError::command_timeout("etcd", within))?
        .map_err(fail)?;
    Ok(Stored {
        items: u64::try_from(answer.count()).unwrap_or(0),
        ..Stored::default()
    })
}

/// The number on the `field` line of the first server's `srvr` answer (the four-letter word
/// ZooKeeper allows by default).
#[cfg(feature = "zookeeper")]
pub(super) async fn zookeeper_srvr(config: &dlock_zookeeper::ZkConfig, field: &str) -> Result<u64> {
    let host = config.hosts.first().cloned().unwrap_or_default();
    let answer = exchange("zookeeper", &host, "srvr", config.connect_timeout).await?;
    field_value(&answer, field)
        .ok_or_else(|| LockError::unexpected("zookeeper", format!("srvr without {field}")))
}

/// Sends `request` to `authority` over a new TCP connection and reads the answer to its end.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
async fn exchange(
    backend: &'static str,
    authority: &str,
    request: &str,
    within: Duration,
) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let talk = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(within, talk)
        .await
        .map_err(|_| LockError::command_timeout(backend, within))?
        .map_err(|e| LockError::unavailable(backend, e))?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}
