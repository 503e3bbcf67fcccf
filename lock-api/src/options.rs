//! Per-call lock options: lease, wait, renewal, maximum hold time, retry.

use std::time::Duration;

use rand::Rng;

use crate::error::{LockError, Result};

/// How an acquire behaves: lease length, how long to wait, whether to renew.
///
/// Built with `with_` setters; the plain names are getters. The defaults are what a Redisson user
/// gets from `lock()`: a 30 s lease renewed by a watchdog every 10 s for as long as the guard is
/// held, and `acquire` waiting without limit.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use dlock_api::{LockOptions, Renewal};
/// let opts = LockOptions::new()
///     .with_ttl(Duration::from_secs(10))
///     .with_wait_timeout(Duration::from_secs(3))
///     .with_renewal(Renewal::Off);
/// assert_eq!(opts.ttl(), Duration::from_secs(10));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LockOptions {
    ttl: Duration,
    wait_timeout: Option<Duration>,
    renewal: Renewal,
    max_hold: Option<Duration>,
    retry: RetryPolicy,
    /// Set by the engine for a campaign's wait, with the value the candidate publishes (see
    /// [`is_campaign`](Self::is_campaign)).
    campaign: Option<std::sync::Arc<[u8]>>,
    /// Set by the engine for a reader's claim (see [`is_shared`](Self::is_shared)).
    shared: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            wait_timeout: None,
            renewal: Renewal::Auto { interval: None },
            max_hold: None,
            retry: RetryPolicy::default(),
            campaign: None,
            shared: false,
        }
    }
}

impl LockOptions {
    /// The default lease length (Redisson's watchdog default).
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The longest lease accepted; longer ones are surely a unit mistake.
    pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
    /// The shortest lease, renewal interval and retry delay accepted: shorter ones would make a
    /// client spin against its server.
    pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

    /// The defaults: 30 s lease, automatic renewal, wait without limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether these are a campaign's options ([`DistributedLock::campaign`](crate::DistributedLock::campaign)
    /// sets it; no setter exists). For backends: a lock's waiter whose session or lease ends
    /// while it waits joins the line again on a new one, within its wait; a **candidate's** wait
    /// fails instead with [`LockError::Lost`] (`SessionExpired`), since a candidate told it leads
    /// after its place was lost could be a second leader (etcd-io/etcd #19597), and the caller
    /// decides whether to stand again.
    pub fn is_campaign(&self) -> bool {
        self.campaign.is_some()
    }

    /// The value a campaign's candidate publishes once it leads, for a backend whose grant can
    /// write the leader's record itself (in the grant's own statement, with the grant's token
    /// as the term), so that a new leader needs no round trip of its own before it leads. The
    /// engine publishes it after the grant all the same; a backend that wrote it with the grant
    /// answers that publish without a second write. `None` outside a campaign.
    pub fn campaign_value(&self) -> Option<&[u8]> {
        self.campaign.as_deref()
    }

    /// These options, for the wait of a campaign that publishes `value`.
    pub(crate) fn for_campaign(mut self, value: &[u8]) -> Self {
        self.campaign = Some(value.into());
        self
    }

    /// Whether these are a reader's options ([`DistributedLock::read`](crate::DistributedLock::read)
    /// sets it; no setter exists). For backends with
    /// [`reader_writer`](crate::Capabilities::reader_writer): the grant asked for is a **shared**
    /// hold of the name, which other readers may hold at once and which the name's lock (its
    /// writer) excludes; a reader is granted only while no writer holds the name **or waits
    /// for it** (writer preference). A backend without the capability is never asked.
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// These options, for a reader's claim.
    pub(crate) fn for_read(mut self) -> Self {
        self.shared = true;
        self
    }

    /// How long the lock stays held if the holder vanishes (and, without renewal, at all).
    /// Session backends (MySQL, Postgres) ignore it: their lease is the connection.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`acquire`](crate::DistributedLock::acquire) may wait before
    /// [`LockError::Timeout`]. Unset: wait without limit. Any duration is accepted: one too long
    /// to be reached (`Duration::MAX`, or anything from
    /// [`raw::time::UNREACHABLE`](crate::raw::time::UNREACHABLE), about 100 years) also means
    /// "wait without limit", as it does for tokio's timers.
    pub fn with_wait_timeout(mut self, wait: Duration) -> Self {
        self.wait_timeout = Some(wait);
        self
    }

    /// Removes the wait limit again.
    pub fn without_wait_timeout(mut self) -> Self {
        self.wait_timeout = None;
        self
    }

    /// Whether a watchdog renews the lease while the guard is held.
    pub fn with_renewal(mut self, renewal: Renewal) -> Self {
        self.renewal = renewal;
        self
    }

    /// The longest the lock may be held, renewal or not: after that the guard stops renewing,
    /// releases the lock and fires [`lost`](crate::LockGuard::lost) with
    /// [`LostReason::MaxHoldExceeded`](crate::LostReason::MaxHoldExceeded). Enforced by the client.
    /// As with the wait timeout, a duration too long to be reached means no limit.
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Back-off between attempts for backends that must poll (and for fallback re-checks).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait limit, if any.
    pub fn wait_timeout(&self) -> Option<Duration> {
        self.wait_timeout
    }

    /// The renewal setting.
    pub fn renewal(&self) -> Renewal {
        self.renewal
    }

    /// The interval at which the watchdog renews, if renewal is on: the configured one, or a third
    /// of the TTL.
    pub fn renewal_interval(&self) -> Option<Duration> {
        match self.renewal {
            Renewal::Off => None,
            Renewal::Auto { interval } => {
                Some(interval.unwrap_or_else(|| self.ttl.checked_div(3).unwrap_or_default()))
            }
        }
    }

