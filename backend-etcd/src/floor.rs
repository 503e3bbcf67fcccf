//! The raw protocol floor for `dlock bench`: what the same acquire and release cost with the
//! client library alone, measured in the same run as dlock.

use std::time::Duration;

use dlock_api::Result;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::EtcdLock;
use crate::error::map_err;

/// Measures create + delete pairs for `duration` on one key riding a session lease: a
/// transaction that puts the key if it does not exist, and one that deletes it guarded by its
/// create revision (one raft write each, as dlock's uncontended acquire and release). Returns
/// one sample per pair, after a short warm-up.
///
/// # Errors
/// [`LockError::Config`](dlock_api::LockError::Config) for a bad URL;
/// [`LockError::Unavailable`](dlock_api::LockError::Unavailable) when the cluster does not answer.
///
/// # Cancel safety
/// Cancel safe: a dropped run leaves at most one key on a lease that is revoked when the client
/// goes (or expires with its TTL).
pub async fn raw_floor(url: &str, duration: Duration) -> Result<Vec<Duration>> {
    let locks = EtcdLock::connect_url(url).await?;
    let mut client = locks.inner.client.clone();
    let lease = client.lease_grant(30, None).await.map_err(map_err)?.id();
    let key = format!(
        "{}/dlock-bench-floor/{}",
        locks.config().prefix,
        std::process::id()
    );
    let pair = async || -> Result<()> {
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let created = client.txn(create).await.map_err(map_err)?;
        let revision = created.header().map_or(0, |h| h.revision());
        let delete = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        client.txn(delete).await.map_err(map_err)?;
        Ok(())
    };
    let samples = dlock_api::raw::floor::sample(duration, pair).await?;
    let _ = client.lease_revoke(lease).await;
    Ok(samples)
}
