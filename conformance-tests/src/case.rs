//! The case table's types and what a running case gets.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::{Capabilities, DistributedLock, Fencing, LeaseKind, LockError, LockName};
use futures::future::BoxFuture;

use crate::harness::{Fault, Faults, Harness, Timing};

/// Why a case failed.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        let mut message = format!("unexpected error: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        Failure(message)
    }
}

/// The outcome of one case.
pub type CaseResult = Result<(), Failure>;

/// What a case needs beyond the common contract; unmet needs make it not run, with the reason.
#[derive(Clone, Copy, Debug, Default)]
pub struct Needs {
    /// Extendable leases (renewal, `extend`).
    pub extend: bool,
    /// A backend *without* extendable leases (cases that check the refusal).
    pub no_extend: bool,
    /// A TTL lease (cases about expiry).
    pub ttl_lease: bool,
    /// Fencing tokens (strict, or best effort: the cases check normal operation, not the failures a
    /// best-effort backend documents).
    pub fencing: bool,
    /// A harness fault hook.
    pub fault: Option<Fault>,
    /// A harness a child process can reach ([`Harness::child_env`]).
    pub child_process: bool,
    /// Fault-suite workers: child processes, or tasks of this process where the deployment lives
    /// in it ([`Fault::TaskWorkers`]).
    pub workers: bool,
    /// Holder inspection ([`Capabilities::inspect`]).
    pub inspect: bool,
    /// Waiters served in arrival order ([`Capabilities::fifo`]): the case checks the claim.
    pub fifo: bool,
    /// Waiters woken by the server on release ([`Capabilities::wake_on_release`]): the case
    /// checks the claim.
    pub wake_on_release: bool,
    /// A lost signal on loss the backend detects ([`Capabilities::lost_signal`]): the case
    /// checks the claim.
    pub lost_signal: bool,
    /// A lost signal as the lock passes to another client ([`Capabilities::takeover_signal`]):
    /// the case checks the claim.
    pub takeover_signal: bool,
    /// Semaphores ([`Capabilities::max_permits`]) of at least 3 permits.
    pub semaphore: bool,
    /// One limit per name kept by the server ([`Capabilities::one_limit_per_name`]): a lock
    /// on a semaphore's name is refused.
    pub one_limit_per_name: bool,
    /// Leader election ([`Capabilities::elections`]).
    pub election: bool,
    /// Reader-writer locks ([`Capabilities::reader_writer`]).
    pub reader_writer: bool,
}

impl Needs {
    /// Why a case with these needs cannot run against `caps` and `harness`, if it cannot.
    pub fn unmet(&self, caps: &Capabilities, harness: &dyn Harness) -> Option<&'static str> {
        if self.child_process && harness.child_env().is_none() {
            return Some("needs a harness that a child process can reach");
        }
        let task_workers = harness
            .faults()
            .is_some_and(|f| f.supports(Fault::TaskWorkers));
        if self.workers && harness.child_env().is_none() && !task_workers {
            return Some("needs a harness that worker processes or tasks can reach");
        }
        if self.fifo && !caps.fifo {
            return Some("backend does not promise arrival order");
        }
        if self.fifo && !caps.inspect {
            return Some(
                "backend promises arrival order, but checking it needs inspect to count waiters",
            );
        }
        if self.inspect && !caps.inspect {
            return Some("backend cannot inspect holders");
        }
        if self.wake_on_release && !caps.wake_on_release {
            return Some("backend's waiters poll rather than being woken on release");
        }
        if self.lost_signal && !caps.lost_signal {
            return Some("backend signals a loss only at the lease's local deadline");
        }
        if self.takeover_signal && !caps.takeover_signal {
            return Some("backend's holder learns of a takeover only at its next renewal");
        }
        if self.election && !caps.elections {
            return Some("backend has no elections");
        }
        if self.reader_writer && !caps.reader_writer {
            return Some("backend has no reader-writer locks");
        }
        if self.semaphore && caps.max_permits < 3 {
            return Some("backend has no semaphores (max_permits)");
        }
        if self.one_limit_per_name && !caps.one_limit_per_name {
            return Some("backend's semaphores are their name and number, apart from its locks");
        }
        if self.extend && !caps.extend {
            return Some("backend cannot extend leases");
        }
        if self.no_extend && caps.extend {
            return Some("backend can extend leases; the refusal does not apply");
        }
        if self.ttl_lease && caps.lease != LeaseKind::Ttl {
            return Some("backend's lease is a session, not a TTL");
        }
        if self.fencing && caps.fencing == Fencing::None {
            return Some("backend has no fencing tokens");
        }
        if let Some(fault) = self.fault {
            match harness.faults() {
                None => return Some("needs a test harness with fault hooks"),
                // A server of one's own can always be reached through a proxy.
                Some(faults) if fault == Fault::ProxyLink && faults.supports(Fault::OwnServer) => {}
                Some(faults) if !faults.supports(fault) => {
                    return Some(match fault {
                        Fault::KillHolder => "harness cannot kill a holder",
                        Fault::KillOneHold => {
                            "harness cannot end one hold alone (its kill ends a lease or session the client's holds share)"
                        }
                        Fault::KillWaiters => "harness cannot kill waiting connections",
                        Fault::SuspendSession => "harness cannot suspend a client's session",
                        Fault::OwnServer => "harness cannot start a server of a case's own",
                        Fault::ProxyLink => {
                            "harness can neither start a server nor reach its own through a proxy"
                        }
                        Fault::TaskWorkers => "harness runs no worker tasks",
                        Fault::AmnesiaMitigated => {
                            "harness has no mitigated configuration of a hazard that forgets locks"
                        }
                        Fault::Amnesia => {
                            "harness cannot make its server forget a granted lock (its servers never do, or it reaches a deployed one)"
                        }
                    });
                }
                Some(_) => {}
            }
        }
        None
    }
}

