//! What dlock tells your tracing subscriber and your metrics recorder.
//!
//! Every backend goes through one engine ([`raw::acquire`](crate::raw::acquire), the guard, the
//! shared watchdog, [`raw::Session`](crate::raw::Session) and
//! [`raw::LeaseState`](crate::raw::LeaseState)), and that engine is where dlock reports, so a
//! backend reports the same spans, events and metrics without writing any of it.
//!
//! Spans and events go through the [`tracing`] facade, always compiled in (they cost a branch
//! when no subscriber listens). Metrics go through the [`metrics`](https://docs.rs/metrics)
//! facade behind the crate feature `metrics` (`dlock-rs/metrics` on the facade): without it no
//! metric code is compiled in. Install any recorder (`metrics-exporter-prometheus`, say), then
//! optionally call `describe_metrics` to give each metric its help text and unit.
//!
//! ## Fields and labels
//!
//! One vocabulary everywhere: a span field, an event field and a metric label with the same
//! name mean the same thing.
//!
//! | field / label | in | values |
//! |---|---|---|
//! | `backend` | every span, event and metric | the backend's tag: `memory`, `redis`, `redlock`, `mysql`, `postgres`, `etcd`, `zookeeper` |
//! | `name` | spans and events, **never metrics** | the lock name |
//! | `token` | spans and events | the fencing token of the acquire, once granted |
//! | `op` | `dlock.acquire` span, acquire metrics | `acquire` (waits) or `try_acquire` (does not) |
//! | `outcome` | `dlock.acquire` span, acquire metrics | `acquired`, `busy` (`try_acquire` found it held), `timeout` (the wait timeout passed), `error` (refused options or a backend failure), `cancelled` (the acquire future was dropped) |
//! | `outcome` | renewal event, `dlock_renewals_total` | `ok`, `failed` |
//! | `wait_ms` | `dlock.acquire` span | milliseconds a blocking acquire spent waiting for its grant (`acquire` only) |
//! | `error` | `dlock.acquire` span, renewal event | the error with its causes, `: `-separated ([`error_chain`](crate::error_chain)) |
//! | `reason` | loss event, `dlock_losses_total` | `expired`, `renewal_failed`, `taken_over`, `session_closed`, `session_expired`, `max_hold_exceeded` (see [`LostReason`]) |
//! | `end` | `dlock_hold_duration_seconds` | how a guard ended: `released`, `dropped` (released in the background), `forgotten`, `lost` (lost before its release or drop) |
//! | `retrying` | renewal event | whether the watchdog tries again (the lease still has time) |
//!
//! ## Spans and events (target `dlock_api`)
//!
//! | what | level | fields |
//! |---|---|---|
//! | span `dlock.acquire`, one per `acquire` / `try_acquire` call | INFO | `backend`, `name`, `op`, `outcome`, `wait_ms`, `token`, `error` |
//! | event `renewal failed` | WARN | `backend`, `name`, `token`, `error`, `retrying` |
//! | event `lock lost` | WARN | `backend`, `name`, `token`, `reason` |
//! | event `session suspended` (its guards report [`Suspended`](crate::LockStatus::Suspended)) | WARN | `backend`, `until_ms` (milliseconds it may still come back in) |
//! | event `session resumed` (its guards are held again) | INFO | `backend` |
//! | event `lock guard dropped without release()` | WARN | `backend`, `name`, `token` |
//!
//! The backend's own events (a reconnect, a retried statement) that happen during an acquire
//! are inside its `dlock.acquire` span. Suspension belongs to a session, which carries many
//! guards, so it is reported once per session (for sessions that have carried a guard), not once
//! per guard; the guards' losses when a session ends are reported per guard.
//!
//! A loss is reported when this client learns of it: at once when the watchdog, the backend or
//! the server's answer marks it (a failed renewal, a taken-over lease, an evicted holder, a
//! closed connection); a lease that just runs out, or a session that ends, is noticed when
//! something looks at the guard, at the latest on its release or drop.
//!
//! There is no hand-off event: a grant does not say whether it followed another holder's
//! release or found the lock free, and only the server knows. The wait time shows hand-offs
//! from the waiter's side.
//!
//! ## Metrics (feature `metrics`)
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `dlock_acquires_total` | counter | `backend`, `op`, `outcome` | every acquire and try-acquire call |
//! | `dlock_acquire_duration_seconds` | histogram | `backend`, `op`, `outcome` | acquire latency: the whole call |
//! | `dlock_wait_duration_seconds` | histogram | `backend`, `outcome` | blocking acquires: time waiting for the grant, bounded by the wait timeout |
//! | `dlock_hold_duration_seconds` | histogram | `backend`, `end` | from the grant until the guard is released, dropped or forgotten |
//! | `dlock_active_guards` | gauge | `backend` | guards alive in this process (lost ones too, until released or dropped) |
//! | `dlock_renewals_total` | counter | `backend`, `outcome` | every renewal the watchdog attempts |
//! | `dlock_losses_total` | counter | `backend`, `reason` | guards lost, by reason |
//! | `dlock_suspensions_total` | counter | `backend` | sessions carrying guards that lost their connection |
//! | `dlock_resumptions_total` | counter | `backend` | suspended sessions that came back in time |
//!
//! **Contention** is counted as what the engine can see honestly, attempts per grant:
//! `sum(dlock_acquires_total) / dlock_acquires_total{outcome="acquired"}`, where a `busy`
//! try-acquire and a `timeout` are attempts without a grant. A blocking acquire is one attempt
//! however long it waits (the engine cannot tell a server-side wait from a slow round trip);
//! how long grants waited is `dlock_wait_duration_seconds`, whose uncontended floor is one
//! round trip.
//!
//! **No lock names in labels.** Every label above takes a handful of values. Lock names are
//! unbounded (`order:{id}`), and a label per name would grow the recorder, and the monitoring
//! system behind it, without limit. Names are in the spans and events instead, where a
//! per-name question belongs.

