//! The etcd conformance harness: a member (or a cluster) started by dlock-test-servers, or the
//! deployment `DLOCK_TEST_ETCD_URL` names; fresh clients; a fault hook that revokes a holder's
//! lease; and a residue check that reads the keys under the case's names.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};
use dlock_conformance::{Deployment, Fault, Faults, Harness, OwnServer, ProxyTarget, Timing};
use dlock_etcd::{EtcdConfig, EtcdLock};
use dlock_test_servers::{Etcd, EtcdCluster};
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};

pub struct EtcdHarness {
    deployment: Deployment,
}

/// `etcd://h1:p1,h2:p2` for endpoints given as `http://h:p`.
pub fn etcd_url(endpoints: &[String]) -> String {
    let hosts: Vec<&str> = endpoints
        .iter()
        .map(|e| e.trim_start_matches("http://"))
        .collect();
    format!("etcd://{}", hosts.join(","))
}

impl EtcdHarness {
    /// One member: `DLOCK_TEST_ETCD_URL` if set, else a private etcd.
    pub fn single() -> Self {
        let deployment = Deployment::from_env_or_start("etcd", SINGLE_URL_VAR, || {
            Etcd::start().map(|server| (etcd_url(&server.endpoints()), server))
        });
        Self { deployment }
    }

    /// Three members: `DLOCK_TEST_ETCD_CLUSTER_URL` if set, else a private cluster.
    pub fn cluster() -> Self {
        let deployment = Deployment::from_env_or_start("etcd-3", CLUSTER_URL_VAR, || {
            EtcdCluster::start().map(|cluster| (etcd_url(&cluster.endpoints()), cluster))
        });
        Self { deployment }
    }

    pub fn url(&self) -> &str {
        self.deployment.url()
    }

    /// A plain etcd client of the same deployment, for inspecting and faults.
    pub async fn raw_client(&self) -> std::result::Result<Client, String> {
        raw_client(self.url()).await
    }
}

const SINGLE_URL_VAR: &str = "DLOCK_TEST_ETCD_URL";
const CLUSTER_URL_VAR: &str = "DLOCK_TEST_ETCD_CLUSTER_URL";

pub async fn raw_client(url: &str) -> std::result::Result<Client, String> {
    let config = EtcdConfig::from_url(url).map_err(text)?;
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| format!("http://{e}"))
        .collect();
    Client::connect(endpoints, None).await.map_err(text)
}

/// The key range of `name` under the deployment's prefix, as the backend lays it out.
pub fn name_range(url: &str, name: &LockName) -> String {
    let config = EtcdConfig::from_url(url).expect("a valid URL");
    let encoded: String = name
        .as_str()
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("{}/{encoded}/", config.prefix)
}

fn text(e: impl ToString) -> String {
    e.to_string()
}

#[async_trait]
impl Harness for EtcdHarness {
    fn label(&self) -> &str {
        self.deployment.label()
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(EtcdLock::connect_url(self.url()).await?))
    }

    /// Leases of 3 s rather than 2: every grant, extend and release is a raft write with an
    /// fsync, and with the whole suite's servers on 2 cores one can take most of a second.
    fn timing(&self) -> Timing {
        let short_ttl = std::time::Duration::from_secs(3);
        Timing {
            short_ttl,
            crash_bound: short_ttl,
            ..Timing::default()
        }
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    fn child_env(&self) -> Option<Vec<(String, String)>> {
        self.deployment.child_env()
    }

    /// Every key under each name's range: a holder's or a waiter's.
    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        let mut client = self.raw_client().await?;
        let mut left = Vec::new();
        for name in names {
            let range = name_range(self.url(), name);
            let found = client
                .get(
                    range,
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .map_err(text)?;
            for kv in found.kvs() {
                left.push(format!(
                    "key {} (lease {:x})",
                    String::from_utf8_lossy(kv.key()),
                    kv.lease()
                ));
            }
        }
        Ok(left)
    }
}

