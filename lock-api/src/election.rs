//! Leader election: one leader per name at a time, a term that fences, a value others can read
//! and watch.
//!
//! An election is a lock whose holder publishes a value. A candidate campaigns by acquiring the
//! name as a lock (so it queues, waits, renews and is lost exactly as a lock's holder is), and the
//! grant's fencing token is its **term**: above every earlier term of the name, so storage that
//! keeps the highest term it has seen refuses a deposed leader's writes
//! ([`FencingGate`](crate::FencingGate)). Once it holds, it writes its value to the server,
//! owner-checked, where [`leader`](crate::DistributedLock::leader) and
//! [`observe`](crate::DistributedLock::observe) read it; a leader whose hold has ended is never
//! reported, whatever record it left.

use std::fmt;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use futures::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{LockError, Result};
use crate::guard::{LockGuard, Lost};
use crate::name::LockName;
use crate::status::LockStatus;
use crate::token::FencingToken;

/// The longest value a leader publishes, in bytes: room for an address, a host name or a small
/// JSON object, on every backend's server.
pub const MAX_LEADER_VALUE: usize = 4096;

/// A name's leader as the server says: its term and the value it published.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    term: FencingToken,
    value: Vec<u8>,
}

impl Leader {
    /// The leader of `term` that published `value`.
    pub fn new(term: FencingToken, value: impl Into<Vec<u8>>) -> Self {
        Self {
            term,
            value: value.into(),
        }
    }

    /// The term: the fencing token of the leader's grant.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// The value the leader published (at its campaign, or its latest proclaim).
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The value as text, if it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Leader");
        out.field("term", &self.term.get());
        match self.value_str() {
            Some(text) => out.field("value", &text),
            None => out.field("value", &self.value),
        };
        out.finish()
    }
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value_str() {
            Some(text) => write!(f, "term {}: {text}", self.term.get()),
            None => write!(f, "term {}: {} bytes", self.term.get(), self.value.len()),
        }
    }
}

/// A change [`observe`](crate::DistributedLock::observe) reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This leader leads: a new term, or the same term with a new value it proclaimed.
    Leads(Leader),
    /// Nobody leads.
    Vacant,
    /// The observer may have missed changes before the next event (its connection was lost, or
    /// the server no longer keeps the history it would need): what follows is the name's state
    /// now, not the next change after the last one reported.
    Missed,
}

/// The stream [`observe`](crate::DistributedLock::observe) returns: every change of a name's
/// leader, in order, starting with the current one. An `Err` item does not end it: the
/// observer reconnects, says [`LeaderEvent::Missed`] if it cannot prove it missed nothing, and
/// goes on. It ends only when dropped.
pub type LeaderStream = Pin<Box<dyn Stream<Item = Result<LeaderEvent>> + Send>>;

/// A won campaign: this client leads `name` for the term of its grant until it resigns, drops
/// this, or loses the lock under it.
///
/// It is a [`LockGuard`] with a value: renewal, `lost()`, `status()` and the background release
/// of a dropped guard are the lock's. Stop acting as leader as soon as [`lost`](Self::lost)
/// fires, and send [`term`](Self::term) with every write to storage that must refuse a deposed
/// leader.
#[must_use = "if unused the leadership is resigned immediately"]
#[clippy::has_significant_drop]
pub struct Leadership {
    guard: LockGuard,
    value: Mutex<Vec<u8>>,
}

impl Leadership {
    pub(crate) fn new(guard: LockGuard, value: Vec<u8>) -> Self {
        Self {
            guard,
            value: Mutex::new(value),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockName {
        self.guard.name()
    }

    /// This leadership's term: a fencing token above every earlier term (and lock) of the name.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value this leader published last.
    pub fn value(&self) -> Vec<u8> {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether this client still leads, as far as it knows.
    pub fn is_held(&self) -> bool {
        self.guard.is_held()
    }

    /// Held, suspended (the session lost its connection: stop acting until it is held again)
    /// or lost, as [`LockGuard::status`].
    pub fn status(&self) -> LockStatus {
        self.guard.status()
    }

    /// When the lease under the leadership ends unless renewed; `None` on session backends.
    pub fn valid_until(&self) -> Option<Instant> {
        self.guard.valid_until()
    }

    /// Resolves when the leadership is lost, with the reason.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub fn lost(&self) -> Lost<'_> {
        self.guard.lost()
    }

    /// A token cancelled when the leadership is lost, for spawned work.
    pub fn lost_token(&self) -> CancellationToken {
        self.guard.lost_token()
    }

    /// The lock under the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Publishes `value` as this leader's, for [`leader`](crate::DistributedLock::leader) and
    /// observers; owner-checked on the server, so a leader whose term has ended can never
    /// overwrite its successor's value.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] for a value longer than [`MAX_LEADER_VALUE`], before any
    /// network call; [`LockError::Unavailable`] without a network call while the session is
    /// suspended (the leadership may come back); [`LockError::Lost`] without a network call once the leadership is known
    /// lost; [`LockError::NotHeld`] if the server says this term is over (the leadership is
    /// then lost); [`LockError::Unavailable`] / [`LockError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    /// Dropping it leaves the leadership held; the new value may or may not have been published.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        let value = value.as_ref();
        check_value(value)?;
        self.guard.publish(value).await?;
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = value.to_vec();
        Ok(())
    }

    /// Gives up leadership and waits for the server to confirm: the next candidate is let in.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// Cancel safe: the resignation runs to completion in the background if dropped.
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// The lock under the leadership, to hold and release as a lock: the leader's record stays
    /// until the lock ends.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.name())
            .field("term", &self.term().get())
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

/// Refuses a value no backend is asked to keep.
pub(crate) fn check_value(value: &[u8]) -> Result<()> {
    if value.len() > MAX_LEADER_VALUE {
        return Err(LockError::invalid(
            "value",
            format!(
                "a leader's value is at most {MAX_LEADER_VALUE} bytes; this one has {}",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// [`LockError::Unsupported`] for an election call on a backend without elections.
pub(crate) fn unsupported(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        operation: "elections",
    }
}

/// How long an observer whose server failed waits before it reads again, so a server that is
/// down is not asked in a spin.
pub const OBSERVE_RETRY: Duration = Duration::from_millis(250);
