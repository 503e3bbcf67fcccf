//! The raw protocol floors `dlock bench` compares each backend with: the same lock operations
//! issued with the backend's driver alone (the `redis` crate, sqlx, etcd-client,
//! zookeeper-client), with no dlock lock code on their path, measured in the same run as dlock.
//!
//! Each backend's file supplies its protocol ([`Protocol`]): one lock-and-unlock pair on a key,
//! the client its tasks share, and one hand-off between two clients. The measuring loops are
//! here, written once, and `dlock bench` runs dlock's own phases through the same loops.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock::BackendScheme;
use dlock_api::{LockError, Result};
use tokio::time::Instant;

pub(crate) mod census;
mod cost;
#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "redis", feature = "redlock"))]
mod redis;
#[cfg(feature = "redlock")]
mod redlock;
#[cfg(any(feature = "redis", feature = "redlock"))]
mod rslock;
#[cfg(feature = "zookeeper")]
mod zookeeper;

pub(crate) use cost::ProcessCost;

/// Pairs run by many tasks at once: how many in how long, and what they cost this process.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Throughput {
    pub(crate) pairs: u64,
    pub(crate) elapsed: Duration,
    pub(crate) cost: ProcessCost,
}

impl Throughput {
    /// Pairs per second.
    pub(crate) fn per_sec(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    /// Both runs' pairs over both runs' time, as if run back to back.
    pub(crate) fn add(self, other: Self) -> Self {
        Self {
            pairs: self.pairs.saturating_add(other.pairs),
            elapsed: self.elapsed.saturating_add(other.elapsed),
            cost: self.cost.saturating_add(other.cost),
        }
    }
}

/// Pairs measured back to back: each one's latency, and what the measured ones (not the
/// warm-up) cost this process.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) cost: ProcessCost,
}

/// What a backend's floors measure, for the report.
#[derive(Clone, Debug)]
pub(crate) struct Ops {
    /// One uncontended lock-and-unlock pair.
    pub(crate) pair: &'static str,
    /// One uncontended pair of the lightest lock that also hands out fencing tokens as dlock
    /// does, where the backend measures one ([`Protocol::fenced_pairs`]).
    pub(crate) fenced_pair: Option<&'static str>,
    /// One hand-off: the holder's release to the waiter's acquire answered.
    pub(crate) handoff: &'static str,
    /// The client the many-names floor's tasks share.
    pub(crate) client: String,
    /// The pair of the crate a user would pick instead of dlock on this backend, where one is
    /// measured ([`Protocol::peer_pairs`]).
    pub(crate) peer_pair: Option<&'static str>,
}

