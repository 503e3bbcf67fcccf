//! Session leases: one etcd lease per (client, TTL in whole seconds), kept alive by a loop this
//! crate owns, shared by every guard with that TTL.
//!
//! The client crate's keep-alive is a raw bidirectional stream with no loop, timer or reopen.
//! The loop here sends one keep-alive at a time, so each answer pairs with the instant its
//! request was sent, and dates the lease's validity from that **send**: `sent + granted TTL -
//! margin`. The server renews a lease to its granted TTL when the request *arrives*, which is
//! after the send, so the client's deadline is never later than the server's.
//!
//! A keep-alive that fails (no answer within the command timeout, a stream error, a member
//! without a leader) suspends the [`Session`]: every guard on it reports `Suspended` until the
//! deadline, while the loop reopens the stream with back-off (possibly on another member). An
//! answer in time resumes it. The deadline passing, or an answer with TTL 0 (the lease was
//! revoked or expired on the server), ends it with [`LostReason::SessionExpired`].
//!
//! The loop runs on the connection's runtime; when that runtime shuts down, the next connection
//! starts it again on its own ([`SessionLease::keep_alive_on`]), from the lease's last validity:
//! the guards go on if the server still has the lease, and are lost if it has ended.
//!
//! Each guard has a [`Session`] of its own that mirrors the lease's: `extend` to another TTL
//! class moves a key onto another lease, and the guard's state (whose session is fixed when it
//! is made) must then follow the new lease's suspension and end, not the old one's.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dlock_api::LostReason;
use dlock_api::raw::time::after;
use dlock_api::raw::{LeaseState, Session, SessionStatus};
use etcd_client::Client;
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::connection::{Conn, Running};
use crate::error::{is_lease_not_found, map_err};

/// The validity of a lease granted or renewed to `ttl` seconds by a request sent at `sent`:
/// the TTL less a margin for the two clocks' rates (1 % and 5 ms).
pub(crate) fn validity(sent: Instant, ttl_secs: i64) -> Instant {
    let ttl = Duration::from_secs(ttl_secs.max(0).unsigned_abs());
    let margin = ttl
        .checked_div(100)
        .unwrap_or_default()
        .saturating_add(Duration::from_millis(5));
    after(sent, ttl.saturating_sub(margin))
}

/// A TTL as etcd takes it: whole seconds, rounded up, at least one.
pub(crate) fn ttl_class(ttl: Duration) -> i64 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// One kept-alive lease and the [`Session`] its guards share.
#[derive(Debug)]
pub(crate) struct SessionLease {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// The TTL class (requested seconds), the key of the client's session map.
    pub(crate) class: i64,
    /// The TTL the server granted (it may raise a short one to its minimum).
    granted: Mutex<i64>,
    pub(crate) session: Arc<Session>,
    valid_until: Mutex<Instant>,
    /// Guards on this lease: their validity moves with every acknowledged keep-alive, and their
    /// own sessions follow this one's suspension and end.
    guards: Mutex<Vec<Weak<LeaseState>>>,
    /// Stops the keep-alive loop (the client is gone).
    stop: CancellationToken,
    /// The runtime the keep-alive loop runs on.
    running: Running,
}

impl SessionLease {
    /// Grants a lease of `class` seconds, to be kept alive ([`keep_alive_on`](Self::keep_alive_on))
    /// until `stop` fires (then it is revoked) or the session ends.
    pub(crate) async fn grant(
        client: &Client,
        class: i64,
        command_timeout: Duration,
        shortest: &ShortestLease,
        stop: CancellationToken,
    ) -> dlock_api::Result<Arc<Self>> {
        let (id, granted, valid_until) =
            grant_lease(client, class, command_timeout, shortest).await?;
        let lease = Arc::new(Self {
            id,
            class,
            granted: Mutex::new(granted),
            session: Arc::new(Session::new()),
            valid_until: Mutex::new(valid_until),
            guards: Mutex::new(Vec::new()),
            stop,
            running: Running::default(),
        });
        Ok(lease)
    }

