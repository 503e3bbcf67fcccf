//! The [`DistributedLock`] trait and its conveniences.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::capabilities::Capabilities;
use crate::close::CloseReport;
use crate::election::{Leader, LeaderStream, Leadership};
use crate::error::{LockError, Result};
use crate::guard::LockGuard;
use crate::inspect::Inspection;
use crate::multi::{AtOnce, LockSet};
use crate::name::LockName;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// A lock service: one backend (Redis, Postgres, …) or the in-process [`MemoryLock`](crate::MemoryLock).
///
/// Used as `Arc<dyn DistributedLock>` (see [`DynDistributedLock`]), so code can take any backend
/// and tests can swap in the memory backend. The required methods are the minimal set; the
/// conveniences live in [`DistributedLockExt`].
///
/// Every implementation passes the conformance suite (`dlock-conformance`); the case ids in the
/// `# Behavior` lists below name the checks.
#[async_trait]
pub trait DistributedLock: Debug + Display + Send + Sync + 'static {
    /// What this backend promises beyond the common contract.
    fn capabilities(&self) -> Capabilities;

    /// Acquires `name` if it is free, without waiting.
    ///
    /// # Behavior
    /// - Returns `Ok(None)` at once when someone else holds the lock
    ///   (`waiting::try_acquire_on_held_returns_none`), including this same client
    ///   (`exclusion::same_client_is_not_reentrant`).
    /// - Each success returns a fencing token above every earlier one for the name
    ///   (`fencing::tokens_strictly_increase`).
    /// - Bad options fail with [`LockError::InvalidArgument`] before any network call
    ///   (`input::bad_options_rejected`).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for bad options; [`LockError::Unavailable`] /
    /// [`LockError::Backend`] when the server fails. Never an error for contention.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no lock held beyond an
    /// owner-checked background release, and the client's records right
    /// (`cancel::dropped_acquire_race_leaves_nothing`, `cancel::storm_leaves_every_name_free`).
    async fn try_acquire(
        &self,
        name: &LockName,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>>;

    /// Acquires `name`, waiting until it is free or the options' wait timeout passes.
    ///
    /// Waiters are woken by the backend when the lock is released (see
    /// [`Capabilities::wake_on_release`]), so hand-off costs about one round trip.
    ///
    /// # Behavior
    /// - Waits while another guard holds the lock; returns [`LockError::Timeout`] within the
    ///   wait timeout plus one round trip (`waiting::acquire_times_out_within_bound`). A round
    ///   trip to a server that does not answer lasts the backend's command timeout and ends in
    ///   [`LockError::Unavailable`].
    /// - A release wakes the next waiter (`waiting::release_wakes_waiter`).
    /// - A holder that vanished frees the lock after its lease (`expiry::forgotten_holder_frees_after_ttl`).
    ///
    /// # Errors
    /// [`LockError::Timeout`], [`LockError::InvalidArgument`], [`LockError::Unavailable`],
    /// [`LockError::Backend`].
    ///
    /// A waiter whose connection is killed reconnects and keeps waiting within its wait timeout
    /// (`waiting::waiter_survives_killed_connection`); only a server that stays unreachable ends
    /// the wait early, with [`LockError::Unavailable`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future at any await point leaves no lock held, no waiter
    /// registered, and no client that refuses the name later (`cancel::dropped_acquire_leaves_nothing`,
    /// `cancel::storm_leaves_every_name_free`); the caller loses its place in the queue.
    async fn acquire(&self, name: &LockName, options: &LockOptions) -> Result<LockGuard>;

    /// Asks the server who holds `name` right now: whether it is held, the holder's fencing
    /// token, its remaining lease and how many wait, as far as the backend can know (see
    /// [`Inspection`] and [`Capabilities::inspect`]). A snapshot for operators (`dlock status`),
    /// stale as soon as it arrives: never a reason to skip an acquire.
    ///
    /// # Errors
    /// [`LockError::Unsupported`](crate::LockError::Unsupported) before any network call on a
    /// backend that cannot inspect (the default); [`LockError::Unavailable`](crate::LockError::Unavailable)
    /// / [`LockError::Backend`](crate::LockError::Backend) when the server fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads, so dropping the future at any await point changes nothing on
    /// the server.
    async fn inspect(&self, name: &LockName) -> Result<Inspection> {
        let _ = name;
        Err(crate::inspect::unsupported("this backend"))
    }

    /// Takes one of the `permits` permits of the semaphore `name` if one is free, without
    /// waiting.
    ///
    /// A semaphore is a lock that up to `permits` guards hold at once ("at most 3 backups across
    /// the fleet"); a mutex is a semaphore of one permit. Each permit is a lease like a lock's:
    /// it ends when its holder releases it, when its TTL runs out unrenewed, or with its
    /// session, so a holder that crashes gives its permit back, and a release is owner-checked,
    /// so releasing twice or after expiry never adds a permit. The [`Permit`] is a
    /// [`LockGuard`]: its fencing token rises above every earlier permit's and lock's of the
    /// name, and it has `lost()`, `status()`, `extend` and `release` as a lock's guard does.
    ///
    /// While a name is in use, every client must ask for the same number of permits: another
    /// number is refused, naming both. A name held as a lock is a semaphore of one permit.
    /// A backend whose server cannot keep a limit with a name
    /// ([`Capabilities::one_limit_per_name`] false: MySQL) takes the number as part of the
    /// semaphore's identity instead: other numbers, and the name's lock, are other semaphores.
    ///
    /// # Behavior
    /// - At most `permits` guards hold the name at once (`semaphore::at_most_n_hold_at_once`);
    ///   the next gets `Ok(None)` (`semaphore::try_beyond_the_limit_returns_none`).
    /// - Releasing a permit that already ended adds nothing
    ///   (`semaphore::stale_release_adds_nothing`).
    /// - Bad numbers are refused before any network call (`semaphore::bad_limits_refused`).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without semaphores (its
    /// [`Capabilities::max_permits`] is 0, the default); [`LockError::InvalidArgument`] for no
    /// permits, more than the backend keeps, a number other than the name's, or bad options;
    /// [`LockError::Unavailable`] / [`LockError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    async fn try_acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        options: &LockOptions,
    ) -> Result<Option<Permit>> {
        let _ = (name, permits, options);
        Err(crate::semaphore::unsupported("this backend"))
    }

    /// Takes one of the `permits` permits of the semaphore `name`, waiting until one is free
    /// or the options' wait timeout passes. See [`try_acquire_permit`](Self::try_acquire_permit).
    ///
    /// # Behavior
    /// - A waiter beyond the limit is woken by one release
    ///   (`semaphore::release_wakes_one_waiter`), and by a holder's lease ending
    ///   (`semaphore::forgotten_permit_comes_back`).
    /// - A cancelled wait leaves no permit held (`semaphore::cancel_storm_leaves_count_zero`).
    ///
    /// # Errors
    /// As [`try_acquire_permit`](Self::try_acquire_permit), plus [`LockError::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire): a dropped wait leaves no permit held and no
    /// waiter registered.
    async fn acquire_permit(
        &self,
        name: &LockName,
        permits: u32,
        options: &LockOptions,
    ) -> Result<Permit> {
        let _ = (name, permits, options);
        Err(crate::semaphore::unsupported("this backend"))
    }

    /// How many permits of the semaphore `name` are held now, as the server says (a snapshot,
    /// stale as soon as it arrives).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without semaphores;
    /// [`LockError::Unavailable`] / [`LockError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn count_permits(&self, name: &LockName) -> Result<u32> {
        let _ = name;
        Err(crate::semaphore::unsupported("this backend"))
    }

    /// Takes `name` as one of its **readers** if no writer holds it or waits for it, without
    /// waiting: `Ok(None)` otherwise.
    ///
    /// A reader-writer lock is the name's lock with a shared mode: readers of a name hold it
    /// together, and its writer, the holder of the name's lock
    /// ([`acquire`](Self::acquire), or [`write`](DistributedLockExt::write)), excludes every
    /// reader and other writer. **Writers go first**: once a writer waits, readers that arrive
    /// after it wait behind it, so a stream of readers never starves a writer
    /// (redisson/redisson #1542); when a writer releases, every reader waiting ahead of the
    /// next writer is let in together. A reader's guard is a [`LockGuard`] with the usual
    /// surface; its fencing token comes from the name's counter like a writer's, so it tells
    /// storage which writes the reader may have seen.
    ///
    /// There is no upgrade: a reader that wants to write releases and calls
    /// [`acquire`](Self::acquire), since two readers upgrading at once would each wait for the
    /// other forever (redisson/redisson #4796).
    ///
    /// # Behavior
    /// - Readers share; a writer excludes readers and writers
    ///   (`reader_writer::readers_share_and_a_writer_excludes`).
    /// - A waiting writer stops new readers (`reader_writer::writer_trumps_reader`).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without reader-writer locks (see
    /// [`Capabilities::reader_writer`]); [`LockError::InvalidArgument`] for bad options, or a
    /// name in use as a semaphore of several permits; [`LockError::Unavailable`] /
    /// [`LockError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`try_acquire`](Self::try_acquire).
    async fn try_read(&self, name: &LockName, options: &LockOptions) -> Result<Option<LockGuard>> {
        let _ = (name, options);
        Err(crate::reader_writer::unsupported("this backend"))
    }

    /// Takes `name` as one of its readers, waiting while a writer holds it or waits for it, up
    /// to the options' wait timeout. See [`try_read`](Self::try_read).
    ///
    /// # Behavior
    /// - Readers waiting behind a writer are let in together when it releases
    ///   (`reader_writer::waiting_readers_enter_together`).
    /// - A stream of overlapping readers never keeps a waiting writer out
    ///   (`reader_writer::reader_stream_never_starves_a_writer`).
    /// - A reader that vanishes frees its share with its lease or session
    ///   (`reader_writer::forgotten_reader_frees_its_share`).
    ///
    /// # Errors
    /// As [`try_read`](Self::try_read), plus [`LockError::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire): a dropped wait leaves nothing held and no
    /// waiter registered (`reader_writer::cancel_storm_leaves_nothing`).
    async fn read(&self, name: &LockName, options: &LockOptions) -> Result<LockGuard> {
        let _ = (name, options);
        Err(crate::reader_writer::unsupported("this backend"))
    }

    /// Campaigns to lead the election `name`: waits (within the options' wait timeout) until
    /// this candidate holds the name, publishes `value` as the leader's, and returns the
    /// [`Leadership`], whose term is the grant's fencing token.
    ///
    /// An election is a lock whose holder publishes a value: candidates queue for the name as
    /// lock waiters do, and leadership ends as a lock does (resign, a lease or session that
    /// ends, a holder taken over), firing [`Leadership::lost`]. A candidate whose own lease or
    /// session ends while it waits gets an error, never leadership.
    ///
    /// # Behavior
    /// - One leader at a time, each term above the last (`election::one_leader_at_a_time`).
    /// - A resignation hands over to the next candidate (`election::resign_hands_over`); a
    ///   crashed leader's term ends with its lease or session (`election::crashed_leader_hands_over`).
    /// - A dropped campaign leaves nothing behind (`election::dropped_campaign_leaves_nothing`).
    /// - The new leader's first publication of `value`, when it fails for a passing reason
    ///   ([`LockError::Unavailable`]) while the name stays held, is sent again after the
    ///   options' retry delay, a few times within the wait timeout; otherwise the hold is
    ///   resigned and the error returned.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without elections (see
    /// [`Capabilities::elections`]); [`LockError::InvalidArgument`] for a value longer than
    /// [`MAX_LEADER_VALUE`](crate::MAX_LEADER_VALUE) or bad options, before any network call;
    /// [`LockError::Timeout`]; [`LockError::Unavailable`] / [`LockError::Backend`].
    ///
    /// # Cancel safety
    /// Cancel safe: a campaign dropped at any await point leaves no hold and no candidate
    /// behind (a hold taken just before is resigned in the background).
    async fn campaign(
        &self,
        name: &LockName,
        value: &[u8],
        options: &LockOptions,
    ) -> Result<Leadership> {
        let _ = (name, value, options);
        Err(crate::election::unsupported("this backend"))
    }

    /// The leader of `name` now, as the server says: its term and value, or `None` when nobody
    /// leads. A snapshot, stale as soon as it arrives.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without elections;
    /// [`LockError::Unavailable`] / [`LockError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let _ = name;
        Err(crate::election::unsupported("this backend"))
    }

    /// Watches the leader of `name`: a stream of [`LeaderEvent`](crate::LeaderEvent)s starting
    /// with the current leader (or `Vacant`), then each change in order
    /// (`election::observe_sees_every_term`). After a connection loss it reconnects by itself
    /// and reports `Missed` where changes may have passed unseen.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a backend without elections;
    /// [`LockError::Unavailable`] / [`LockError::Backend`] when the first read fails.
    ///
    /// # Cancel safety
    /// Cancel safe; dropping the stream stops watching.
    async fn observe(&self, name: &LockName) -> Result<LeaderStream> {
        let _ = name;
        Err(crate::election::unsupported("this backend"))
    }

    /// Closes the client, for a service that stops: frees every lock it holds at once rather
    /// than leaving them until their leases run out, and says which it could not free.
    ///
    /// # Behavior
    /// - Every guard, permit, reader's share and leadership the client (and its clones) holds
    ///   is told it is lost ([`LostReason::ClientClosed`](crate::LostReason::ClientClosed):
    ///   `with_lock` work stops) and released, owner-checked, all at once; a waiter gets each
    ///   name within a round trip, not a lease (`close::frees_every_name_at_once`).
    /// - Every acquire waiting on this client ends with [`LockError::Closed`] and leaves its
    ///   queue; every later call answers `Closed` before any network call.
    /// - Then what the client keeps on the server beyond its locks is ended: etcd leases
    ///   revoked, the ZooKeeper session closed, SQL connections closed.
    /// - It returns by `within`, with the names whose release the server did not confirm by
    ///   then (server down or frozen) in [`CloseReport::unreleased`]
    ///   (`close::frozen_server_reports_what_it_could_not_release`). Closing again is a
    ///   no-op with a clean report.
    ///
    /// [`settle`](crate::settle) is unchanged: it waits for background releases of dropped
    /// guards, and leaves the client open.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] from an implementation without it (the default); the
    /// backends of this workspace all have it.
    ///
    /// # Cancel safety
    /// Cancel safe: the client is closed and its guards lost from the first poll, and the
    /// releases sent go on in the background; only the report is lost.
    async fn close(&self, within: std::time::Duration) -> Result<CloseReport> {
        let _ = within;
        Err(LockError::Unsupported {
            backend: "this backend",
            operation: "close",
        })
    }

    /// Takes every lock of `names` (sorted, each once, as
    /// [`try_acquire_all`](DistributedLockExt::try_acquire_all) passes them) in one step of the
    /// server, or none of them, for a backend that can; callers use `try_acquire_all` and
    /// `acquire_all`, which take the names one by one when this answers
    /// [`AtOnce::OneByOne`] (the default).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](Self::try_acquire): a dropped call leaves none of the locks held.
    async fn try_acquire_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<AtOnce> {
        let _ = (names, options);
        Ok(AtOnce::OneByOne)
    }
}