/// One backend's raw protocol, as the floors drive it.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) trait Protocol {
    /// What its floors measure.
    fn ops(&self) -> Ops;

    /// Lock-and-unlock pairs on one key and one client, back to back for `duration` after a
    /// warm-up (through [`sample`]): each pair's latency, and their cost to this process.
    async fn pairs(&self, duration: Duration) -> Result<Measured>;

    /// The pairs of [`pairs`](Self::pairs), with the fewest commands that also take a fencing
    /// token as dlock's does (above every earlier one, in the same round trip), measured like
    /// them: the report can then tell what fencing costs on the server from what dlock's own code
    /// costs. `None` (the default) where the backend does not measure one.
    async fn fenced_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        let _ = duration;
        Ok(None)
    }

    /// Hand-offs for `duration` after a warm-up: each one's latency, from the holder sending its
    /// release to the next holder's acquire answered. Redis, and the backends whose server queues
    /// waiters, run `waiters` connections, each holding `hold`, through
    /// [`contend`](crate::contend::contend), as dlock's own phase does (a process that idles
    /// through each hold wakes slower than one that runs back to back, and both sides of the ratio
    /// must pay that alike); the others hand off between two clients, the holder holding `hold`
    /// before each release for the same reason.
    async fn handoffs(
        &self,
        duration: Duration,
        waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>>;

    /// `tasks` tasks sharing one client ([`Ops::client`]), each with a key of its own, running
    /// pairs back to back for `duration` (through [`many`]): pairs per second, and their cost.
    async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput>;

    /// Pairs of a semaphore of `permits`: one permit taken and given back on one key, back to
    /// back, with the fewest commands of the algorithm dlock runs on this backend, its fencing
    /// token included (measured like [`pairs`](Self::pairs)); `None` (the default) where the
    /// backend measures none.
    async fn permit_pairs(&self, permits: u32, duration: Duration) -> Result<Option<Measured>> {
        let _ = (permits, duration);
        Ok(None)
    }

    /// Hand-offs of a semaphore's last free permit: `permits - 1` held throughout, `waiters`
    /// connections contending for the last one through [`contend`](crate::contend::contend),
    /// each holding `hold`; `None` (the default) where the backend measures none.
    async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        (waiters, hold): (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        let _ = (permits, duration, waiters, hold);
        Ok(None)
    }

    /// The uncontended pairs of the crate a user would pick instead of dlock on this backend
    /// ([`Ops::peer_pair`]), on the same server, measured like [`pairs`](Self::pairs); `None`
    /// (the default) where none is measured.
    async fn peer_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        let _ = duration;
        Ok(None)
    }

    /// [`parallel`](Self::parallel) with the peer's pairs of [`peer_pairs`](Self::peer_pairs);
    /// `None` (the default) where none is measured.
    async fn peer_parallel(&self, tasks: usize, duration: Duration) -> Result<Option<Throughput>> {
        let _ = (tasks, duration);
        Ok(None)
    }

    /// [`parallel`](Self::parallel) with the fenced pairs of
    /// [`fenced_pairs`](Self::fenced_pairs); `None` (the default) where the backend has none.
    async fn fenced_parallel(
        &self,
        tasks: usize,
        duration: Duration,
    ) -> Result<Option<Throughput>> {
        let _ = (tasks, duration);
        Ok(None)
    }
}

/// One line per backend that has floors: `"feature" => module::Type`, the backend named as
/// `dlock`'s list of backends names it. Writes [`Floors`], [`Floors::for_url`] and
/// `each_protocol!` (`$d` is a `$`, for the inner macro's own variables).
macro_rules! floors {
    ($d:tt $($feature:literal => $module:ident :: $ty:ident),+ $(,)?) => {
        /// The floors of the backend a URL names.
        #[derive(Debug)]
        pub(crate) enum Floors {
            $(#[cfg(feature = $feature)] $ty($module::$ty),)+
        }

        /// Runs `$body` with `$floor` bound to the backend's [`Protocol`] and `$ty` to its type.
        macro_rules! each_protocol {
            ($d self_:ident, $d floor:ident, $d t:ident => $d body:expr) => {
                match *$d self_ {
                    $(#[cfg(feature = $feature)]
                    Floors::$ty(ref $d floor) => {
                        type $d t = $module::$ty;
                        $d body
                    })+
                }
            };
        }

        impl Floors {
            /// The floors of the backend `url` names (its connection parameters parsed, nothing
            /// connected); `None` for a backend without floors (memory).
            ///
            /// # Errors
            /// [`LockError::Config`] for a URL the backend refuses.
            pub(crate) fn for_url(url: &str) -> Result<Option<Self>> {
                let backend = BackendScheme::parse(url)?;
                $(#[cfg(feature = $feature)]
                if backend.name() == $feature {
                    return Ok(Some(Self::$ty($module::$ty::new(url)?)));
                })+
                let _ = (backend, url);
                Ok(None)
            }
        }
    };
}

floors! {
    $
    "redis" => redis::Redis,
    "redlock" => redlock::Redlock,
    "mysql" => mysql::MySql,
    "postgres" => postgres::Postgres,
    "etcd" => etcd::Etcd,
    "zookeeper" => zookeeper::ZooKeeper,
}

#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "mysql",
        feature = "postgres",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(unused_variables)
)]
impl Floors {
    /// What the floors measure.
    pub(crate) fn ops(&self) -> Ops {
        each_protocol!(self, floor, _P => floor.ops())
    }