/// One conformance case: an id `<area>::<property_in_words>`, its needs, and its body.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case id, e.g. `fencing::tokens_strictly_increase`.
    pub id: &'static str,
    /// What it needs to run.
    pub needs: Needs,
    /// The body.
    pub run: fn(Ctx) -> BoxFuture<'static, CaseResult>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("needs", &self.needs)
            .finish()
    }
}

/// What a running case gets: the harness, a unique name space, the timing.
#[derive(Clone)]
pub struct Ctx {
    harness: Arc<dyn Harness>,
    case: &'static str,
    run: Arc<str>,
    /// Every name the case asked for, for the residue check after it.
    used: Arc<Mutex<Vec<LockName>>>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("harness", &self.harness.label())
            .field("case", &self.case)
            .finish()
    }
}

impl Ctx {
    /// A context for `case` in the run `run` (a random id shared by one run's cases).
    pub fn new(harness: Arc<dyn Harness>, case: &'static str, run: Arc<str>) -> Self {
        Self {
            harness,
            case,
            run,
            used: Arc::default(),
        }
    }

    /// What the server still holds of `names` once it settled: read again until it is clean
    /// or the bound passes (background releases of dropped guards need a moment).
    ///
    /// # Errors
    /// When the server cannot be read until the bound.
    pub async fn settled_residue(&self, names: &[LockName]) -> Result<Vec<String>, Failure> {
        self.settled_residue_on(&*self.harness, names).await
    }