/// A permit of a semaphore: a [`LockGuard`] held while up to the semaphore's number of others
/// hold the same name (see [`DistributedLock::acquire_permit`]).
pub type Permit = LockGuard;

/// A lock service behind a pointer: `Arc<DynDistributedLock>`.
pub type DynDistributedLock = dyn DistributedLock;

/// `DistributedLock` for a pointer to one: every method forwarded (the lint makes a method
/// added to the trait fail to compile here until it is forwarded too).
macro_rules! forward_distributed_lock {
    ($wrapper:ident) => {
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<T: DistributedLock + ?Sized> DistributedLock for $wrapper<T> {
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(
                &self,
                name: &LockName,
                options: &LockOptions,
            ) -> Result<Option<LockGuard>> {
                (**self).try_acquire(name, options).await
            }
            async fn acquire(&self, name: &LockName, options: &LockOptions) -> Result<LockGuard> {
                (**self).acquire(name, options).await
            }
            async fn inspect(&self, name: &LockName) -> Result<Inspection> {
                (**self).inspect(name).await
            }
            async fn try_acquire_permit(
                &self,
                name: &LockName,
                permits: u32,
                options: &LockOptions,
            ) -> Result<Option<Permit>> {
                (**self).try_acquire_permit(name, permits, options).await
            }
            async fn acquire_permit(
                &self,
                name: &LockName,
                permits: u32,
                options: &LockOptions,
            ) -> Result<Permit> {
                (**self).acquire_permit(name, permits, options).await
            }
            async fn count_permits(&self, name: &LockName) -> Result<u32> {
                (**self).count_permits(name).await
            }
            async fn try_read(
                &self,
                name: &LockName,
                options: &LockOptions,
            ) -> Result<Option<LockGuard>> {
                (**self).try_read(name, options).await
            }
            async fn read(&self, name: &LockName, options: &LockOptions) -> Result<LockGuard> {
                (**self).read(name, options).await
            }
            async fn campaign(
                &self,
                name: &LockName,
                value: &[u8],
                options: &LockOptions,
            ) -> Result<Leadership> {
                (**self).campaign(name, value, options).await
            }
            async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
                (**self).leader(name).await
            }
            async fn observe(&self, name: &LockName) -> Result<LeaderStream> {
                (**self).observe(name).await
            }
            async fn close(&self, within: std::time::Duration) -> Result<CloseReport> {
                (**self).close(within).await
            }
            async fn try_acquire_at_once(
                &self,
                names: &[LockName],
                options: &LockOptions,
            ) -> Result<AtOnce> {
                (**self).try_acquire_at_once(names, options).await
            }
        }
    };
}