    /// See [`Protocol::pairs`].
    pub(crate) async fn pairs(&self, duration: Duration) -> Result<Measured> {
        each_protocol!(self, floor, _P => floor.pairs(duration).await)
    }

    /// See [`Protocol::fenced_pairs`].
    pub(crate) async fn fenced_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        each_protocol!(self, floor, _P => floor.fenced_pairs(duration).await)
    }

    /// See [`Protocol::peer_pairs`].
    pub(crate) async fn peer_pairs(&self, duration: Duration) -> Result<Option<Measured>> {
        each_protocol!(self, floor, _P => floor.peer_pairs(duration).await)
    }

    /// See [`Protocol::peer_parallel`].
    pub(crate) async fn peer_parallel(
        &self,
        tasks: usize,
        duration: Duration,
    ) -> Result<Option<Throughput>> {
        each_protocol!(self, floor, _P => floor.peer_parallel(tasks, duration).await)
    }

    /// See [`Protocol::handoffs`].
    pub(crate) async fn handoffs(
        &self,
        duration: Duration,
        waiters: usize,
        hold: Duration,
    ) -> Result<Vec<Duration>> {
        each_protocol!(self, floor, _P => floor.handoffs(duration, waiters, hold).await)
    }

    /// See [`Protocol::parallel`].
    pub(crate) async fn parallel(&self, tasks: usize, duration: Duration) -> Result<Throughput> {
        each_protocol!(self, floor, _P => floor.parallel(tasks, duration).await)
    }

    /// See [`Protocol::permit_pairs`].
    pub(crate) async fn permit_pairs(
        &self,
        permits: u32,
        duration: Duration,
    ) -> Result<Option<Measured>> {
        each_protocol!(self, floor, _P => floor.permit_pairs(permits, duration).await)
    }

    /// See [`Protocol::permit_handoffs`].
    pub(crate) async fn permit_handoffs(
        &self,
        permits: u32,
        duration: Duration,
        contention: (usize, Duration),
    ) -> Result<Option<Vec<Duration>>> {
        each_protocol!(self, floor, _P => floor.permit_handoffs(permits, duration, contention).await)
    }

    /// See [`Protocol::fenced_parallel`].
    pub(crate) async fn fenced_parallel(
        &self,
        tasks: usize,
        duration: Duration,
    ) -> Result<Option<Throughput>> {
        each_protocol!(self, floor, _P => floor.fenced_parallel(tasks, duration).await)
    }
}

/// The most pairs a measurement takes after its warm-up (`dlock bench --profile --pairs`).
static PAIR_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// The warm-up, in operations, of a measurement that warms up for a time, under a pair limit.
const FIXED_WARM_UP: u32 = 50;

/// Stops every later measurement after `pairs` measured operations, whatever its duration, and
/// warms each up with a fixed number of operations (not for a time): two runs then differ by
/// exactly the difference of their `pairs`.
pub(crate) fn limit_pairs(pairs: u64) {
    PAIR_LIMIT.store(pairs, Ordering::Relaxed);
}

/// How a measurement warms up before its samples count.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WarmUp {
    /// This many operations.
    Rounds(u32),
    /// Operations for this long.
    #[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
    For(Duration),
}

/// Runs `op` (one operation that measures itself and returns its latency) through `warm_up`,
/// then back to back for `duration`, and returns the measured latencies.
///
/// # Errors
/// The first error `op` returns.
///
/// # Cancel safety
/// Cancel safe as far as `op` is: dropping it drops the operation in flight.
#[cfg_attr(
    not(any(feature = "etcd", feature = "redlock", feature = "zookeeper")),
    allow(dead_code)
)]
pub(crate) async fn sample_timed(
    warm_up: WarmUp,
    duration: Duration,
    op: impl AsyncFnMut() -> Result<Duration>,
) -> Result<Vec<Duration>> {
    Ok(measure(warm_up, duration, op).await?.latencies)
}