mod labels;

use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use crate::error::LockError;
use crate::name::LockName;
use crate::raw::LeaseState;
use crate::status::LostReason;
use crate::token::FencingToken;
#[cfg(feature = "metrics")]
use labels::BackendKeys;
pub(crate) use labels::{End, Op, Outcome};

/// How a [`LostReason`] appears as the `reason` field and label.
pub(crate) fn reason_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::RenewalFailed => "renewal_failed",
        LostReason::TakenOver => "taken_over",
        LostReason::SessionClosed => "session_closed",
        LostReason::SessionExpired => "session_expired",
        LostReason::MaxHoldExceeded => "max_hold_exceeded",
        LostReason::ClientClosed => "client_closed",
    }
}

/// Gives every dlock metric its help text and unit on the installed recorder. Optional (a
/// recorder exports the metrics without it); call it after installing the recorder.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "dlock_acquires_total",
        Unit::Count,
        "Acquire and try-acquire calls, by backend, op and outcome"
    );
    describe_histogram!(
        "dlock_acquire_duration_seconds",
        Unit::Seconds,
        "Acquire latency: the whole acquire or try-acquire call"
    );
    describe_histogram!(
        "dlock_wait_duration_seconds",
        Unit::Seconds,
        "Time blocking acquires waited for their grant"
    );
    describe_histogram!(
        "dlock_hold_duration_seconds",
        Unit::Seconds,
        "Time from grant until the guard was released, dropped or forgotten"
    );
    describe_gauge!(
        "dlock_active_guards",
        Unit::Count,
        "Lock guards alive in this process"
    );
    describe_counter!(
        "dlock_renewals_total",
        Unit::Count,
        "Lease renewals attempted by the watchdog, by outcome"
    );
    describe_counter!("dlock_losses_total", Unit::Count, "Locks lost, by reason");
    describe_counter!(
        "dlock_suspensions_total",
        Unit::Count,
        "Sessions carrying locks that lost their connection"
    );
    describe_counter!(
        "dlock_resumptions_total",
        Unit::Count,
        "Suspended sessions that came back in time"
    );
}

/// One acquire call's span and measurements. Dropped before [`finish`](Self::finish), it reports
/// the acquire as cancelled: a dropped acquire future is an outcome the caller chose, and
/// counting it keeps `dlock_acquires_total` equal to the number of calls.
#[derive(Debug)]
pub(crate) struct AcquireProbe {
    span: Span,
    #[cfg(feature = "metrics")]
    keys: &'static BackendKeys,
    op: Op,
    #[cfg(feature = "metrics")]
    started: Instant,
    wait_started: Option<Instant>,
    finished: bool,
}

impl AcquireProbe {
    pub(crate) fn start(backend: &'static str, op: Op, name: Option<&LockName>) -> Self {
        let span = tracing::info_span!(
            "dlock.acquire",
            backend,
            name = Empty,
            op = op.label(),
            outcome = Empty,
            wait_ms = Empty,
            token = Empty,
            error = Empty,
        );
        let probe = Self {
            span,
            #[cfg(feature = "metrics")]
            keys: BackendKeys::of(backend),
            op,
            #[cfg(feature = "metrics")]
            started: Instant::now(),
            wait_started: None,
            finished: false,
        };
        if let Some(name) = name {
            probe.record("name", name.as_str());
        }
        probe
    }

    /// Records `field` on the span if a subscriber wants it: on a span nobody wants, recording
    /// still costs, per field.
    fn record(&self, field: &str, value: impl tracing::Value) {
        if !self.span.is_disabled() {
            self.span.record(field, value);
        }
    }

    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The options passed their checks and the backend's wait starts now.
    pub(crate) fn waiting(&mut self) -> Instant {
        let now = Instant::now();
        self.wait_started = Some(now);
        now
    }

