//! ZooKeeper's raw floors, with zookeeper-client alone: an ephemeral sequential node created
//! and deleted per pair (one write each, as dlock's uncontended acquire and release), and the
//! predecessor's exists-watch handing on to the node behind it. A semaphore's floors run the
//! same queue with N places at its head: a node created together with a write to its parent
//! (whose answer counts the children), a listing when others are queued, and exists-watches on
//! the N nodes just before it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_api::{LockError, Result};
use dlock_zookeeper::{NodeAcl, ZkConfig};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, MultiWriteResult};

use crate::contend::Contender;
use crate::floor::{
    Measured, Ops, Pairs, Protocol, Throughput, WarmUp, contend_for_last_permit, many, pairs_of,
    sample_timed,
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

impl Sides {
    /// Creates an ephemeral sequential node in task `task`'s container and, in the same
    /// transaction, writes the container's (empty) data, whose answered stat counts its
    /// children just after the create: one round trip tells a node with fewer than N
    /// children that it holds one of N places, as dlock's acquire learns it. Returns the
    /// node's path and the count.
    async fn create_counted(&self, task: usize) -> Result<(String, i32)> {
        let options = CreateMode::EphemeralSequential.with_acls(self.acls);
        let (dir, prefix) = (&self.dirs[task], &self.prefixes[task]);
        loop {
            let mut writer = self.client.new_multi_writer();
            writer.add_create(prefix, &[], &options).map_err(failed)?;
            writer.add_set_data(dir, &[], None).map_err(failed)?;
            let committed = tokio::time::timeout(self.within, writer.commit())
                .await
                .map_err(|_| LockError::command_timeout(BACKEND, self.within))?
                .map_err(zookeeper_client::Error::from);
            match committed.as_deref() {
                Ok(
                    [
                        MultiWriteResult::Create { path, .. },
                        MultiWriteResult::SetData { stat },
                    ],
                ) => return Ok((path.clone(), stat.num_children)),
                Ok(_) => {
                    return Err(LockError::unexpected(
                        BACKEND,
                        "a create-and-count transaction answered out of shape",
                    ));
                }
                Err(zookeeper_client::Error::NoNode) => self.make_dir(task).await?,
                Err(error) => return Err(failed(error.clone())),
            }
        }
    }

    /// Takes one of `limit` places of task `task`'s queue, waiting as long as it takes: a
    /// counted create, then, while `limit` or more nodes are ahead, a listing and an
    /// exists-watch on each of the `limit` nodes just before ours (the first of them to go may
    /// let us in). Returns our node's path.
    async fn take_place(&self, task: usize, limit: u32) -> Result<String> {
        let (node, children) = self.create_counted(task).await?;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if usize::try_from(children).unwrap_or(0) <= limit {
            return Ok(node);
        }
        let dir = &self.dirs[task];
        let ours = node.rsplit('/').next().unwrap_or_default().to_owned();
        loop {
            // One prefix and a zero-padded sequence: the names sort in queue order.
            let mut queue = self.timed(self.client.list_children(dir)).await?;
            queue.sort_unstable();
            let place = queue
                .iter()
                .position(|child| *child == ours)
                .ok_or_else(|| LockError::unexpected(BACKEND, "a queued node went"))?;
            if place < limit {
                return Ok(node);
            }
            let looks =
                futures::future::join_all(queue[place.saturating_sub(limit)..place].iter().map(
                    |before| {
                        let before = format!("{dir}/{before}");
                        async move { self.timed(self.client.check_and_watch_stat(&before)).await }
                    },
                ))
                .await;
            let mut watches = Vec::with_capacity(looks.len());
            let mut gone = false;
            for looked in looks {
                match looked? {
                    (Some(_), watch) => watches.push(Box::pin(watch.changed())),
                    (None, _) => gone = true,
                }
            }
            // A node already gone may have let us in: list again rather than wait. A watch
            // the server lost costs a listing after the command timeout, as dlock's fallback.
            if !gone {
                let _ =
                    tokio::time::timeout(self.within, futures::future::select_all(watches)).await;
            }
        }
    }
}

/// Uncontended pairs of a semaphore of `limit` places on one session.
struct PermitPairs {
    sides: Sides,
    limit: u32,
}

impl Pairs for PermitPairs {
    async fn pair(&self, task: usize) -> Result<()> {
        let node = self.sides.take_place(task, self.limit).await?;
        self.sides
            .timed(self.sides.client.delete(&node, Some(0)))
            .await
    }
}

/// One session contending for the last free place of a semaphore of `limit` places.
struct PermitContender {
    sides: Sides,
    limit: u32,
    node: Option<String>,
}

impl Contender for PermitContender {
    async fn lock(&mut self) -> Result<()> {
        self.node = Some(self.sides.take_place(0, self.limit).await?);
        Ok(())
    }

    async fn unlock(&mut self) -> Result<()> {
        let node = self
            .node
            .take()
            .ok_or_else(|| LockError::unexpected(BACKEND, "released a place it never took"))?;
        self.sides
            .timed(self.sides.client.delete(&node, Some(0)))
            .await
    }
}

impl Protocol for ZooKeeper {
    fn ops(&self) -> Ops {
        Ops {
            pair: "create ephemeral-sequential + delete with its version",
            fenced_pair: None,
            handoff: "delete, then the waiter's exists-watch fires and its listing answers",
            client: "one session".to_owned(),
            peer_pair: None,
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

    async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
        let dir = self.dir(&format!("permits-{permits}"));
        let pairs = PermitPairs {
            sides: self.sides(self.connect().await?, vec![dir]),
            limit: permits,
        };
        pairs.sides.make_dir(0).await?;
        pairs_of(&pairs, duration).await.map(Some)
    }

    /// `permits - 1` places held by one more session throughout; `waiters` sessions contend
    /// for the last one, each woken by the exists-watches on the nodes just before its own.
    async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        (waiters, hold): (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        let dir = self.dir(&format!("permit-handoff-{permits}"));
        let parked = self.sides(self.connect().await?, vec![dir.clone()]);
        parked.make_dir(0).await?;
        let mut held = Vec::new();
        for _ in 1..permits {
            held.push(parked.take_place(0, permits).await?);
        }
        let samples = contend_for_last_permit(waiters, duration, hold, async || {
            Ok(PermitContender {
                sides: self.sides(self.connect().await?, vec![dir.clone()]),
                limit: permits,
                node: None,
            })
        })
        .await;
        // Deleted now, not when the session expires: the next round queues in this container.
        for node in held {
            parked.timed(parked.client.delete(&node, Some(0))).await?;
        }
        samples.map(Some)
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