forward_distributed_lock!(Arc);
forward_distributed_lock!(Box);

/// What work run by [`DistributedLockExt::with_lock`] knows about its lock.
#[derive(Clone, Debug)]
pub struct LockContext {
    name: LockName,
    token: FencingToken,
    lost: CancellationToken,
}

impl LockContext {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token to send with every write to the protected resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// Cancelled when the lock is lost; for tasks the work spawns.
    pub fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }
}

/// Conveniences on every [`DistributedLock`], including `Arc<dyn DistributedLock>`.
pub trait DistributedLockExt: DistributedLock {
    /// [`acquire`](DistributedLock::acquire) with a `&str` name, validated first.
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire).
    fn acquire_str(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let name = LockName::new(name);
        async move { self.acquire(&name?, options).await }
    }

    /// [`try_acquire`](DistributedLock::try_acquire) with a `&str` name, validated first.
    ///
    /// # Cancel safety
    /// As [`try_acquire`](DistributedLock::try_acquire).
    fn try_acquire_str(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let name = LockName::new(name);
        async move { self.try_acquire(&name?, options).await }
    }

    /// Runs `work` while holding `name`: acquires (waiting as the options say), runs the work,
    /// and releases **after** the work has finished, so a database commit inside it is durable
    /// before the next holder reads (the commit-before-unlock rule).
    ///
    /// If the lock is lost while the work runs, the work's future is dropped at its next await
    /// point and the call returns [`LockError::Lost`]: the work must be written so that stopping
    /// at an await is safe (an uncommitted transaction rolls back when dropped).
    ///
    /// # Errors
    /// Whatever [`acquire`](DistributedLock::acquire) returns; [`LockError::Lost`] if the lock was
    /// lost during the work; the release's error if the work finished but the release failed
    /// (the server then no longer had this holder, so exclusion may have ended early).
    ///
    /// # Cancel safety
    /// Dropping it drops the work and the guard; the guard then releases in the background.
    ///
    /// # Examples
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use dlock_api::{DistributedLockExt, LockOptions, MemoryLock};
    /// let locks = MemoryLock::new();
    /// let left = locks
    ///     .with_lock("coupon:1", &LockOptions::new(), |ctx| async move {
    ///         // read, decrement, write (and commit) while holding the lock
    ///         let _fence = ctx.fencing_token();
    ///         99
    ///     })
    ///     .await?;
    /// assert_eq!(left, 99);
    /// # Ok(()) }
    /// ```
    fn with_lock<N, F, Fut, T>(
        &self,
        name: N,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        N: TryInto<LockName, Error = LockError> + Send,
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let name = name.try_into()?;
            let guard = self.acquire(&name, options).await?;
            hold_while(name, guard, work).await
        }
    }

    /// [`with_lock`](Self::with_lock) for a permit: runs `work` while holding one of the
    /// `permits` permits of the semaphore `name`, releases the permit after the work has
    /// finished, and drops the work at its next await point if the permit is lost.
    ///
    /// # Errors
    /// Whatever [`acquire_permit`](DistributedLock::acquire_permit) returns; [`LockError::Lost`]
    /// if the permit was lost during the work; the release's error.
    ///
    /// # Cancel safety
    /// Dropping it drops the work and the permit; the permit then goes back in the background.
    ///
    /// # Examples
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use dlock_api::{DistributedLockExt, LockOptions, MemoryLock};
    /// let locks = MemoryLock::new();
    /// // At most 3 backups at once, whichever machines run them.
    /// locks
    ///     .with_permit("backups", 3, &LockOptions::new(), |_ctx| async move {
    ///         // run the backup
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn with_permit<N, F, Fut, T>(
        &self,
        name: N,
        permits: u32,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        N: TryInto<LockName, Error = LockError> + Send,
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let name = name.try_into()?;
            let permit = self.acquire_permit(&name, permits, options).await?;
            hold_while(name, permit, work).await
        }
    }
    /// Takes `name` as its **writer**: the name's lock, which excludes its readers
    /// ([`read`](DistributedLock::read)) and every other writer. The same call as
    /// [`acquire`](DistributedLock::acquire), named for code that uses the name as a
    /// reader-writer lock; on a backend with
    /// [`reader_writer`](Capabilities::reader_writer), its wait stops readers that arrive after
    /// it.
    ///
    /// # Errors
    /// As [`acquire`](DistributedLock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](DistributedLock::acquire).
    fn write<'a>(
        &'a self,
        name: &'a LockName,
        options: &'a LockOptions,
    ) -> impl Future<Output = Result<LockGuard>> + Send + 'a {
        self.acquire(name, options)
    }

    /// [`write`](Self::write) without waiting: `Ok(None)` while a reader or writer holds the
    /// name. The same call as [`try_acquire`](DistributedLock::try_acquire).
    ///
    /// # Errors
    /// As [`try_acquire`](DistributedLock::try_acquire).
    ///
    /// # Cancel safety
    /// As [`try_acquire`](DistributedLock::try_acquire).
    fn try_write<'a>(
        &'a self,
        name: &'a LockName,
        options: &'a LockOptions,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send + 'a {
        self.try_acquire(name, options)
    }

    /// [`with_lock`](Self::with_lock) as a reader: runs `work` while `name` is held shared
    /// ([`read`](DistributedLock::read)), releases after, and drops the work at its next await
    /// point if the share is lost.
    ///
    /// # Errors
    /// Whatever [`read`](DistributedLock::read) returns; [`LockError::Lost`] if the share was
    /// lost during the work; the release's error.
    ///
    /// # Cancel safety
    /// Dropping it drops the work and the share; the share is released in the background.
    ///
    /// # Examples
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use dlock_api::{DistributedLockExt, LockOptions, MemoryLock};
    /// let locks = MemoryLock::new();
    /// // Many instances read the schema at once; a migration (`with_write`) waits for them.
    /// locks
    ///     .with_read("schema", &LockOptions::new(), |_ctx| async move {
    ///         // read
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn with_read<N, F, Fut, T>(
        &self,
        name: N,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        N: TryInto<LockName, Error = LockError> + Send,
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let name = name.try_into()?;
            let share = self.read(&name, options).await?;
            hold_while(name, share, work).await
        }
    }

    /// [`with_lock`](Self::with_lock) under the name of the writer's side of a reader-writer
    /// lock: the same call, since the writer is the name's lock.
    ///
    /// # Errors
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Cancel safety
    /// As [`with_lock`](Self::with_lock).
    fn with_write<N, F, Fut, T>(
        &self,
        name: N,
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        N: TryInto<LockName, Error = LockError> + Send,
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        self.with_lock(name, options, work)
    }

    /// [`with_lock`](Self::with_lock) for an election: campaigns for `name` with `value`, runs
    /// `work` while leading (its context's fencing token is the term), resigns after the work
    /// has finished, and drops the work at its next await point if leadership is lost, so a
    /// deposed leader stops acting.
    ///
    /// # Errors
    /// Whatever [`campaign`](DistributedLock::campaign) returns; [`LockError::Lost`] if
    /// leadership was lost during the work; the resignation's error.
    ///
    /// # Cancel safety
    /// Dropping it drops the work and resigns in the background.
    ///
    /// # Examples
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use dlock_api::{DistributedLockExt, LockOptions, MemoryLock};
    /// let locks = MemoryLock::new();
    /// // The nightly job runs on exactly one instance, fenced by its term.
    /// locks
    ///     .with_leadership("nightly-job", b"host-a", &LockOptions::new(), |ctx| async move {
    ///         let _term = ctx.fencing_token();
    ///         // run the job, sending the term with every write
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn with_leadership<N, F, Fut, T>(
        &self,
        name: N,
        value: &[u8],
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        N: TryInto<LockName, Error = LockError> + Send,
        F: FnOnce(LockContext) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let name = name.try_into()?;
            let leadership = self.campaign(&name, value, options).await?;
            hold_while(name, leadership.into_guard(), work).await
        }
    }
    /// Takes every lock of `names` together: sorted and each once, so every caller takes a
    /// set in one order and two sets never deadlock, within **one** wait deadline for the whole
    /// set (the options' wait timeout). On a timeout, an error, a member lost before the set is
    /// complete, or a dropped future, every member already taken is released (owner-checked,
    /// last first) and nothing stays held.
    ///
    /// # Behavior
    /// - Opposite orders on two clients finish without deadlock (`multi::opposite_orders_finish`).
    /// - The set waits once, not once per member (`multi::one_wait_for_the_set`).
    /// - A set that times out leaves its members free (`multi::timeout_leaves_nothing_held`).
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for no names or bad options, before any network call;
    /// [`LockError::Timeout`] (naming the member it waited for, with the set's whole wait);
    /// whatever a member's acquire returns.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future releases every member taken so far in the background
    /// and leaves no waiter (`multi::dropped_acquire_all_leaves_nothing`).
    fn acquire_all(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> impl Future<Output = Result<LockSet>> + Send {
        crate::multi::acquire_all(self, names, options)
    }

    /// [`acquire_all`](Self::acquire_all) without waiting: `Ok(None)`, with nothing held, if any
    /// member is taken.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without `Timeout`.
    ///
    /// # Cancel safety
    /// As [`acquire_all`](Self::acquire_all).
    fn try_acquire_all(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> impl Future<Output = Result<Option<LockSet>>> + Send {
        crate::multi::try_acquire_all(self, names, options)
    }

    /// Runs `work` while holding every lock of `names` (see [`acquire_all`](Self::acquire_all)),
    /// with each member's name and fencing token; releases after the work has finished, and
    /// drops the work at its next await point if any member is lost.
    ///
    /// # Errors
    /// Whatever [`acquire_all`](Self::acquire_all) returns; [`LockError::Lost`] if a member was
    /// lost during the work; a release's error.
    ///
    /// # Cancel safety
    /// Dropping it drops the work and releases every member in the background.
    ///
    /// # Examples
    /// ```
    /// # async fn demo() -> dlock_api::Result<()> {
    /// use dlock_api::{DistributedLockExt, LockName, LockOptions, MemoryLock};
    /// let locks = MemoryLock::new();
    /// // A transfer in either direction takes both accounts in the same order.
    /// let accounts = [LockName::new("account:7")?, LockName::new("account:3")?];
    /// locks
    ///     .with_locks(&accounts, &LockOptions::new(), |tokens| async move {
    ///         assert_eq!(tokens[0].0.as_str(), "account:3");
    ///         // debit one, credit the other, each write with its own account's token
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    fn with_locks<F, Fut, T>(
        &self,
        names: &[LockName],
        options: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(Vec<(LockName, FencingToken)>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let set = self.acquire_all(names, options).await?;
            crate::multi::hold_all_while(set, work).await
        }
    }
}

/// Runs `work` while `guard` holds `name`, and releases it after: the work of
/// [`with_lock`](DistributedLockExt::with_lock) and
/// [`with_permit`](DistributedLockExt::with_permit).
async fn hold_while<F, Fut, T>(name: LockName, guard: LockGuard, work: F) -> Result<T>
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = T>,
{
    let context = LockContext {
        name: name.clone(),
        token: guard.fencing_token(),
        lost: guard.lost_token(),
    };
    let outcome = tokio::select! {
        biased;
        reason = guard.lost() => Err(reason),
        output = work(context) => Ok(output),
    };
    match outcome {
        Ok(output) => {
            guard.release().await?;
            Ok(output)
        }
        Err(reason) => {
            // Owner-checked: never touches a new holder's lock.
            let _ = guard.release().await;
            Err(LockError::Lost {
                name: name.to_string(),
                reason,
            })
        }
    }
}

impl<T: DistributedLock + ?Sized> DistributedLockExt for T {}