    pub(crate) fn acquired(&mut self, name: &LockName, token: FencingToken) {
        self.record("name", name.as_str());
        self.record("token", token.get());
        self.finish(Outcome::Acquired);
    }

    pub(crate) fn failed(&mut self, error: &LockError) {
        self.record("error", crate::error::error_chain(error).as_str());
        self.finish(match error {
            LockError::Timeout { .. } => Outcome::Timeout,
            _ => Outcome::Error,
        });
    }

    pub(crate) fn finish(&mut self, outcome: Outcome) {
        self.finished = true;
        let waited = self.wait_started.map(|since| since.elapsed());
        self.record("outcome", outcome.label());
        if let Some(waited) = waited {
            self.record("wait_ms", waited.as_secs_f64() * 1000.0);
        }
        #[cfg(feature = "metrics")]
        {
            let (keys, op) = (self.keys, self.op);
            keys.acquires(op, outcome).increment(1);
            keys.acquire_duration(op, outcome)
                .record(self.started.elapsed().as_secs_f64());
            if let Some(waited) = waited {
                keys.wait_duration(outcome).record(waited.as_secs_f64());
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self.op, waited);
    }
}

impl Drop for AcquireProbe {
    fn drop(&mut self) {
        if !self.finished {
            self.finish(Outcome::Cancelled);
        }
    }
}

/// Who a guard is, for the events and metrics about it after the acquire: set on its
/// [`LeaseState`] when the grant becomes a guard, so that whoever marks the lease lost (the
/// watchdog, the backend, the server's answer) reports it with the guard's fields.
#[derive(Debug)]
pub(crate) struct GuardLabels {
    pub(crate) backend: &'static str,
    pub(crate) name: LockName,
    pub(crate) token: FencingToken,
}

/// A live guard's share of the metrics: counted active from the grant, and its hold time
/// recorded once, when the guard goes away (this value is dropped with it).
#[derive(Debug)]
pub(crate) struct GuardProbe {
    #[cfg(feature = "metrics")]
    keys: &'static BackendKeys,
    #[cfg(feature = "metrics")]
    granted: Instant,
    end: End,
}

impl GuardProbe {
    pub(crate) fn start(backend: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        let keys = BackendKeys::of(backend);
        #[cfg(feature = "metrics")]
        keys.active_guards().increment(1.0);
        #[cfg(not(feature = "metrics"))]
        let _ = backend;
        Self {
            #[cfg(feature = "metrics")]
            keys,
            #[cfg(feature = "metrics")]
            granted: Instant::now(),
            end: End::Dropped,
        }
    }

    pub(crate) fn set_end(&mut self, end: End) {
        self.end = end;
    }
}

#[cfg(feature = "metrics")]
impl Drop for GuardProbe {
    fn drop(&mut self) {
        self.keys.active_guards().decrement(1.0);
        self.keys
            .hold_duration(self.end)
            .record(self.granted.elapsed().as_secs_f64());
    }
}

/// The first loss of a guard's lease (its state says whose).
pub(crate) fn lost(labels: &GuardLabels, reason: LostReason) {
    let reason_label = reason_label(reason);
    tracing::warn!(
        backend = labels.backend,
        name = %labels.name,
        token = labels.token.get(),
        reason = reason_label,
        "lock lost: {reason}"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_losses_total", "backend" => labels.backend, "reason" => reason_label)
        .increment(1);
}

/// One renewal attempt by the watchdog.
pub(crate) fn renewal(state: &LeaseState, failure: Option<(&LockError, bool)>) {
    let Some(labels) = state.labels() else {
        return;
    };
    match failure {
        None => {
            #[cfg(feature = "metrics")]
            metrics::counter!("dlock_renewals_total", "backend" => labels.backend, "outcome" => "ok")
                .increment(1);
        }
        Some((error, retrying)) => {
            tracing::warn!(
                backend = labels.backend,
                name = %labels.name,
                token = labels.token.get(),
                outcome = "failed",
                error = %crate::error::error_chain(error),
                retrying,
                "renewal failed"
            );
            #[cfg(feature = "metrics")]
            metrics::counter!("dlock_renewals_total", "backend" => labels.backend, "outcome" => "failed")
                .increment(1);
        }
    }
}

/// A session carrying guards lost its connection; it may come back until `until`.
pub(crate) fn suspended(backend: &'static str, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    tracing::warn!(
        backend,
        until_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        "session suspended: its locks are not held until it comes back"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_suspensions_total", "backend" => backend).increment(1);
}

/// A suspended session came back in time.
pub(crate) fn resumed(backend: &'static str) {
    tracing::info!(backend, "session resumed: its locks are held again");
    #[cfg(feature = "metrics")]
    metrics::counter!("dlock_resumptions_total", "backend" => backend).increment(1);
}
