//! Every connection a lock or a node makes: connected as the configuration says, then checked
//! before the first lock is taken on it.

use dlock_api::{LockError, Result};

use crate::BACKEND;
use crate::config::{RedisConfig, Topology};
use crate::conn::Conn;
use crate::driven::PushHandler;
use crate::eviction::{self, MemorySettings};

/// Connects as `config` says, refuses a Cluster node named as a single server, and judges
/// whether the server (in a Cluster, every primary) may evict lock keys, acting on
/// `config.eviction_check`.
pub(crate) async fn connect_checked(config: &RedisConfig, push: PushHandler) -> Result<Conn> {
    let conn = Conn::connect(config, push).await?;
    if let Topology::Single { node } = &config.topology {
        refuse_cluster_node(&conn, node, config.command_timeout).await?;
    }
    let query = eviction::settings_query();
    let asked = conn.query_every_primary::<MemorySettings>(config.command_timeout, &query);
    eviction::judge(config.eviction_check, asked).await?;
    Ok(conn)
}

/// A `redis://` URL naming one node of a Redis Cluster would work for the names whose slot that
/// node serves and fail with `MOVED` for the others: refused at connect instead.
async fn refuse_cluster_node(conn: &Conn, node: &str, timeout: std::time::Duration) -> Result<()> {
    // A server that denies INFO cannot be judged; its first MOVED will say it.
    let Some(info) = conn.info(timeout, "cluster").await? else {
        return Ok(());
    };
    if info.lines().any(|line| line.trim() == "cluster_enabled:1") {
        return Err(LockError::Config {
            backend: BACKEND,
            reason: format!(
                "{node} is a Redis Cluster node: connect with redis+cluster:// (or \
                 rediss+cluster://), which follows the cluster's slots"
            ),
        });
    }
    Ok(())
}