    /// Starts the keep-alive loop on `conn`'s runtime, unless it runs on one that has not
    /// stopped, or the lease is done with.
    pub(crate) fn keep_alive_on(self: &Arc<Self>, conn: &Conn, command_timeout: Duration) {
        if self.stop.is_cancelled() || matches!(self.session.status(), SessionStatus::Ended(_)) {
            return;
        }
        self.running.ensure(conn, || {
            keep_alive_loop(conn.client.clone(), self.clone(), command_timeout)
        });
    }

    /// The instant the lease ends unless renewed, by this client's clock.
    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether new guards may still join this lease.
    pub(crate) fn is_usable(&self) -> bool {
        !self.stop.is_cancelled()
            && !matches!(self.session.status(), SessionStatus::Ended(_))
            && Instant::now() < self.valid_until()
    }

    /// A guard's state on this lease: its validity follows the lease's, its fate the session's.
    pub(crate) fn new_guard_state(&self) -> Arc<LeaseState> {
        let state = Arc::new(LeaseState::on_session(
            Some(self.valid_until()),
            Arc::new(Session::new()),
        ));
        self.attach(&state);
        state
    }

    /// Makes this lease carry `state` from now on: its validity, suspension and end follow this
    /// lease's, starting with where the lease stands now.
    pub(crate) fn attach(&self, state: &Arc<LeaseState>) {
        {
            let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
            guards.retain(|g| g.strong_count() > 0);
            guards.push(Arc::downgrade(state));
        }
        state.set_valid_until(Some(self.valid_until()));
        let Some(mirror) = state.session() else {
            return;
        };
        match self.session.status() {
            SessionStatus::Active => {
                state.set_renewal_failing(false);
                mirror.resume();
            }
            SessionStatus::Suspended { until } => {
                state.set_renewal_failing(true);
                mirror.suspend(until);
            }
            SessionStatus::Ended(reason) => {
                mirror.end(reason);
            }
        }
    }

    /// Stops carrying `state` (its key moved to another lease).
    pub(crate) fn detach(&self, state: &Arc<LeaseState>) {
        let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        guards.retain(|g| g.strong_count() > 0 && !std::ptr::eq(g.as_ptr(), Arc::as_ptr(state)));
    }

    /// The live guards' states.
    fn guards(&self) -> Vec<Arc<LeaseState>> {
        let mut guards = self.guards.lock().unwrap_or_else(|e| e.into_inner());
        guards.retain(|g| g.upgrade().is_some_and(|state| !state.is_closed()));
        guards.iter().filter_map(Weak::upgrade).collect()
    }

    /// Records an acknowledged keep-alive sent at `sent` that renewed the lease to `ttl`.
    pub(crate) fn renewed(&self, sent: Instant, ttl: i64) -> Instant {
        let until = validity(sent, ttl);
        {
            let mut valid = self.valid_until.lock().unwrap_or_else(|e| e.into_inner());
            if until > *valid {
                *valid = until;
            }
        }
        *self.granted.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
        let until = self.valid_until();
        for state in self.guards() {
            state.set_renewal_failing(false);
            state.set_valid_until(Some(until));
            if let Some(mirror) = state.session() {
                mirror.resume();
            }
        }
        self.session.resume();
        until
    }