    /// [`settled_residue`](Self::settled_residue) on another deployment (a case's own server).
    ///
    /// # Errors
    /// When the server cannot be read until the bound.
    pub async fn settled_residue_on(
        &self,
        harness: &dyn Harness,
        names: &[LockName],
    ) -> Result<Vec<String>, Failure> {
        let give_up = dlock_api::raw::time::after(tokio::time::Instant::now(), self.timing().bound);
        loop {
            // A failed read (the server busy after a heavy case) is tried again until the bound.
            let left = harness.residue(names).await;
            if matches!(&left, Ok(left) if left.is_empty())
                || tokio::time::Instant::now() >= give_up
            {
                return left.map_err(|e| Failure(format!("residue check failed: {e}")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The case's id (`area::property`).
    pub fn case(&self) -> &'static str {
        self.case
    }

    /// Records `name` (made without [`name`](Self::name)) for the residue check after the case.
    pub fn record(&self, name: &LockName) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if !used.contains(name) {
            used.push(name.clone());
        }
    }

    /// The names this case has used so far.
    pub fn used_names(&self) -> Vec<LockName> {
        self.used.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A name no other case or run uses: `dlock-test/<run>/<case>/<suffix>`. The suite never
    /// flushes a server; isolation is by name.
    pub fn name(&self, suffix: &str) -> LockName {
        let name = LockName::new(format!("dlock-test/{}/{}/{suffix}", self.run, self.case))
            .expect("test names are valid");
        self.record(&name);
        name
    }

    /// A fresh, independent client.
    pub async fn client(&self) -> Result<Arc<dyn DistributedLock>, Failure> {
        self.harness
            .client()
            .await
            .map_err(|e| Failure(format!("could not create a client: {}", Failure::from(e))))
    }

    /// The harness's fault hooks, if any.
    pub fn faults(&self) -> Option<&dyn Faults> {
        self.harness.faults()
    }

    /// The harness's fault hooks, for a case whose [`Needs`] ask for one (the runner does not
    /// run it otherwise).
    pub fn require_faults(&self) -> Result<&dyn Faults, Failure> {
        self.faults()
            .ok_or_else(|| Failure("no fault hooks".into()))
    }

    /// The environment a child process needs to reach the same deployment, if it can.
    pub fn child_env(&self) -> Option<Vec<(String, String)>> {
        self.harness.child_env()
    }

    /// The harness itself.
    pub fn harness(&self) -> &Arc<dyn Harness> {
        &self.harness
    }

    /// The time scale.
    pub fn timing(&self) -> Timing {
        self.harness.timing()
    }

    /// Awaits `future` for at most the timing's bound; reaching the bound fails with `what`.
    pub async fn within<T>(
        &self,
        what: &str,
        future: impl Future<Output = T>,
    ) -> Result<T, Failure> {
        self.within_for(what, self.timing().bound, future).await
    }

    /// Awaits [`dlock_api::settle`] for at most the timing's bound in **real** time; reaching
    /// it fails with `what`.
    pub(crate) async fn settled(&self, what: &str) -> Result<(), Failure> {
        let bound = self.timing().bound;
        let started = std::time::Instant::now();
        let settle = dlock_api::settle();
        tokio::pin!(settle);
        loop {
            // Looked at between 1 ms steps of the runtime's clock rather than awaited: `settle`
            // waits for every case's cleanups, on runtimes of their own and in real time, and a
            // paused runtime with nothing else to do would jump its clock to the case's bound.
            if futures::poll!(&mut settle).is_ready() {
                return Ok(());
            }
            if started.elapsed() >= bound {
                return Err(Failure(format!(
                    "{what}: settle() did not return within {bound:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits (within the bound, looking every 10 ms) until `check` says yes: for what a
    /// client's background work brings about (a cut-short acquire undone, a dropped guard
    /// released). Not [`settle`](dlock_api::settle), which waits for every case's cleanups in
    /// the process: under paused time, a runtime idle while another case's cleanup runs on a
    /// runtime of its own jumps its clock to the case's bound.
    pub(crate) async fn until<F, Fut>(&self, what: &str, mut check: F) -> Result<(), Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool, LockError>>,
    {
        self.within(what, async {
            while !check().await? {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, LockError>(())
        })
        .await??;
        Ok(())
    }

    /// Waits (within the bound) until `client` can take `name` as a lock at once, and lets it
    /// go: see [`until`](Self::until).
    pub(crate) async fn until_free(
        &self,
        what: &str,
        client: &dyn dlock_api::DistributedLock,
        name: &dlock_api::LockName,
    ) -> Result<(), Failure> {
        let opts = dlock_api::LockOptions::new();
        self.until(what, || async {
            match client.try_acquire(name, &opts).await? {
                Some(guard) => guard.release().await.map(|()| true),
                None => Ok(false),
            }
        })
        .await
    }

    /// Waits (within the bound) until the server counts a waiter of `name`, where `client`'s
    /// backend can inspect; elsewhere returns at once (a case that uses it must hold whether the
    /// waiter has queued yet or not).
    pub(crate) async fn until_queued(
        &self,
        client: &dyn dlock_api::DistributedLock,
        name: &dlock_api::LockName,
    ) -> Result<(), Failure> {
        self.until_waiting(client, name, 1).await
    }

    /// As [`until_queued`](Self::until_queued), until the server counts `waiters` waiters.
    pub(crate) async fn until_waiting(
        &self,
        client: &dyn dlock_api::DistributedLock,
        name: &dlock_api::LockName,
        waiters: usize,
    ) -> Result<(), Failure> {
        if !client.capabilities().inspect {
            return Ok(());
        }
        self.within("the waiters to queue", async {
            loop {
                let seen = client.inspect(name).await?;
                if seen.waiters.is_none_or(|n| n >= waiters) {
                    return Ok::<_, LockError>(());
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await??;
        Ok(())
    }

    /// Awaits every task of `tasks` within the timing's bound, failing with `what` past it;
    /// a task that panicked fails the case, and each task's own result is returned in the order
    /// they finished.
    pub async fn join_all<T: 'static>(
        &self,
        what: &str,
        mut tasks: tokio::task::JoinSet<T>,
    ) -> Result<Vec<T>, Failure> {
        let joined = self
            .within(what, async {
                let mut results = Vec::new();
                while let Some(joined) = tasks.join_next().await {
                    results.push(joined);
                }
                results
            })
            .await?;
        joined
            .into_iter()
            .map(|result| result.map_err(|e| Failure(format!("{what}: a task panicked: {e}"))))
            .collect()
    }

    /// Awaits `future` for at most `bound`; reaching it fails with `what`. For the few steps
    /// that chain several waits of their own, each bounded by the timing's bound.
    pub async fn within_for<T>(
        &self,
        what: &str,
        bound: Duration,
        future: impl Future<Output = T>,
    ) -> Result<T, Failure> {
        tokio::time::timeout(bound, future)
            .await
            .map_err(|_| Failure(format!("{what}: nothing after {bound:?}")))
    }
}

/// Fails the case with a formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}