/// [`sample_timed`], with the cost of the measured operations.
async fn measure(
    warm_up: WarmUp,
    duration: Duration,
    mut op: impl AsyncFnMut() -> Result<Duration>,
) -> Result<Measured> {
    let limited = PAIR_LIMIT.load(Ordering::Relaxed) != u64::MAX;
    match warm_up {
        WarmUp::For(_) if limited => {
            for _ in 0..FIXED_WARM_UP {
                op().await?;
            }
        }
        WarmUp::Rounds(rounds) => {
            for _ in 0..rounds {
                op().await?;
            }
        }
        WarmUp::For(warm) => {
            let until = dlock_api::raw::time::after(Instant::now(), warm);
            while Instant::now() < until {
                op().await?;
            }
        }
    }
    let mut latencies = Vec::with_capacity(4096);
    let before = ProcessCost::now();
    let until = dlock_api::raw::time::after(Instant::now(), duration);
    let limit = PAIR_LIMIT.load(Ordering::Relaxed);
    while Instant::now() < until && (latencies.len() as u64) < limit {
        latencies.push(op().await?);
    }
    Ok(Measured {
        latencies,
        cost: ProcessCost::since(before),
    })
}

/// Runs `pair` (one lock-and-unlock) through `warm_up`, then back to back for `duration`, and
/// returns each measured pair's latency and what they cost this process.
///
/// # Errors
/// The first error `pair` returns.
///
/// # Cancel safety
/// Cancel safe as far as `pair` is: dropping it drops the pair in flight.
pub(crate) async fn sample(
    warm_up: WarmUp,
    duration: Duration,
    mut pair: impl AsyncFnMut() -> Result<()>,
) -> Result<Measured> {
    measure(warm_up, duration, async || {
        let started = Instant::now();
        pair().await?;
        Ok(started.elapsed())
    })
    .await
}

/// Lock-and-unlock pairs that tasks sharing one client run, each on a key of its own.
pub(crate) trait Pairs: Send + Sync + 'static {
    /// One pair on task `task`'s key.
    fn pair(&self, task: usize) -> impl Future<Output = Result<()>> + Send;
}

/// Pairs each task runs before the clock starts, so connections and caches are warm.
const MANY_WARM_UP: u32 = 5;

/// Starts `tasks` tasks sharing `pairs`, task `i` running `pairs.pair(i)`: after
/// [`MANY_WARM_UP`] pairs each, all start together and run pairs back to back for `duration`.
/// Returns the pairs per second of them all, and what the timed pairs cost this process.
///
/// # Errors
/// The first error a task returns.
///
/// # Cancel safety
/// Not cancel safe: dropping it leaves the tasks running until their deadline.
pub(crate) async fn many<P: Pairs>(
    pairs: Arc<P>,
    tasks: usize,
    duration: Duration,
) -> Result<Throughput> {
    let tasks = tasks.max(1);
    let start = Arc::new(tokio::sync::Barrier::new(tasks.saturating_add(1)));
    let mut workers = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let (pairs, start) = (pairs.clone(), start.clone());
        workers.push(tokio::spawn(async move {
            let warmed = async {
                for _ in 0..MANY_WARM_UP {
                    pairs.pair(task).await?;
                }
                Ok::<(), LockError>(())
            }
            .await;
            // Everyone meets at the start, also a task that failed (its error ends the run).
            start.wait().await;
            warmed?;
            let deadline = dlock_api::raw::time::after(Instant::now(), duration);
            let mut done = 0u64;
            while Instant::now() < deadline {
                pairs.pair(task).await?;
                done = done.saturating_add(1);
            }
            Ok::<u64, LockError>(done)
        }));
    }
    start.wait().await;
    let started = Instant::now();
    let before = ProcessCost::now();
    let mut total = 0u64;
    let mut failed = None;
    for worker in workers {
        match worker.await {
            Ok(Ok(done)) => total = total.saturating_add(done),
            Ok(Err(error)) => {
                failed.get_or_insert(error);
            }
            Err(error) => {
                failed.get_or_insert(LockError::backend("dlock", error));
            }
        }
    }
    let cost = ProcessCost::since(before);
    match failed {
        Some(error) => Err(error),
        None => Ok(Throughput {
            pairs: total,
            elapsed: started.elapsed(),
            cost,
        }),
    }
}