    fn granted(&self) -> i64 {
        *self.granted.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn suspend(&self) {
        if !matches!(self.session.status(), SessionStatus::Suspended { .. }) {
            tracing::debug!(lease = self.id, "etcd keep-alive failing; guards suspended");
        }
        let until = self.valid_until();
        self.session.suspend(until);
        // The lease's first failure dates the suspension; the guards take that deadline.
        let until = match self.session.status() {
            SessionStatus::Suspended { until } => until,
            _ => until,
        };
        for state in self.guards() {
            state.set_renewal_failing(true);
            if let Some(mirror) = state.session() {
                mirror.suspend(until);
            }
        }
    }

    /// Ends the session (every guard on it is lost) and stops the loop.
    pub(crate) fn end(&self, reason: LostReason) {
        if self.session.end(reason) {
            tracing::debug!(lease = self.id, %reason, "etcd session lease ended");
        }
        let reason = match self.session.status() {
            SessionStatus::Ended(first) => first,
            _ => reason,
        };
        for state in self.guards() {
            if let Some(mirror) = state.session() {
                mirror.end(reason);
            }
        }
        self.stop.cancel();
    }

    /// One keep-alive on a stream of its own, outside the loop (for `extend`): the validity it
    /// obtained.
    pub(crate) async fn keep_alive_once(
        &self,
        client: &Client,
        command_timeout: Duration,
    ) -> dlock_api::Result<Instant> {
        let sent = Instant::now();
        let mut leases = client.lease_client();
        match tokio::time::timeout(command_timeout, leases.keep_alive(self.id)).await {
            Ok(Ok((_keeper, _stream))) => Ok(self.renewed(sent, self.granted())),
            Ok(Err(e)) if e.to_string().contains("lease not found") => {
                self.end(LostReason::SessionExpired);
                Err(dlock_api::LockError::Lost {
                    name: String::new(),
                    reason: LostReason::SessionExpired,
                })
            }
            Ok(Err(e)) => Err(map_err(e)),
            Err(_) => Err(crate::error::timed_out(command_timeout)),
        }
    }
}

/// The shortest lease dlock asks etcd for, in whole seconds: the cluster's minimum, or 2 s if
/// that is shorter. etcd lengthens a lease below its minimum (`ceil(1.5 × election timeout)`:
/// 2 s on default timing) without saying so but in the grant's answer, so a lock whose holder
/// vanished would outlive the TTL asked for; and it expires leases on a 500 ms sweep, which a
/// one-second lease's keep-alives would race. Learned at connect, raised by any grant that comes
/// back longer than asked (a new leader with other timing).
#[derive(Debug)]
pub(crate) struct ShortestLease(AtomicI64);

impl ShortestLease {
    pub(crate) fn new() -> Self {
        Self(AtomicI64::new(2))
    }

    pub(crate) fn get(&self) -> Duration {
        Duration::from_secs(self.0.load(Ordering::Relaxed).unsigned_abs())
    }

    /// Learns from a grant of `asked` seconds answered with `granted`: a lease longer than asked
    /// is the server's minimum.
    pub(crate) fn learn(&self, asked: i64, granted: i64) {
        if granted > asked {
            self.0.fetch_max(granted, Ordering::Relaxed);
        }
    }
}

/// Grants a lease of `ttl` seconds: its id, the granted TTL, and its validity dated from the
/// send. A lease the server made longer than `ttl` is revoked and refused: the lock on it would
/// outlive its TTL (`shortest` learns the cluster's minimum from it).
pub(crate) async fn grant_lease(
    client: &Client,
    ttl: i64,
    command_timeout: Duration,
    shortest: &ShortestLease,
) -> dlock_api::Result<(i64, i64, Instant)> {
    let mut attempt: u32 = 0;
    loop {
        let sent = Instant::now();
        let mut leases = client.lease_client();
        match tokio::time::timeout(command_timeout, leases.grant(ttl, None)).await {
            Ok(Ok(granted)) if granted.ttl() > ttl => {
                shortest.learn(ttl, granted.ttl());
                let (id, mut leases) = (granted.id(), client.lease_client());
                dlock_api::raw::spawn_cleanup(async move {
                    let _ = tokio::time::timeout(command_timeout, leases.revoke(id)).await;
                });
                return Err(dlock_api::LockError::invalid(
                    "ttl",
                    format!(
                        "etcd made the {ttl} s lease asked for {} s long: the cluster's \
                         shortest lease is {} s (1.5 election timeouts); use a TTL of at least that",
                        granted.ttl(),
                        granted.ttl()
                    ),
                ));
            }
            Ok(Ok(granted)) => {
                return Ok((granted.id(), granted.ttl(), validity(sent, granted.ttl())));
            }
            // A grant that timed out may have created a lease nobody keeps alive: it expires.
            Ok(Err(e)) if attempt < 2 && crate::error::is_unavailable(&e) => {}
            Ok(Err(e)) => return Err(map_err(e)),
            Err(_) if attempt < 2 => {}
            Err(_) => return Err(crate::error::timed_out(command_timeout)),
        }
        attempt = attempt.saturating_add(1);
    }
}

enum Stream {
    Open(
        etcd_client::LeaseKeeper,
        Box<etcd_client::LeaseKeepAliveStream>,
    ),
    Closed,
}

/// Keeps `lease` alive until the client stops it (then revokes it) or the session ends.
async fn keep_alive_loop(client: Client, lease: Arc<SessionLease>, command_timeout: Duration) {
    let stop = lease.stop.clone();
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = lease.session.ended() => {}
        _ = run(&client, &lease, command_timeout) => {}
    }
    let client_gone = !matches!(lease.session.status(), SessionStatus::Ended(_));
    // The client went away (its guards end with it), or the session ended (a suspension ran
    // out: the guards' own sessions ran out with it, but say so at once).
    lease.end(LostReason::SessionClosed);
    if client_gone {
        // The lease goes at once.
        let _ = tokio::time::timeout(command_timeout, client.lease_client().revoke(lease.id)).await;
    }
}

