//! `dlock conformance`: the conformance suite against a deployed backend.

use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockError};
use dlock_conformance::{Fault, Faults, Harness, Outcome, ProxyTarget};

use crate::BackendArgs;

/// Arguments of `dlock conformance`.
#[derive(Debug, clap::Args)]
pub struct ConformanceArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Run only the cases whose id contains this text (e.g. `fencing::`); given more than once,
    /// the cases that match any of them.
    #[arg(long)]
    filter: Vec<String>,
    /// Also run the fault cases that need only client-side powers: worker processes (this
    /// program, re-executed) that take locks and write to a fenced register while they are
    /// paused and killed, or reach the server through a fault proxy started here (a partition,
    /// lost and late replies, a slow link), judged by the history checker: one proxy per server
    /// the URL names (Redlock's nodes, an ensemble's members), so the proxy cases need
    /// `--backend` to spell out each `host:port`. Behind a Sentinel or a Redis Cluster URL,
    /// every data node the deployment announces gets a proxy too, which the proxied clients
    /// reach through `nat_map`. Not for `memory://`, whose locks live in one process.
    #[arg(long)]
    faults: bool,
    /// With `--faults`: then the long run, for at least this long (30s if no time is given):
    /// `--workers` processes take locks of a few names at random, holding each for a random
    /// time, while every fault the cases above use is done in turn (a paused and a killed
    /// worker; with proxies, a partition, a slow link, lost and late replies), and the history
    /// checker judges the whole run. Run it against a deployment before trusting it.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        default_missing_value = "30s",
        value_parser = crate::parse_duration,
        requires = "faults"
    )]
    long: Option<std::time::Duration>,
    /// The long run's workers at any time (a killed one is replaced).
    #[arg(long, default_value_t = 6, requires = "long", value_parser = clap::value_parser!(u32).range(2..))]
    workers: u32,
}

/// Each client is a fresh connection to the deployed backend.
#[derive(Debug)]
struct DeployedHarness {
    backend: BackendArgs,
    label: String,
    /// Whether child processes (the fault cases' workers) may connect too.
    workers: bool,
}

#[async_trait]
impl Harness for DeployedHarness {
    fn label(&self) -> &str {
        &self.label
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        self.backend.connect().await
    }

    fn faults(&self) -> Option<&dyn Faults> {
        self.workers.then_some(self as &dyn Faults)
    }

    /// A worker reaches the same deployment through the variables `--backend` and `--config`
    /// read.
    fn child_env(&self) -> Option<Vec<(String, String)>> {
        if !self.workers {
            return None;
        }
        let url = self.backend.backend_or_memory().to_owned();
        let mut env = vec![("DLOCK_URL".to_owned(), url)];
        if let Some(config) = &self.backend.config {
            env.push(("DLOCK_CONFIG".to_owned(), config.display().to_string()));
        }
        Some(env)
    }
}

/// A `--backend` URL split around its servers: `scheme://[user@]` + `host:port,…` + the rest.
#[derive(Clone, Debug)]
struct ServerList {
    head: String,
    /// Every server a client of the URL talks to: the URL's own, then those they announce.
    servers: Vec<std::net::SocketAddr>,
    /// How many of `servers` the URL itself lists.
    listed: usize,
    /// The announced servers' names as the deployment gives them, which a proxied client maps
    /// to its proxies (`nat_map`): a Sentinel's primary and replicas, a Cluster's nodes.
    announced: Vec<String>,
    tail: String,
}

/// Splits `url` into `scheme://[user@]`, its `host:port`s and the rest.
fn split_url(url: &str) -> Option<(String, Vec<&str>, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (user, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (format!("{user}@"), hosts),
        None => (String::new(), authority),
    };
    Some((
        format!("{scheme}://{user}"),
        hosts.split(',').collect(),
        tail.to_owned(),
    ))
}

fn resolve(host: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    host.to_socket_addrs().ok()?.next()
}

/// Whether `url` is a Redis deployment whose clients reach servers it does not list: the
/// primary a Sentinel names, the nodes of a Cluster's slot map.
fn announces_its_servers(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme.ends_with("+sentinel") || scheme.ends_with("+cluster"))
}

impl ServerList {
    /// The servers `url` names, if each is an explicit `host:port` that resolves (a default port
    /// left out cannot be pointed at a proxy without knowing the backend's default), and the URL
    /// is not one whose servers announce others ([`discover`](Self::discover) asks those).
    fn parse(url: &str) -> Option<Self> {
        if announces_its_servers(url) {
            return None;
        }
        let (head, hosts, tail) = split_url(url)?;
        let servers = hosts.into_iter().map(resolve).collect::<Option<Vec<_>>>()?;
        (!servers.is_empty()).then(|| Self {
            head,
            listed: servers.len(),
            servers,
            announced: Vec::new(),
            tail,
        })
    }

