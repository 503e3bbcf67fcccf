//! ZooKeeper's raw floors, with zookeeper-client alone: an ephemeral sequential node created
//! and deleted per pair (one write each, as dlock's uncontended acquire and release), and the
//! predecessor's exists-watch handing on to the node behind it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_zookeeper::{NodeAcl, ZkConfig};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode};

use crate::floor::{
    Measured, Ops, Pairs, Protocol, Throughput, WarmUp, many, pairs_of, sample_timed,
};

const BACKEND: &str = "zookeeper";

fn failed(error: zookeeper_client::Error) -> LockError {
    LockError::unavailable(BACKEND, error)
}

/// The ensemble a `zk://` URL names.
#[derive(Debug)]
pub(crate) struct ZooKeeper {
    config: ZkConfig,
}

impl ZooKeeper {
    pub(crate) fn new(url: &str) -> Result<Self> {
        Ok(Self {
            config: ZkConfig::from_url(url)?,
        })
    }

    /// A new session with the configuration's session timeout, credentials and TLS.
    async fn connect(&self) -> Result<Client> {
        let c = &self.config;
        let mut connector = Client::connector()
            .with_session_timeout(c.session_timeout)
            .with_fail_eagerly();
        if let (Some(user), Some(password)) = (&c.username, &c.password) {
            let auth = format!("{user}:{}", password.expose());
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        #[cfg(feature = "zookeeper-tls")]
        if c.tls {
            connector = connector.with_tls(self.tls_options()?);
        }
        let (hosts, tls) = (c.hosts.join(","), c.tls);
        let connecting = async move {
            #[cfg(feature = "zookeeper-tls")]
            if tls {
                return connector.secure_connect(&hosts).await;
            }
            // Without the feature `zks://` is refused when the URL is parsed.
            let _ = tls;
            connector.connect(&hosts).await
        };
        tokio::time::timeout(c.connect_timeout, connecting)
            .await
            .map_err(|_| LockError::command_timeout(BACKEND, c.connect_timeout))?
            .map_err(failed)
    }

    /// The CA to trust and the client certificate, from the configured PEM files.
    #[cfg(feature = "zookeeper-tls")]
    fn tls_options(&self) -> Result<zookeeper_client::TlsOptions> {
        // rustls panics at the first TLS client without a process-wide provider.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let pem = self.config.tls_files.read(BACKEND)?;
        let bad = |e: zookeeper_client::Error| {
            dlock_api::raw::config::config_error(BACKEND, e.to_string())
        };
        let mut tls = zookeeper_client::TlsOptions::new();
        if let Some(ca) = &pem.ca_cert {
            tls = tls.with_pem_ca(ca).map_err(bad)?;
        }
        if let Some((cert, key)) = &pem.identity {
            tls = tls.with_pem_identity(cert, key).map_err(bad)?;
        }
        Ok(tls)
    }

    /// A node of this run under the prefix: `PREFIX/dlock-bench-WHAT-PID`.
    fn dir(&self, what: &str) -> String {
        format!(
            "{}/dlock-bench-{what}-{}",
            self.config.prefix,
            std::process::id()
        )
    }

    fn sides(&self, client: Client, dirs: Vec<String>) -> Sides {
        Sides {
            client,
            prefixes: dirs.iter().map(|dir| format!("{dir}/n-")).collect(),
            dirs,
            acls: match self.config.acl {
                NodeAcl::Creator => Acls::creator_all(),
                _ => Acls::anyone_all(),
            },
            within: self.config.command_timeout,
        }
    }
}

/// One session and the container nodes its tasks create their nodes in, one per task.
struct Sides {
    client: Client,
    dirs: Vec<String>,
    /// `DIR/n-`, the prefix of each task's sequential nodes.
    prefixes: Vec<String>,
    acls: Acls<'static>,
    within: Duration,
}

impl Sides {
    /// Waits for a request at most the command timeout.
    async fn timed<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
    ) -> Result<T> {
        tokio::time::timeout(self.within, request)
            .await
            .map_err(|_| LockError::command_timeout(BACKEND, self.within))?
            .map_err(failed)
    }

