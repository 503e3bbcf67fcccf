//! Elections through the engine: a campaign is an acquire followed by the leader's first
//! publication, and what a backend reports to observers is filtered of repeats here, once.

use std::sync::{Arc, Mutex};

use futures::StreamExt;

use tokio::time::Instant;

use super::engine::{RawLock, acquire};
use super::time::after;
use crate::election::{Leader, LeaderEvent, LeaderStream, Leadership, check_value, unsupported};
use crate::error::Result;
use crate::name::LockName;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// How many times a new leader's first publication is sent. Bounded even within a long wait:
/// the hold is kept meanwhile, and a failure that lasts (a SQL session that waits for this very
/// name while holding the record's row, so that each attempt is a deadlock's victim again) must
/// end in a resignation that lets the other go on, not in attempts that keep it waiting.
const PUBLISH_ATTEMPTS: u32 = 5;

/// [`DistributedLock::campaign`](crate::DistributedLock::campaign) for a [`RawLock`]: the
/// capability and the value are checked before any network call; the name is acquired as a
/// lock, and the value published under the new term before the leadership is returned. A
/// publication that fails for a passing reason while the name stays held (a SQL write chosen as
/// a deadlock's victim, a session suspended for a moment) is tried again after the options'
/// retry delay, within the wait timeout and up to `PUBLISH_ATTEMPTS` (5) times; one that fails for
/// good resigns at once (owner-checked), so a failed campaign leaves no hold behind
/// (etcd-io/etcd #21128).
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// Cancel safe: a campaign dropped while waiting leaves nothing queued (as `acquire`); dropped
/// during the publication, its guard is dropped too and resigns in the background.
pub async fn campaign<B: RawLock + ?Sized>(
    backend: &B,
    name: &LockName,
    value: &[u8],
    options: &LockOptions,
) -> Result<Leadership> {
    if !backend.capabilities().elections {
        return Err(unsupported(backend.backend()));
    }
    check_value(value)?;
    let deadline = options
        .wait_timeout()
        .map(|wait| after(Instant::now(), wait));
    let guard = acquire(backend, name, &options.clone().for_campaign(value)).await?;
    let mut attempts = 0;
    loop {
        let Err(error) = guard.publish(value).await else {
            return Ok(Leadership::new(guard, value.to_vec()));
        };
        let wake = after(Instant::now(), options.retry().delay(attempts));
        let in_time = deadline.is_none_or(|deadline| wake < deadline);
        let again = attempts.saturating_add(1) < PUBLISH_ATTEMPTS;
        if !(error.is_retryable() && in_time && again && guard.is_held()) {
            let _ = guard.release().await;
            return Err(error);
        }
        tracing::debug!(%name, %error, "dlock: a new leader's first proclaim failed; trying again");
        attempts = attempts.saturating_add(1);
        tokio::time::sleep_until(wake).await;
    }
}

/// [`DistributedLock::leader`](crate::DistributedLock::leader) for a [`RawLock`].
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn leader<B: RawLock + ?Sized>(backend: &B, name: &LockName) -> Result<Option<Leader>> {
    if !backend.capabilities().elections {
        return Err(unsupported(backend.backend()));
    }
    backend.holdings().check_open(backend.backend())?;
    backend.leader(name).await
}

/// [`DistributedLock::observe`](crate::DistributedLock::observe) for a [`RawLock`]: the
/// backend's stream without repeats (a state equal to the last one reported is dropped; an
/// error or a `Missed` is always passed on, and a state after a `Missed` is reported even if
/// it equals the one before).
///
/// # Errors
/// As the trait method.
///
/// # Cancel safety
/// Cancel safe: dropping the future or the stream leaves nothing registered.
pub async fn observe<B: RawLock + ?Sized>(backend: &B, name: &LockName) -> Result<LeaderStream> {
    if !backend.capabilities().elections {
        return Err(unsupported(backend.backend()));
    }
    backend.holdings().check_open(backend.backend())?;
    let changes = backend.observe_leader(name).await?;
    let mut last: Option<LeaderEvent> = None;
    Ok(changes
        .filter(move |item| {
            let report = match item {
                Ok(LeaderEvent::Missed) => {
                    last = None;
                    true
                }
                Ok(event) if last.as_ref() == Some(event) => false,
                Ok(event) => {
                    last = Some(event.clone());
                    true
                }
                Err(_) => true,
            };
            std::future::ready(report)
        })
        .boxed())
}

/// The leader record a campaign's grant wrote itself (the campaign's value, with the grant's
/// token as its term), kept by the lease until the campaign's first proclaim, which is then
/// already done. A backend whose grant can write the record (its acquire script or
/// transaction, the waiting statement, or the queue entry that carries the value) saves the new
/// leader that round trip; every other proclaim writes as usual.
#[derive(Debug, Default)]
pub struct RecordAtGrant(Mutex<Option<(u64, Arc<[u8]>)>>);

impl RecordAtGrant {
    /// Notes that the grant wrote `value` as the record of the term `term`.
    pub fn wrote(&self, term: u64, value: Arc<[u8]>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((term, value));
    }

    /// Whether a proclaim of `value` under `term` is what the grant wrote; the note is
    /// forgotten either way, so this answers yes at most once.
    pub fn answers(&self, term: FencingToken, value: &[u8]) -> bool {
        let written = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        written.is_some_and(|(at, by)| at == term.get() && *by == *value)
    }
}