    /// The servers of a Sentinel or Cluster deployment: those `url` lists, then the data nodes
    /// they announce, asked of the deployment.
    #[cfg(feature = "redis")]
    async fn discover(url: &str) -> Result<Self, String> {
        let config = dlock_redis::RedisConfig::from_url(url).map_err(|e| e.to_string())?;
        let members = dlock_redis::driver::members(&config)
            .await
            .map_err(|e| e.to_string())?;
        let (head, _, tail) = split_url(url).ok_or("not a URL")?;
        let servers = members
            .listed
            .iter()
            .chain(&members.announced)
            .map(|server| resolve(server).ok_or_else(|| format!("{server} does not resolve")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            head,
            servers,
            listed: members.listed.len(),
            announced: members.announced,
            tail,
        })
    }

    /// The same URL with `at` in place of the servers, in order; the announced ones mapped to
    /// theirs.
    fn reached_at(&self, at: &[std::net::SocketAddr]) -> String {
        let (listed, announced) = at.split_at(self.listed.min(at.len()));
        let hosts: Vec<String> = listed.iter().map(ToString::to_string).collect();
        let mut url = format!("{}{}{}", self.head, hosts.join(","), self.tail);
        if !self.announced.is_empty() {
            let pairs: Vec<String> = self
                .announced
                .iter()
                .zip(announced)
                .map(|(name, proxy)| format!("{name}={proxy}"))
                .collect();
            let joiner = if self.tail.contains('?') { '&' } else { '?' };
            url = format!("{url}{joiner}nat_map={}", pairs.join(","));
        }
        url
    }
}

impl DeployedHarness {
    /// The servers `--backend` names, each as an explicit `host:port` (a config file cannot be
    /// pointed at proxies).
    fn servers(&self) -> Option<ServerList> {
        if self.backend.config.is_some() {
            return None;
        }
        ServerList::parse(self.backend.backend_or_memory())
    }

    /// The same deployment reached through proxies at `at` instead.
    fn reached_at(&self, servers: &ServerList, at: &[std::net::SocketAddr]) -> Arc<dyn Harness> {
        Arc::new(DeployedHarness {
            backend: BackendArgs {
                backend: Some(servers.reached_at(at)),
                config: None,
            },
            label: format!("{} via fault proxies", self.label),
            workers: true,
        })
    }
}

#[async_trait]
impl Faults for DeployedHarness {
    /// Only a proxy in front of the deployed server: the rest needs power over the server.
    fn supports(&self, fault: Fault) -> bool {
        let sentinel_or_cluster = self.backend.config.is_none()
            && cfg!(feature = "redis")
            && announces_its_servers(self.backend.backend_or_memory());
        fault == Fault::ProxyLink
            && self.workers
            && (self.servers().is_some() || sentinel_or_cluster)
    }

    async fn kill_holder(&self, _name: &dlock_api::LockName) -> Result<(), String> {
        Err("a deployed server's holders cannot be killed from here".into())
    }

    async fn proxy_target(&self) -> Result<ProxyTarget, String> {
        let servers = match self.servers() {
            Some(servers) => servers,
            #[cfg(feature = "redis")]
            None if self.backend.config.is_none()
                && announces_its_servers(self.backend.backend_or_memory()) =>
            {
                ServerList::discover(self.backend.backend_or_memory()).await?
            }
            None => return Err("--backend names no explicit host:port list".into()),
        };
        let direct = Arc::new(DeployedHarness {
            backend: BackendArgs {
                backend: self.backend.backend.clone(),
                config: None,
            },
            label: self.label.clone(),
            workers: true,
        });
        let this = DeployedHarness {
            backend: direct.backend.clone(),
            label: self.label.clone(),
            workers: true,
        };
        let upstreams = servers.servers.clone();
        Ok(ProxyTarget::owned(
            upstreams,
            direct,
            move |at: &[std::net::SocketAddr]| this.reached_at(&servers, at),
            (),
        ))
    }
}

/// When this process was started as a conformance case's child (a fault case's worker, or the
/// crash case's holder), plays that part and returns its exit code.
///
/// The worker connects with `DLOCK_URL` / `DLOCK_CONFIG`, as the parent's harness set them.
pub fn run_worker_if_asked(runtime: &tokio::runtime::Runtime) -> Option<ExitCode> {
    let spec = std::env::var(dlock_conformance::nemesis::worker::WORKER_SPEC).ok();
    let holds = std::env::var(dlock_conformance::cases::crash::CHILD_HOLDS).ok();
    if spec.is_none() && holds.is_none() {
        return None;
    }
    let backend = BackendArgs {
        backend: std::env::var("DLOCK_URL").ok(),
        config: std::env::var_os("DLOCK_CONFIG").map(Into::into),
    };
    let harness = Arc::new(DeployedHarness {
        label: backend.backend_or_memory().to_owned(),
        backend,
        workers: false,
    });
    let Some(spec) = spec else {
        // The crash case's holder: take the lock and keep it until killed.
        let name = holds.unwrap_or_default();
        runtime.block_on(dlock_conformance::cases::crash::hold_until_killed(
            harness, &name,
        ));
        return Some(ExitCode::FAILURE);
    };
    let outcome = match serde_json::from_str(&spec) {
        Ok(spec) => runtime.block_on(dlock_conformance::nemesis::worker::run_worker(
            harness, spec,
        )),
        Err(e) => Err(format!("bad worker spec: {e}")),
    };
    Some(match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("dlock worker: {error}");
            ExitCode::FAILURE
        }
    })
}