#[async_trait]
impl Faults for EtcdHarness {
    fn supports(&self, fault: Fault) -> bool {
        match fault {
            Fault::KillHolder => true,
            // The holder's key deleted, its lease (which the client's other keys share) kept.
            Fault::KillOneHold => true,
            // One member only: the cluster has its own leader-change tests.
            Fault::OwnServer => self.deployment.url_var() == SINGLE_URL_VAR,
            // One member: through its own server's proxy; a cluster: a proxy per member.
            Fault::ProxyLink => true,
            _ => false,
        }
    }

    /// One member: a server of the case's own. A cluster: the shared one, each member behind a
    /// proxy of its own, so a link fault cuts a client off from every member at once (a cut
    /// to one member only is a failover, which the cluster's own tests cover).
    async fn proxy_target(&self) -> std::result::Result<ProxyTarget, String> {
        if self.deployment.url_var() == SINGLE_URL_VAR {
            return Ok(self.own_server().await?.into());
        }
        let config = EtcdConfig::from_url(self.url()).map_err(text)?;
        let members = config
            .endpoints
            .iter()
            .map(|e| e.parse::<std::net::SocketAddr>().map_err(text))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let direct: Arc<dyn Harness> = Arc::new(EtcdHarness {
            deployment: Deployment::at("etcd-3", CLUSTER_URL_VAR, self.url().to_owned()),
        });
        Ok(ProxyTarget::owned(
            members,
            direct,
            |proxies: &[std::net::SocketAddr]| -> Arc<dyn Harness> {
                let endpoints: Vec<String> = proxies.iter().map(ToString::to_string).collect();
                Arc::new(EtcdHarness {
                    deployment: Deployment::at(
                        "etcd-3 via fault proxies",
                        CLUSTER_URL_VAR,
                        etcd_url(&endpoints),
                    ),
                })
            },
            (),
        ))
    }

    /// A private single-member etcd (its data survives restarts).
    async fn own_server(&self) -> std::result::Result<OwnServer, String> {
        OwnServer::start(Etcd::start, |url| {
            Arc::new(EtcdHarness {
                deployment: Deployment::at("etcd", SINGLE_URL_VAR, etcd_url(&[url])),
            })
        })
        .await
    }

    /// Revokes the lease of the holder's key (the first by create revision), as the server does
    /// when the holder's keep-alives stop: every key on that lease goes.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        revoke_holder(self.url(), name).await.map(drop)
    }

    async fn kill_one_hold(&self, name: &LockName) -> std::result::Result<(), String> {
        let mut client = raw_client(self.url()).await?;
        let queue = queue_keys(&mut client, self.url(), name).await?;
        let holder = queue
            .first()
            .ok_or_else(|| format!("{name} has no holder"))?;
        client.delete(holder.key(), None).await.map_err(text)?;
        Ok(())
    }
}

/// The keys under `name`, oldest first: its holder's, then its waiters' in queue order.
pub async fn queue_keys(
    client: &mut Client,
    url: &str,
    name: &LockName,
) -> std::result::Result<Vec<etcd_client::KeyValue>, String> {
    let found = client
        .get(
            name_range(url, name),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        )
        .await
        .map_err(text)?;
    Ok(found.kvs().to_vec())
}

/// Revokes the lease of `name`'s holder; returns the lease id.
pub async fn revoke_holder(url: &str, name: &LockName) -> std::result::Result<i64, String> {
    let mut client = raw_client(url).await?;
    let queue = queue_keys(&mut client, url, name).await?;
    let holder = queue
        .first()
        .ok_or_else(|| format!("{name} has no holder"))?;
    let lease = holder.lease();
    client.lease_revoke(lease).await.map_err(text)?;
    Ok(lease)
}

/// Moves the revision on with puts under `filler`, then compacts the whole history before it,
/// physically: every watch started from an earlier revision is answered "compacted".
pub async fn compact_history(raw: &mut Client, filler: &str) {
    let mut revision = 0;
    for i in 0..20 {
        let put = raw.put(format!("{filler}/{i}"), "x", None).await.unwrap();
        revision = put.header().map_or(0, |h| h.revision());
    }
    raw.compact(
        revision,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
}