    /// The maximum hold time, if any.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The retry policy.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// Checks the options on their own; backends call this (through
    /// [`Capabilities::check`](crate::Capabilities::check)) before any network call.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a TTL under 1 ms or over [`Self::MAX_TTL`], a renewal
    /// interval under 1 ms or not shorter than the TTL, a zero maximum hold time, or a malformed
    /// retry policy. The wait timeout and maximum hold time take any other duration (a
    /// duration too long to be reached means no limit).
    pub fn validate(&self) -> Result<()> {
        if self.ttl.is_zero() {
            return Err(LockError::invalid("ttl", "must be greater than zero"));
        }
        if self.ttl < Duration::from_millis(1) {
            return Err(LockError::invalid("ttl", "must be at least 1 ms"));
        }
        if self.ttl > Self::MAX_TTL {
            return Err(LockError::invalid(
                "ttl",
                format!("{:?} is longer than the limit of 365 days", self.ttl),
            ));
        }
        if let Some(interval) = self.renewal_interval() {
            let derived = matches!(self.renewal, Renewal::Auto { interval: None });
            if derived && interval < Self::MIN_INTERVAL {
                return Err(LockError::invalid(
                    "ttl",
                    format!(
                        "{:?} is too short to renew (a third of it is under 1 ms): use Renewal::Off or a longer ttl",
                        self.ttl
                    ),
                ));
            }
            if interval < Self::MIN_INTERVAL || interval >= self.ttl {
                return Err(LockError::invalid(
                    "renewal interval",
                    format!(
                        "{interval:?} must be at least 1 ms and below the ttl {:?}",
                        self.ttl
                    ),
                ));
            }
        }
        if self.max_hold.is_some_and(|d| d.is_zero()) {
            return Err(LockError::invalid(
                "max hold time",
                "must be greater than zero",
            ));
        }
        self.retry.validate()
    }
}

/// Whether a watchdog keeps the lease alive while the guard is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Renewal {
    /// No renewal: the lock ends at the TTL unless [`extend`](crate::LockGuard::extend)ed.
    Off,
    /// Renew every `interval` (default: a third of the TTL) until release, drop or max hold.
    Auto {
        /// The renewal interval; `None` means a third of the TTL.
        interval: Option<Duration>,
    },
}

impl Renewal {
    /// Renewal every third of the TTL.
    pub const fn auto() -> Self {
        Self::Auto { interval: None }
    }

    /// Renewal every `interval`.
    pub const fn every(interval: Duration) -> Self {
        Self::Auto {
            interval: Some(interval),
        }
    }
}

/// Exponential back-off with full jitter, for backends that must poll.
///
/// Attempt `n` (from 0) waits a random time in `[0, min(max, initial * multiplier^n)]`, or the
/// upper bound itself without jitter. Notification-based backends use it only for their fallback
/// re-checks.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(500),
            multiplier: 2.0,
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// Exponential back-off from `initial` up to `max`, doubling, with jitter.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            ..Self::default()
        }
    }

    /// The growth factor per attempt (at least 1).
    pub fn with_multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// Whether to pick a random delay up to the bound (true, the default) or the bound itself.
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay before attempt `attempt` (counting from 0). Never panics, whatever the policy:
    /// a product too large for a `Duration` is `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = self.multiplier.powi(attempt.min(64) as i32).min(1e6);
        let bound = Duration::try_from_secs_f64(self.initial.as_secs_f64() * factor)
            .unwrap_or(self.max)
            .min(self.max);
        if self.jitter {
            bound.mul_f64(rand::rng().random_range(0.0..=1.0))
        } else {
            bound
        }
    }

    fn validate(&self) -> Result<()> {
        if self.initial < LockOptions::MIN_INTERVAL || self.max < self.initial {
            return Err(LockError::invalid(
                "retry policy",
                "needs 1 ms <= initial <= max",
            ));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(LockError::invalid(
                "retry policy",
                "multiplier must be a finite number >= 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        LockOptions::new().validate().unwrap();
    }

    #[test]
    fn rejects_bad_values() {
        let bad = [
            LockOptions::new().with_ttl(Duration::ZERO),
            LockOptions::new().with_ttl(Duration::from_secs(400 * 24 * 3600)),
            LockOptions::new().with_renewal(Renewal::every(Duration::from_secs(60))),
            LockOptions::new().with_max_hold(Duration::ZERO),
            LockOptions::new().with_retry(RetryPolicy::exponential(Duration::ZERO, Duration::ZERO)),
            LockOptions::new().with_retry(RetryPolicy::exponential(
                Duration::from_nanos(1),
                Duration::MAX,
            )),
            LockOptions::new().with_renewal(Renewal::every(Duration::from_nanos(1))),
        ];
        for opts in bad {
            assert!(
                matches!(opts.validate(), Err(LockError::InvalidArgument { .. })),
                "{opts:?}"
            );
        }
    }

    #[test]
    fn extreme_policies_never_panic() {
        let huge = RetryPolicy::exponential(Duration::MAX, Duration::MAX).with_multiplier(1e300);
        for attempt in [0, 1, 63, 64, u32::MAX] {
            assert!(huge.delay(attempt) <= Duration::MAX);
        }
        let opts = LockOptions::new()
            .with_wait_timeout(Duration::MAX)
            .with_max_hold(Duration::MAX)
            .with_retry(huge);
        opts.validate().unwrap();
    }

    #[test]
    fn backoff_grows_and_caps() {
        let p = RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(100))
            .with_jitter(false);
        assert_eq!(p.delay(0), Duration::from_millis(10));
        assert_eq!(p.delay(1), Duration::from_millis(20));
        assert_eq!(p.delay(10), Duration::from_millis(100));
        let j = RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(100));
        assert!(j.delay(3) <= Duration::from_millis(80));
    }
}
