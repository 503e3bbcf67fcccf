//! The raw protocol floor that `dlock bench` compares the backend against.

use std::time::{Duration, Instant};

use dlock_api::Result;
use redis::Script;

use crate::config::RedisConfig;
use crate::conn::Conn;

const COMPARE_AND_DELETE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// Measures the raw floor of a lock pair on this deployment: `SET key token NX PX 30000`, then an
/// `EVALSHA` compare-and-delete, issued directly with the `redis` crate on one connection, back to
/// back for `duration` after a short warm-up. Returns each pair's latency.
///
/// This is the least any Redis lock can cost (two round trips), with none of dlock's work
/// (fencing counter, guard, watchdog); `dlock bench` prints it beside dlock's own figures.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL;
/// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) if the server fails.
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = RedisConfig::from_url(url)?;
    let conn = Conn::connect(&config, std::sync::Arc::new(|_| {})).await?;
    let script = Script::new(COMPARE_AND_DELETE);
    let key = format!(
        "{}:{{dlock-bench-floor/{}}}",
        config.prefix,
        std::process::id()
    );
    let timeout = config.command_timeout;
    let pair = || async {
        let token = format!("{:032x}", rand::random::<u128>());
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&token).arg("NX").arg("PX").arg(30_000);
        let _: Option<String> = conn.query(timeout, &set).await?;
        let _: i64 = conn
            .run_script(timeout, &script, &[&key], &[&token])
            .await?;
        Ok::<(), dlock_api::LockError>(())
    };
    for _ in 0..50 {
        pair().await?;
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        pair().await?;
        samples.push(t.elapsed());
    }
    Ok(samples)
}
