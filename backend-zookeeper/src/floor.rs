//! The raw protocol floors for `dlock bench`: what the same acquire, release and hand-off cost
//! with the client library alone, measured in the same run as dlock.

use std::time::Duration;

use dlock_api::{LockError, Result};
use tokio::time::Instant;
use zookeeper_client::{Client, CreateMode};

use crate::ZkLock;
use crate::error::map_err;

/// The container node a floor works under, and an open session of the client library.
async fn prepare(url: &str, what: &str) -> Result<(ZkLock, Client, String)> {
    let locks = ZkLock::connect_url(url).await?;
    let client = locks.inner.session().await?.client()?;
    let dir = format!(
        "{}/dlock-bench-{what}-{}",
        locks.config().prefix,
        std::process::id()
    );
    make_dir(&locks, &client, &dir).await?;
    Ok((locks, client, dir))
}

async fn make_dir(locks: &ZkLock, client: &Client, dir: &str) -> Result<()> {
    client
        .mkdir(dir, &CreateMode::Container.with_acls(locks.inner.acls()))
        .await
        .map_err(map_err)
}

/// Creates an ephemeral sequential node `prefix<seq>` in `dir`, making `dir` again if the
/// server removed it (an empty container goes at the server's next check, which may fall
/// between two pairs, as it may between two of dlock's acquires).
async fn create(locks: &ZkLock, client: &Client, dir: &str, prefix: &str) -> Result<String> {
    let options = CreateMode::EphemeralSequential.with_acls(locks.inner.acls());
    loop {
        match client.create(prefix, &[], &options).await {
            Ok((_, sequence)) => return Ok(format!("{prefix}{sequence}")),
            Err(zookeeper_client::Error::NoNode) => make_dir(locks, client, dir).await?,
            Err(error) => return Err(map_err(error)),
        }
    }
}

/// Measures create + delete pairs for `duration`: an ephemeral sequential node created under
/// one node and deleted again, awaited one after the other (one write each, as dlock's
/// uncontended acquire and release). Returns one sample per pair, after a short warm-up.
///
/// # Errors
/// [`LockError::Config`] for a bad URL; [`LockError::Unavailable`] when the ensemble does not
/// answer.
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most one ephemeral node, which goes with its session.
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let (locks, client, dir) = prepare(url, "floor").await?;
    let prefix = format!("{dir}/n-");
    let pair = async || -> Result<()> {
        let node = create(&locks, &client, &dir, &prefix).await?;
        client.delete(&node, Some(0)).await.map_err(map_err)
    };
    dlock_api::raw::floor::sample(duration, pair).await
}

/// Measures the predecessor-watch hand-off for `duration`: a holder's node and a waiter's node
/// behind it, the waiter's exists-watch on the holder's node; one sample is the time from the
/// holder sending its delete to the waiter's listing (the check that it is first) answered. The
/// two sides are two sessions. Returns one sample per hand-off, after a short warm-up.
///
/// # Errors
/// As [`raw_floor`].
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most two ephemeral nodes, which go with their sessions.
pub async fn raw_handoff_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let (locks, holder, dir) = prepare(url, "handoff").await?;
    let other = ZkLock::connect_url(url).await?;
    let waiter = other.inner.session().await?.client()?;
    let prefix = format!("{dir}/n-");
    let unexpected = |what: &str| LockError::unexpected(crate::BACKEND, what.to_owned());
    let handoff = async || -> Result<Duration> {
        let first = create(&locks, &holder, &dir, &prefix).await?;
        let second = create(&locks, &waiter, &dir, &prefix).await?;
        let (stat, watch) = waiter.check_and_watch_stat(&first).await.map_err(map_err)?;
        if stat.is_none() {
            return Err(unexpected("the holder's node went early"));
        }
        let released = Instant::now();
        holder.delete(&first, Some(0)).await.map_err(map_err)?;
        watch.changed().await;
        let children = waiter.list_children(&dir).await.map_err(map_err)?;
        let took = released.elapsed();
        if children.len() != 1 {
            return Err(unexpected("the waiter is not first after the hand-off"));
        }
        waiter.delete(&second, Some(0)).await.map_err(map_err)?;
        Ok(took)
    };
    for _ in 0..20 {
        handoff().await?;
    }
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        samples.push(handoff().await?);
    }
    Ok(samples)
}
