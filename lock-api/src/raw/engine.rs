//! The generic half of every backend: options checked once, the wait deadline, the `Timeout`
//! error, the guard assembled and its renewal started. A backend supplies [`RawLock`] (what the
//! server grants) and gets [`DistributedLock`](crate::DistributedLock) from
//! [`impl_distributed_lock!`](crate::impl_distributed_lock).

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::Either;
use tokio::time::Instant;
use tracing::Instrument;

use super::holdings::{Held, Holdings};
use super::lease::{RawLease, RenewedBy, spawn_release};
use super::state::LeaseState;
use super::time::{after, deadline};
use crate::capabilities::Capabilities;
use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::name::LockName;
use crate::observability::{AcquireProbe, Op, Outcome};
use crate::options::LockOptions;
use crate::token::FencingToken;

/// What the server granted for one acquire: the backend's answer, before it is a guard.
///
/// A grant that is dropped instead of being turned into a guard (the acquire was cancelled after
/// the server said yes) releases its lease in the background, so a backend can build one the
/// moment the reply arrives and never leak a lock in between.
#[derive(Debug)]
#[must_use = "a dropped grant releases its lock"]
pub struct Grant {
    token: FencingToken,
    lease: Option<Arc<dyn RawLease>>,
    state: Arc<LeaseState>,
    renewed_by: RenewedBy,
    name: LockName,
}

impl Grant {
    /// A grant of `name` with its fencing `token`, the `lease` that releases and extends it, the
    /// `state` holding its validity (its deadline, or `None` for a session lease) and loss, and
    /// who renews it.
    pub fn new(
        name: LockName,
        token: FencingToken,
        lease: Arc<dyn RawLease>,
        state: Arc<LeaseState>,
        renewed_by: RenewedBy,
    ) -> Self {
        Self {
            token,
            lease: Some(lease),
            state,
            renewed_by,
            name,
        }
    }

    /// The name granted.
    pub(super) fn name(&self) -> &LockName {
        &self.name
    }

    /// The guard for this grant, with renewal and the maximum hold time as `options` ask,
    /// registered among what its client holds; the acquire's span and metrics record the grant.
    ///
    /// # Errors
    /// [`LockError::Closed`] if the client was closed while the grant was on its way: the
    /// grant is released instead.
    pub(super) fn into_guard(
        mut self,
        client: &Client<'_>,
        options: &LockOptions,
        probe: &mut AcquireProbe,
    ) -> Result<LockGuard> {
        let lease = self.lease.take().expect("a grant's lease is taken once");
        let held = Held {
            name: self.name.clone(),
            lease: lease.clone(),
            state: self.state.clone(),
        };
        let Some(ticket) = client.holdings.register(held) else {
            self.lease = Some(lease);
            return Err(LockError::Closed {
                backend: client.backend,
            });
        };
        probe.acquired(&self.name, self.token);
        Ok(LockGuard::assemble(
            (client.capabilities, client.backend),
            self.name.clone(),
            self.token,
            (lease, self.state.clone()),
            self.renewed_by,
            options,
            ticket,
        ))
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            spawn_release(self.name.as_str(), lease);
        }
    }
}