enum Outcome {
    Renewed(i64),
    Expired,
    Failed,
}

async fn run(client: &Client, lease: &SessionLease, command_timeout: Duration) {
    let mut stream = Stream::Closed;
    let mut failures: u32 = 0;
    let mut next = Instant::now();
    loop {
        sleep_until(next.min(lease.valid_until())).await;
        if Instant::now() >= lease.valid_until() {
            lease.end(LostReason::SessionExpired);
            return;
        }
        let sent = Instant::now();
        // No answer later than the command timeout, nor after the lease has ended anyway.
        let answer_by = after(sent, command_timeout).min(lease.valid_until());
        let outcome = match &mut stream {
            Stream::Open(keeper, messages) => {
                let answer = timeout_at(answer_by, async {
                    keeper.keep_alive().await?;
                    messages.message().await
                })
                .await;
                match answer {
                    Ok(Ok(Some(reply))) if reply.ttl() <= 0 => Outcome::Expired,
                    Ok(Ok(Some(reply))) => Outcome::Renewed(reply.ttl()),
                    Ok(Ok(None)) => Outcome::Failed,
                    Ok(Err(e)) => {
                        tracing::debug!(lease = lease.id, error = %e, "etcd keep-alive failed");
                        Outcome::Failed
                    }
                    Err(_) => Outcome::Failed,
                }
            }
            Stream::Closed => {
                let mut leases = client.lease_client();
                match timeout_at(answer_by, leases.keep_alive(lease.id)).await {
                    // `keep_alive` sent once and awaited the answer, refusing a TTL of 0.
                    Ok(Ok((keeper, messages))) => {
                        stream = Stream::Open(keeper, Box::new(messages));
                        Outcome::Renewed(lease.granted())
                    }
                    Ok(Err(e))
                        if is_lease_not_found(&e) || e.to_string().contains("lease not found") =>
                    {
                        Outcome::Expired
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(lease = lease.id, error = %e, "etcd keep-alive stream failed to open");
                        Outcome::Failed
                    }
                    Err(_) => Outcome::Failed,
                }
            }
        };
        match outcome {
            Outcome::Expired => {
                lease.end(LostReason::SessionExpired);
                return;
            }
            Outcome::Renewed(ttl) => {
                failures = 0;
                lease.renewed(sent, ttl);
                let every = Duration::from_secs(ttl.unsigned_abs())
                    .checked_div(3)
                    .unwrap_or_default();
                next = after(sent, every.max(Duration::from_millis(100)));
            }
            Outcome::Failed => {
                failures = failures.saturating_add(1);
                stream = Stream::Closed;
                lease.suspend();
                // Reopen soon (perhaps on another member), with a growing pause.
                next = after(
                    Instant::now(),
                    Duration::from_millis(25u64 << failures.min(5)),
                );
            }
        }
    }
}