    /// Makes task `task`'s container node (and the prefix above it).
    async fn make_dir(&self, task: usize) -> Result<()> {
        let options = CreateMode::Container.with_acls(self.acls);
        self.timed(self.client.mkdir(&self.dirs[task], &options))
            .await
    }

    /// Creates an ephemeral sequential node in task `task`'s container, making the container
    /// again if the server removed it (an empty container goes at the server's next check,
    /// which may fall between two pairs, as it may between two of dlock's acquires). Returns
    /// its path.
    async fn create(&self, task: usize) -> Result<String> {
        let options = CreateMode::EphemeralSequential.with_acls(self.acls);
        let prefix = &self.prefixes[task];
        loop {
            let created =
                tokio::time::timeout(self.within, self.client.create(prefix, &[], &options))
                    .await
                    .map_err(|_| LockError::command_timeout(BACKEND, self.within))?;
            match created {
                Ok((_, sequence)) => return Ok(format!("{prefix}{sequence}")),
                Err(zookeeper_client::Error::NoNode) => self.make_dir(task).await?,
                Err(error) => return Err(failed(error)),
            }
        }
    }
}

impl Pairs for Sides {
    async fn pair(&self, task: usize) -> Result<()> {
        let node = self.create(task).await?;
        self.timed(self.client.delete(&node, Some(0))).await
    }
}

impl Protocol for ZooKeeper {
    fn ops(&self) -> Ops {
        Ops {
            pair: "create ephemeral-sequential + delete with its version",
            fenced_pair: None,
            handoff: "delete, then the waiter's exists-watch fires and its listing answers",
            client: "one session".to_owned(),
        }
    }

    async fn pairs(&self, duration: Duration) -> Result<Measured> {
        let sides = self.sides(self.connect().await?, vec![self.dir("floor")]);
        sides.make_dir(0).await?;
        pairs_of(&sides, duration).await
    }

    /// A holder's node and a waiter's node behind it, the waiter's exists-watch on the holder's
    /// node, the holder holding `hold` (as dlock's contenders do); one sample is the time from the
    /// holder sending its delete to the waiter's listing (the check that it is first) answered. The
    /// two sides are two sessions.
    async fn handoffs(
        &self,
        duration: Duration,
        _waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        let dir = self.dir("handoff");
        let holder = self.sides(self.connect().await?, vec![dir.clone()]);
        let waiter = self.sides(self.connect().await?, vec![dir.clone()]);
        holder.make_dir(0).await?;
        let unexpected =
            |what: &str| LockError::unexpected(BACKEND, format!("hand-off floor: {what}"));
        let handoff = async || -> Result<Duration> {
            let first = holder.create(0).await?;
            let second = waiter.create(0).await?;
            let (stat, watch) = waiter
                .timed(waiter.client.check_and_watch_stat(&first))
                .await?;
            if stat.is_none() {
                return Err(unexpected("the holder's node went early"));
            }
            tokio::time::sleep(hold).await;
            let released = Instant::now();
            holder.timed(holder.client.delete(&first, Some(0))).await?;
            tokio::time::timeout(waiter.within, watch.changed())
                .await
                .map_err(|_| LockError::command_timeout(BACKEND, waiter.within))?;
            let children = waiter.timed(waiter.client.list_children(&dir)).await?;
            let took = released.elapsed();
            if children.len() != 1 {
                return Err(unexpected("the waiter is not first after the hand-off"));
            }
            waiter.timed(waiter.client.delete(&second, Some(0))).await?;
            Ok(took)
        };
        sample_timed(WarmUp::Rounds(20), duration, handoff).await
    }

    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
        let dirs = (0..tasks)
            .map(|i| self.dir(&format!("parallel-{tasks}-{i}")))
            .collect();
        let sides = Arc::new(self.sides(self.connect().await?, dirs));
        for task in 0..tasks {
            sides.make_dir(task).await?;
        }
        many(sides, tasks, duration).await
    }
}