/// What a backend implements: one attempt, and a wait. Everything else (checking options against
/// the capabilities, the deadline, the `Timeout` error, assembling the guard, renewal) is done
/// once, here, for every backend.
#[async_trait]
pub trait RawLock: Debug + Display + Send + Sync + 'static {
    /// The backend's tag in errors, e.g. `"redis"`.
    fn backend(&self) -> &'static str;

    /// What the backend promises; the options of every call are checked against it first.
    fn capabilities(&self) -> Capabilities;

    /// What this client holds (one [`Holdings`] per client, shared by its clones): the engine
    /// registers each guard there, and [`close`](crate::DistributedLock::close) releases them.
    fn holdings(&self) -> &Holdings;

    /// Ends what the client keeps on the server beyond its locks, once
    /// [`close`](crate::DistributedLock::close) has released them: an etcd lease revoked, a
    /// ZooKeeper session closed, SQL connections closed. Called with the client already closed
    /// (no new guard can appear), and cut off at `deadline`. The default does nothing: a
    /// backend whose locks are all it keeps (Redis) has nothing more to end.
    ///
    /// # Cancel safety
    /// Must be cancel safe: `close` drops it at its deadline.
    async fn shutdown(&self, deadline: Instant) {
        let _ = deadline;
    }

    /// One attempt that does not wait: `Ok(None)` when the name is taken. `limit` is how many
    /// may hold the name at once: 1 for a lock, a semaphore's number of permits (above 1 only
    /// when [`capabilities`](Self::capabilities) has `max_permits`, and checked against it). A
    /// name in use with another limit is refused with
    /// [`permits_mismatch`](super::permits_mismatch). Called with options already checked.
    ///
    /// With [`LockOptions::is_shared`] (only when [`capabilities`](Self::capabilities) has
    /// `reader_writer`), the place asked for is a reader's: shared with other readers, never
    /// with a holder of the name's lock, and granted only while no such holder waits either.
    ///
    /// # Cancel safety
    /// Must be cancel safe: a dropped call leaves no lock held (arm a
    /// [`PendingAcquire`](super::PendingAcquire), or build the [`Grant`] as soon as the reply is
    /// in).
    async fn try_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>>;

    /// Waits until the server grants one of `limit` places of `name` (as
    /// [`try_grant`](Self::try_grant)) or `deadline` passes (`Ok(None)`); `None` waits without
    /// limit. Called with options already checked. It should be woken by the server, not by
    /// polling; a backend whose server cannot wake it polls with
    /// [`LockOptions::retry`](crate::LockOptions::retry) and says `wake_on_release: false` in
    /// its capabilities (the conformance suite checks the claim). It rides out a lost connection
    /// within the deadline ([`WaitRecovery`](super::WaitRecovery)).
    ///
    /// # Cancel safety
    /// Must be cancel safe: a dropped wait leaves no lock held and no waiter registered.
    async fn wait_grant(
        &self,
        name: &LockName,
        limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>>;

    /// Reads who holds `name` on the server, for
    /// [`DistributedLock::inspect`](crate::DistributedLock::inspect); called only when
    /// [`capabilities`](Self::capabilities) says `inspect`. The default answers
    /// [`LockError::Unsupported`].
    ///
    /// # Cancel safety
    /// Must be cancel safe: it only reads.
    async fn inspect(&self, name: &LockName) -> Result<crate::Inspection> {
        let _ = name;
        Err(crate::inspect::unsupported(self.backend()))
    }

    /// How many permits of `name` are held now, as the server says.
    ///
    /// # Cancel safety
    /// Must be cancel safe: it only reads.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        let _ = name;
        Err(crate::semaphore::unsupported(self.backend()))
    }

    /// The leader of `name` as the server says: the published value of a campaign whose hold is
    /// still on, and its term; `None` when nobody holds the name as a leader. Called only when
    /// [`capabilities`](Self::capabilities) says `elections`.
    ///
    /// # Cancel safety
    /// Must be cancel safe: it only reads.
    async fn leader(&self, name: &LockName) -> Result<Option<crate::Leader>> {
        let _ = name;
        Err(crate::election::unsupported(self.backend()))
    }

    /// A stream of `name`'s leader changes, starting with the current leader (or
    /// [`LeaderEvent::Vacant`](crate::LeaderEvent::Vacant)), woken by the server. The engine
    /// drops repeats, so a backend may report a state it is not sure changed. It must report
    /// [`LeaderEvent::Missed`](crate::LeaderEvent::Missed) before what it reads after a gap in
    /// which changes could have passed unseen (a reconnect, a compacted history), and keep
    /// going after an error item. Called only when [`capabilities`](Self::capabilities) says
    /// `elections`.
    ///
    /// # Cancel safety
    /// Must be cancel safe, and so must dropping the stream: nothing is left registered.
    async fn observe_leader(&self, name: &LockName) -> Result<crate::LeaderStream> {
        let _ = name;
        Err(crate::election::unsupported(self.backend()))
    }

    /// Every lock of `names` (sorted, each once) in one step of the server, or none, for
    /// [`DistributedLock::try_acquire_at_once`](crate::DistributedLock::try_acquire_at_once):
    /// each grant as [`try_grant`](Self::try_grant) would make it for its name alone. Called
    /// with options already checked, never for a reader. The default answers
    /// [`GrantedAtOnce::OneByOne`](super::GrantedAtOnce::OneByOne).
    ///
    /// # Cancel safety
    /// As [`try_grant`](Self::try_grant): a dropped call leaves none of the locks held.
    async fn try_grant_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<super::at_once::GrantedAtOnce> {
        let _ = (names, options);
        Ok(super::at_once::GrantedAtOnce::OneByOne)
    }
}