/// A semaphore floor's uncontended attempt found every slot taken: its slots are its own, so
/// something else holds them.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn all_slots_taken(backend: &'static str) -> LockError {
    LockError::unexpected(backend, "the floor's random slots were all taken")
}

/// The slot a semaphore floor's contender holds, taken out to release it.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn held_slot<T>(held: &mut Option<T>, backend: &'static str) -> Result<T> {
    held.take()
        .ok_or_else(|| LockError::unexpected(backend, "released a slot it never took"))
}

/// Hand-offs of a semaphore's last free permit ([`Protocol::permit_handoffs`]): `waiters`
/// contenders (at least two) made by `contender`, each holding `hold`, run for `duration`
/// through [`contend`](crate::contend::contend), as dlock's own phase runs its clients; each
/// hand-off's latency. The caller holds the other permits meanwhile.
///
/// # Errors
/// The first error making a contender or contending returns.
///
/// # Cancel safety
/// Not cancel safe: dropping it while contending leaves the contenders running until their
/// deadline.
#[cfg(any(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "etcd",
    feature = "zookeeper"
))]
pub(crate) async fn contend_for_last_permit<C: crate::contend::Contender>(
    waiters: usize,
    duration: Duration,
    hold: Duration,
    mut contender: impl AsyncFnMut() -> Result<C>,
) -> Result<Vec<Duration>> {
    let mut contenders = Vec::with_capacity(waiters.max(2));
    for _ in 0..waiters.max(2) {
        contenders.push(contender().await?);
    }
    let (samples, _) = crate::contend::contend(contenders, duration, hold).await?;
    Ok(samples)
}

/// The pairs of [`Protocol::pairs`] for a protocol whose uncontended floor runs on the same
/// client as its many-names floor: task 0's key, warmed up with 50 pairs.
#[cfg(any(
    feature = "redis",
    feature = "redlock",
    feature = "etcd",
    feature = "zookeeper"
))]
pub(crate) async fn pairs_of(pairs: &impl Pairs, duration: Duration) -> Result<Measured> {
    sample(WarmUp::Rounds(50), duration, async || pairs.pair(0).await).await
}

/// The least a connection pool can do, for the SQL floors' many-names phase: at most `size`
/// connections, opened when a task finds none free, taken from and given back to a free list
/// with nothing else on the way (no ping, no reset).
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) struct FreeList<C> {
    free: std::sync::Mutex<Vec<C>>,
    permits: tokio::sync::Semaphore,
}

#[cfg(any(feature = "mysql", feature = "postgres"))]
impl<C: Send> FreeList<C> {
    pub(crate) fn new(size: usize) -> Self {
        Self {
            free: std::sync::Mutex::new(Vec::with_capacity(size)),
            permits: tokio::sync::Semaphore::new(size.max(1)),
        }
    }

    /// Runs `pair` on a connection of the list, waiting while `size` are taken, and opening
    /// one with `open` when none is free; the connection goes back to the list afterwards.
    pub(crate) async fn with<F: Future<Output = Result<C>>>(
        &self,
        open: impl FnOnce() -> F,
        pair: impl AsyncFnOnce(&mut C) -> Result<()>,
    ) -> Result<()> {
        let _taken = self
            .permits
            .acquire()
            .await
            .map_err(|e| LockError::backend("dlock", e))?;
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match free {
            Some(conn) => conn,
            None => open().await?,
        };
        let result = pair(&mut conn).await;
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
        result
    }

    /// The connections opened, to close them.
    pub(crate) fn into_connections(self) -> Vec<C> {
        self.free.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}
