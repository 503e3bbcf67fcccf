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
    dlock_api::raw::floor::sample(duration, pair).await
}

const DELETE_AND_PUBLISH: &str = r"
redis.call('DEL', KEYS[1])
return redis.call('PUBLISH', ARGV[1], 'released')
";

/// Measures the raw floor of a notified hand-off: one connection holds `key`, another is
/// subscribed to a channel; the holder deletes the key and publishes in one script, and the
/// subscriber, on the message, takes the key with `SET NX PX`. Each sample runs from the release
/// being issued to the subscriber's `SET` being answered, the same span `dlock bench` measures.
///
/// # Errors
/// As [`raw_floor`].
pub async fn raw_handoff_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let config = RedisConfig::from_url(url)?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<redis::PushInfo>();
    let holder = Conn::connect(&config, std::sync::Arc::new(|_| {})).await?;
    let waiter = Conn::connect(
        &config,
        std::sync::Arc::new(move |info: redis::PushInfo| {
            let _ = tx.send(info);
        }),
    )
    .await?;
    let key = format!(
        "{}:{{dlock-bench-handoff/{}}}",
        config.prefix,
        std::process::id()
    );
    let channel = format!("{key}:released");
    let timeout = config.command_timeout;
    waiter.subscribe(timeout, &channel).await?;
    let release = Script::new(DELETE_AND_PUBLISH);
    let set_nx = |owner: &str| {
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(owner).arg("NX").arg("PX").arg(30_000);
        set
    };
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut warm_up = 50;
    while started.elapsed() < duration || warm_up > 0 {
        let _: Option<String> = holder.query(timeout, &set_nx("holder")).await?;
        let t = Instant::now();
        let _: i64 = holder
            .run_script(timeout, &release, &[&key], &[&channel])
            .await?;
        loop {
            let info = rx
                .recv()
                .await
                .ok_or_else(|| crate::error::timed_out(timeout))?;
            if info.kind == redis::PushKind::Message {
                break;
            }
        }
        let taken: Option<String> = waiter.query(timeout, &set_nx("waiter")).await?;
        let elapsed = t.elapsed();
        if taken.is_none() {
            return Err(dlock_api::LockError::backend(
                crate::BACKEND,
                "hand-off floor: the waiter's SET NX failed",
            ));
        }
        let mut del = redis::cmd("DEL");
        del.arg(&key);
        let _: i64 = waiter.query(timeout, &del).await?;
        if warm_up > 0 {
            warm_up -= 1;
        } else {
            samples.push(elapsed);
        }
    }
    Ok(samples)
}