/// [`DistributedLock::try_acquire`](crate::DistributedLock::try_acquire) for a [`RawLock`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::try_grant`].
pub async fn try_acquire<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    options: &LockOptions,
) -> Result<Option<LockGuard>> {
    try_acquire_engine(
        &Client::of(backend),
        Some(name),
        options,
        backend.try_grant(name, 1, options),
    )
    .await
}

/// [`DistributedLock::acquire`](crate::DistributedLock::acquire) for a [`RawLock`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::wait_grant`].
pub async fn acquire<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    options: &LockOptions,
) -> Result<LockGuard> {
    acquire_by(backend, name, options, |deadline| {
        backend.wait_grant(name, 1, options, deadline)
    })
    .await
}

/// [`DistributedLock::try_acquire_permit`](crate::DistributedLock::try_acquire_permit) for a
/// [`RawLock`]: `permits` checked against the capabilities before any network call, then as
/// [`try_acquire`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::try_grant`].
pub async fn try_acquire_permit<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    permits: u32,
    options: &LockOptions,
) -> Result<Option<LockGuard>> {
    backend
        .capabilities()
        .check_permits(backend.backend(), permits)?;
    try_acquire_engine(
        &Client::of(backend),
        Some(name),
        options,
        backend.try_grant(name, permits, options),
    )
    .await
}

/// [`DistributedLock::acquire_permit`](crate::DistributedLock::acquire_permit) for a
/// [`RawLock`]: `permits` checked against the capabilities before any network call, then as
/// [`acquire`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::wait_grant`].
pub async fn acquire_permit<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    permits: u32,
    options: &LockOptions,
) -> Result<LockGuard> {
    backend
        .capabilities()
        .check_permits(backend.backend(), permits)?;
    acquire_by(backend, name, options, |deadline| {
        backend.wait_grant(name, permits, options, deadline)
    })
    .await
}

/// [`DistributedLock::count_permits`](crate::DistributedLock::count_permits) for a
/// [`RawLock`]: refused before any network call on a backend without semaphores.
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn count_permits<B: RawLock + ?Sized>(backend: &B, name: &LockName) -> Result<u32> {
    if backend.capabilities().max_permits == 0 {
        return Err(crate::semaphore::unsupported(backend.backend()));
    }
    backend.holdings().check_open(backend.backend())?;
    backend.count_permits(name).await
}