pub(super) async fn conformance(args: ConformanceArgs) -> Result<ExitCode, LockError> {
    let selects = |id: &str| args.filter.iter().any(|f| id.contains(f.as_str()));
    let long_selected =
        args.long.is_some() && (args.filter.is_empty() || selects(dlock_conformance::LONG_RUN_ID));
    if !args.filter.is_empty()
        && !long_selected
        && !dlock_conformance::cases().iter().any(|c| selects(c.id))
    {
        // A misspelt filter must not certify a deployment by running nothing.
        let mut areas: Vec<&str> = dlock_conformance::cases()
            .iter()
            .filter_map(|c| c.id.split_once("::").map(|(area, _)| area))
            .collect();
        areas.dedup();
        return Err(LockError::Config {
            backend: "dlock",
            reason: format!(
                "--filter {} matches no case; the areas are {}",
                args.filter.join(", "),
                areas.join(", ")
            ),
        });
    }
    let first = args.backend.connect().await?;
    let label = first.to_string();
    drop(first);
    println!("dlock conformance against {label}\n");
    let in_process = args.backend.url()?.starts_with("memory:");
    if args.faults && in_process {
        return Err(LockError::Config {
            backend: "dlock",
            reason:
                "--faults needs a backend other processes can reach; memory:// lives in one process"
                    .into(),
        });
    }
    let harness = Arc::new(DeployedHarness {
        backend: args.backend,
        label,
        workers: args.faults,
    });
    let mut report = if long_selected
        && !args.filter.is_empty()
        && !dlock_conformance::cases().iter().any(|c| selects(c.id))
    {
        dlock_conformance::Report::default()
    } else {
        dlock_conformance::run_all(harness.clone(), &args.filter)
            .await
            .map_err(|f| LockError::Config {
                backend: "dlock",
                reason: f.0,
            })?
    };
    if let Some(duration) = args.long.filter(|_| long_selected) {
        println!(
            "the long run: {} workers, at least {duration:?}…",
            args.workers
        );
        let plan = dlock_conformance::cases::faults::LongRun::new(duration, args.workers);
        report
            .cases
            .push(dlock_conformance::run_long(harness, plan).await);
    }
    for case in &report.cases {
        let ms = case.elapsed.as_millis();
        match &case.outcome {
            Outcome::Passed => println!("ok       {} ({ms} ms)", case.id),
            Outcome::Failed(why) => println!("FAILED   {} ({ms} ms): {why}", case.id),
            Outcome::NotRun(why) => println!("skipped  {}: {why}", case.id),
        }
    }
    println!("\n{}", report.summary());
    let (_, failed, _) = report.counts();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::ServerList;

    #[test]
    fn every_server_of_a_url_is_put_behind_its_proxy() {
        let list =
            ServerList::parse("redlock://127.0.0.1:7001,127.0.0.1:7002/dlock?quorum=2").unwrap();
        assert_eq!(list.servers.len(), 2);
        let at = [
            "127.0.0.1:9001".parse().unwrap(),
            "127.0.0.1:9002".parse().unwrap(),
        ];
        assert_eq!(
            list.reached_at(&at),
            "redlock://127.0.0.1:9001,127.0.0.1:9002/dlock?quorum=2"
        );
        let one = ServerList::parse("mysql://root:pw@127.0.0.1:3306/test").unwrap();
        assert_eq!(
            one.reached_at(&at[..1]),
            "mysql://root:pw@127.0.0.1:9001/test"
        );
        assert!(
            ServerList::parse("redis://127.0.0.1/0").is_none(),
            "no explicit port"
        );
        assert!(ServerList::parse("memory://").is_none());
        for off_the_data_path in [
            "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster",
            "rediss+sentinel://127.0.0.1:26379/mymaster",
            "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",
        ] {
            assert!(
                ServerList::parse(off_the_data_path).is_none(),
                "{off_the_data_path}"
            );
        }
    }

    #[test]
    fn announced_servers_are_mapped_to_their_proxies() {
        let list = ServerList {
            head: "redis+sentinel://".into(),
            servers: Vec::new(),
            listed: 1,
            announced: vec!["10.0.0.5:6379".into()],
            tail: "/mymaster?command_timeout=1s".into(),
        };
        let at = [
            "127.0.0.1:9001".parse().unwrap(),
            "127.0.0.1:9002".parse().unwrap(),
        ];
        assert_eq!(
            list.reached_at(&at),
            "redis+sentinel://127.0.0.1:9001/mymaster?command_timeout=1s&nat_map=10.0.0.5:6379=127.0.0.1:9002"
        );
    }
}
