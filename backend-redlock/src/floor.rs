//! The raw protocol floor for `dlock bench`: what one Redlock acquire and release cost with the
//! driver alone, measured in the same run as dlock.

use std::time::Duration;

use dlock_api::{LockError, Result};
use futures::future::{join_all, try_join_all};
use redis::Script;
use redis::aio::MultiplexedConnection;

use crate::BACKEND;
use crate::config::RedlockConfig;

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

fn unavailable(error: redis::RedisError) -> LockError {
    LockError::unavailable(BACKEND, error)
}

/// Measures lock pairs for `duration` on the nodes `url` names: `SET key token NX PX 30000` on
/// every node in parallel, then an `EVALSHA` compare-and-delete on every node in parallel, with
/// the `redis` crate on one multiplexed connection per node, back to back after a short warm-up.
/// Returns each pair's latency: the least a Redlock pair can cost (two parallel round trips),
/// with none of dlock's work (fencing counter, validity, guard, watchdog).
///
/// # Errors
/// [`LockError::Config`] for a bad URL; [`LockError::Unavailable`] if a node fails.
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most one key per node, which ends with its TTL.
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = RedlockConfig::from_url(url)?;
    let conns: Vec<MultiplexedConnection> = try_join_all((0..config.nodes.len()).map(|i| {
        let node = config.node_config(i);
        async move {
            let scheme = if node.tls { "rediss" } else { "redis" };
            let auth = match (&node.username, &node.password) {
                (None, None) => String::new(),
                (user, password) => format!(
                    "{}:{}@",
                    user.as_deref().unwrap_or(""),
                    password.as_ref().map_or("", |p| p.expose())
                ),
            };
            let client = redis::Client::open(format!("{scheme}://{auth}{node}/{}", node.database))
                .map_err(|e| dlock_api::raw::config::config_error(BACKEND, e.to_string()))?;
            tokio::time::timeout(
                node.connect_timeout,
                client.get_multiplexed_async_connection(),
            )
            .await
            .map_err(|_| LockError::command_timeout(BACKEND, node.connect_timeout))?
            .map_err(unavailable)
        }
    }))
    .await?;
    let script = Script::new(COMPARE_AND_DELETE);
    let key = format!(
        "{}:{{dlock-bench-floor/{}}}",
        config.prefix,
        std::process::id()
    );
    let pair = || async {
        let token = format!("{:032x}", rand::random::<u128>());
        let sets = join_all(conns.iter().map(|conn| {
            let mut conn = conn.clone();
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&token).arg("NX").arg("PX").arg(30_000);
            async move { set.query_async::<Option<String>>(&mut conn).await }
        }))
        .await;
        let deletes = join_all(conns.iter().map(|conn| {
            let mut conn = conn.clone();
            let mut invocation = script.key(&key);
            invocation.arg(&token);
            async move { invocation.invoke_async::<i64>(&mut conn).await }
        }))
        .await;
        for result in sets {
            result.map_err(unavailable)?;
        }
        for result in deletes {
            result.map_err(unavailable)?;
        }
        Ok::<(), LockError>(())
    };
    dlock_api::raw::floor::sample(duration, pair).await
}