/// [`DistributedLock::try_read`](crate::DistributedLock::try_read) for a [`RawLock`]: refused
/// before any network call on a backend without reader-writer locks, then the backend's
/// [`RawLock::try_grant`] of one place, with options that ask for a shared hold
/// ([`LockOptions::is_shared`]).
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::try_grant`].
pub async fn try_read<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    options: &LockOptions,
) -> Result<Option<LockGuard>> {
    if !backend.capabilities().reader_writer {
        return Err(crate::reader_writer::unsupported(backend.backend()));
    }
    let shared = options.clone().for_read();
    try_acquire_engine(
        &Client::of(backend),
        Some(name),
        &shared,
        backend.try_grant(name, 1, &shared),
    )
    .await
}

/// [`DistributedLock::read`](crate::DistributedLock::read) for a [`RawLock`]: as [`try_read`],
/// waiting through the backend's [`RawLock::wait_grant`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// As the backend's [`RawLock::wait_grant`].
pub async fn read<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    options: &LockOptions,
) -> Result<LockGuard> {
    if !backend.capabilities().reader_writer {
        return Err(crate::reader_writer::unsupported(backend.backend()));
    }
    let shared = options.clone().for_read();
    acquire_by(backend, name, &shared, |deadline| {
        backend.wait_grant(name, 1, &shared, deadline)
    })
    .await
}

/// The engine's non-blocking acquire for a backend's own entry points (an acquire by integer
/// key, say): checks `options` against `capabilities` before `attempt` runs, and turns the grant
/// into a guard. Its `dlock.acquire` span takes the lock name from the grant, so a busy attempt
/// has none.
///
/// # Errors
/// [`LockError::InvalidArgument`] / [`LockError::Unsupported`] for options refused before any
/// network call, else what `attempt` returns.
///
/// # Cancel safety
/// As `attempt`.
pub async fn try_acquire_by<B: RawLock + ?Sized>(
    backend: &B,
    options: &LockOptions,
    attempt: impl Future<Output = Result<Option<Grant>>>,
) -> Result<Option<LockGuard>> {
    try_acquire_engine(&Client::of(backend), None, options, attempt).await
}

/// What the engine needs of the client an acquire runs for.
pub(super) struct Client<'a> {
    capabilities: Capabilities,
    pub(super) backend: &'static str,
    holdings: &'a Holdings,
}

impl<'a> Client<'a> {
    pub(super) fn of<B: RawLock + ?Sized>(backend: &'a B) -> Self {
        Self {
            capabilities: backend.capabilities(),
            backend: backend.backend(),
            holdings: backend.holdings(),
        }
    }

    /// What every acquire checks before any network call: the client is open and the options
    /// are ones it can honour.
    pub(super) fn check(&self, options: &LockOptions) -> Result<()> {
        self.holdings.check_open(self.backend)?;
        self.capabilities.check(self.backend, options)
    }
}

async fn try_acquire_engine(
    client: &Client<'_>,
    name: Option<&LockName>,
    options: &LockOptions,
    attempt: impl Future<Output = Result<Option<Grant>>>,
) -> Result<Option<LockGuard>> {
    let mut probe = AcquireProbe::start(client.backend, Op::TryAcquire, name);
    let span = probe.span().clone();
    let work = async {
        let granted = match client.check(options) {
            Ok(()) => attempt.await,
            Err(error) => Err(error),
        };
        let guard = match granted {
            Ok(Some(grant)) => grant.into_guard(client, options, &mut probe).map(Some),
            Ok(None) => {
                probe.finish(Outcome::Busy);
                return Ok(None);
            }
            Err(error) => Err(error),
        };
        if let Err(error) = &guard {
            probe.failed(error);
        }
        guard
    };
    in_span(span, work).await
}

/// The engine's blocking acquire for a backend's own entry points: checks `options`, computes
/// the one deadline (a wait too long to reach has none), runs `wait` under it, and turns its
/// grant into a guard or its `None` into [`LockError::Timeout`].
///
/// # Errors
/// As [`try_acquire_by`], plus [`LockError::Timeout`].
///
/// # Cancel safety
/// As `wait`.
pub async fn acquire_by<B, F, Fut>(
    backend: &B,
    name: &LockName,
    options: &LockOptions,
    wait: F,
) -> Result<LockGuard>
where
    B: RawLock + ?Sized,
    F: FnMut(Option<Instant>) -> Fut,
    Fut: Future<Output = Result<Option<Grant>>>,
{
    let client = Client::of(backend);
    let mut probe = AcquireProbe::start(client.backend, Op::Acquire, Some(name));
    let span = probe.span().clone();
    let work = async {
        let granted = match client.check(options) {
            Ok(()) => {
                let started = probe.waiting();
                let until = deadline(started, options.wait_timeout());
                // A close ends the wait: dropping it leaves the backend's queue (every wait is
                // cancel safe).
                let waited = tokio::select! {
                    biased;
                    waited = wait_until_deadline(until, wait) => waited,
                    () = client.holdings.closed() => Err(LockError::Closed {
                        backend: client.backend,
                    }),
                };
                match waited {
                    Ok(Some(grant)) => Ok(grant),
                    Ok(None) => Err(LockError::Timeout {
                        name: name.to_string(),
                        waited: started.elapsed(),
                    }),
                    Err(error) => Err(error),
                }
            }
            Err(error) => Err(error),
        };
        let guard = granted.and_then(|grant| grant.into_guard(&client, options, &mut probe));
        if let Err(error) = &guard {
            probe.failed(error);
        }
        guard
    };
    in_span(span, work).await
}

/// A wait that ended this much or more before its deadline (by the client's clock) is asked
/// again; one that ended closer to it sleeps out the rest. Asking again for less would be a
/// round trip spent on a wait the server rounds to nothing.
const ASK_AGAIN_FROM: Duration = Duration::from_millis(5);

/// Runs `wait` until it grants or `deadline` has passed on this client's monotonic clock, so a
/// `Timeout` never comes early. A server's timed wait runs on the server's clock and rounds
/// (`GET_LOCK(key, 0.5)`, a `lock_timeout`), and a backend may give up on a remainder too short
/// to send: on a busy machine such a wait ends before the deadline by the client's clock. Written
/// once here, so no backend has to get it right on its own.
async fn wait_until_deadline<F, Fut>(
    deadline: Option<Instant>,
    mut wait: F,
) -> Result<Option<Grant>>
where
    F: FnMut(Option<Instant>) -> Fut,
    Fut: Future<Output = Result<Option<Grant>>>,
{
    loop {
        let asked_at = Instant::now();
        let granted = wait(deadline).await?;
        let Some(deadline) = deadline.filter(|_| granted.is_none()) else {
            return Ok(granted);
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        if left < ASK_AGAIN_FROM {
            tokio::time::sleep_until(deadline).await;
            return Ok(None);
        }
        // A wait that gave up at once is not asked again in a spin.
        let next_ask = after(asked_at, ASK_AGAIN_FROM);
        if next_ask > Instant::now() {
            tokio::time::sleep_until(next_ask.min(deadline)).await;
        }
    }
}

/// Runs `work` inside `span`, or bare when no subscriber wants the span: an instrumented future
/// enters and leaves its span on every poll, disabled or not. A plain function rather than an
/// `async fn`, which would keep `work` in its state beside the future it awaits: twice the size
/// for every acquire's future to move and free.
fn in_span<T>(span: tracing::Span, work: impl Future<Output = T>) -> impl Future<Output = T> {
    if span.is_disabled() {
        Either::Left(work)
    } else {
        Either::Right(work.instrument(span))
    }
}

/// Implements [`DistributedLock`](crate::DistributedLock) for a type that implements
/// [`RawLock`] (`dlock_api::impl_distributed_lock!(MyLock);`), through the shared engine.
#[macro_export]
macro_rules! impl_distributed_lock {
    ($backend:ty) => {
        #[$crate::raw::async_trait]
        impl $crate::DistributedLock for $backend {
            fn capabilities(&self) -> $crate::Capabilities {
                $crate::raw::RawLock::capabilities(self)
            }

            async fn try_acquire(
                &self,
                name: &$crate::LockName,
                options: &$crate::LockOptions,
            ) -> $crate::Result<::core::option::Option<$crate::LockGuard>> {
                $crate::raw::try_acquire(self, name, options).await
            }

            async fn acquire(
                &self,
                name: &$crate::LockName,
                options: &$crate::LockOptions,
            ) -> $crate::Result<$crate::LockGuard> {
                $crate::raw::acquire(self, name, options).await
            }

            async fn inspect(&self, name: &$crate::LockName) -> $crate::Result<$crate::Inspection> {
                $crate::raw::inspect(self, name).await
            }

            async fn try_acquire_permit(
                &self,
                name: &$crate::LockName,
                permits: u32,
                options: &$crate::LockOptions,
            ) -> $crate::Result<::core::option::Option<$crate::Permit>> {
                $crate::raw::try_acquire_permit(self, name, permits, options).await
            }

            async fn acquire_permit(
                &self,
                name: &$crate::LockName,
                permits: u32,
                options: &$crate::LockOptions,
            ) -> $crate::Result<$crate::Permit> {
                $crate::raw::acquire_permit(self, name, permits, options).await
            }

            async fn count_permits(&self, name: &$crate::LockName) -> $crate::Result<u32> {
                $crate::raw::count_permits(self, name).await
            }

            async fn try_read(
                &self,
                name: &$crate::LockName,
                options: &$crate::LockOptions,
            ) -> $crate::Result<::core::option::Option<$crate::LockGuard>> {
                $crate::raw::try_read(self, name, options).await
            }

            async fn read(
                &self,
                name: &$crate::LockName,
                options: &$crate::LockOptions,
            ) -> $crate::Result<$crate::LockGuard> {
                $crate::raw::read(self, name, options).await
            }

            async fn campaign(
                &self,
                name: &$crate::LockName,
                value: &[u8],
                options: &$crate::LockOptions,
            ) -> $crate::Result<$crate::Leadership> {
                $crate::raw::campaign(self, name, value, options).await
            }

            async fn leader(
                &self,
                name: &$crate::LockName,
            ) -> $crate::Result<::core::option::Option<$crate::Leader>> {
                $crate::raw::leader(self, name).await
            }

            async fn observe(
                &self,
                name: &$crate::LockName,
            ) -> $crate::Result<$crate::LeaderStream> {
                $crate::raw::observe(self, name).await
            }

            async fn close(
                &self,
                within: ::core::time::Duration,
            ) -> $crate::Result<$crate::CloseReport> {
                $crate::raw::close(self, within).await
            }

            async fn try_acquire_at_once(
                &self,
                names: &[$crate::LockName],
                options: &$crate::LockOptions,
            ) -> $crate::Result<$crate::AtOnce> {
                $crate::raw::try_acquire_at_once(self, names, options).await
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A wait that ends `early` before its deadline, the way a server's rounded timed wait does
    /// on a busy machine; returns when the acquire gave up and how many waits were asked for.
    async fn acquire_with_early_wait(early: Duration) -> (Duration, u32) {
        let asked = AtomicU32::new(0);
        let name = LockName::new("early").unwrap();
        let options = LockOptions::new().with_wait_timeout(Duration::from_millis(500));
        let started = Instant::now();
        let result = acquire_by(&crate::MemoryLock::new(), &name, &options, |deadline| {
            asked.fetch_add(1, Ordering::Relaxed);
            async move {
                let deadline = deadline.expect("a wait timeout gives a deadline");
                let end = deadline.checked_sub(early).unwrap_or(deadline);
                tokio::time::sleep_until(end.max(Instant::now())).await;
                Ok(None)
            }
        })
        .await;
        assert!(
            matches!(result, Err(LockError::Timeout { .. })),
            "{result:?}"
        );
        (started.elapsed(), asked.load(Ordering::Relaxed))
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_ends_early_is_asked_again() {
        let (waited, asked) = acquire_with_early_wait(Duration::from_millis(300)).await;
        assert!(
            waited >= Duration::from_millis(500),
            "gave up after {waited:?}"
        );
        assert!(asked >= 2, "asked {asked} times");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_ends_just_before_its_deadline_sleeps_out_the_rest() {
        let (waited, asked) = acquire_with_early_wait(Duration::from_micros(800)).await;
        assert!(
            waited >= Duration::from_millis(500),
            "gave up after {waited:?}"
        );
        assert_eq!(asked, 1);
    }
}
