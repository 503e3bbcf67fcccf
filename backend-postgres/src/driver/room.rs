//! A semaphore's waiters in line: one waits for a permit at a time, woken by the release.
//!
//! A permit can come from any of the name's slots, and a server-side wait is on one key, so no
//! statement can wait for "any slot". Instead the waiters of every client queue for the name's
//! waiting room ([`room_key`](crate::key::room_key)) in the server's lock queue, where a cancel reaches them; the
//! one holding it is first in line. It listens on the name's permit channel, then tries the
//! slots, and tries again when a release notifies the channel (a release notifies only while
//! the room is taken, so releases with nobody waiting cost no notification, and one release
//! wakes one waiter, not every client's), or every [`PERMIT_RESCAN`] (a holder whose session
//! ends notifies nobody). It leaves the room when it is granted or its wait runs out, and the
//! next in the server's queue steps up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::LockName;
use dlock_api::raw::{ChangeBell, DriverError, Waited};
use sqlx::Row;
use sqlx::postgres::PgConnection;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{PgDriver, failure, int_key, unlock_retrying};
use crate::error::{LOCK_NOT_AVAILABLE, QUERY_CANCELED, sqlstate};
use crate::key::RawKey;
use crate::sql;
use dlock_api::raw::random_below;

/// How long the first waiter in line waits for a notification before it tries the slots
/// again: a slot whose holder's session ended is freed without one.
const PERMIT_RESCAN: Duration = Duration::from_millis(500);

/// The waiters first in line on this client, by backend pid: an interrupt of the pool (a
/// cancelled or closing wait) reaches one between its statements here, where a
/// `pg_cancel_backend` finds nothing to cancel.
#[derive(Debug, Default)]
pub(crate) struct FirstInLine {
    waiting: Mutex<HashMap<u64, Arc<Notify>>>,
}

impl FirstInLine {
    /// Stops the wait of the waiter on backend `pid`, if one of this client's is first in line
    /// there (now or when it next looks).
    pub(crate) fn interrupt(&self, pid: u64) {
        if let Some(stop) = self.lock().get(&pid) {
            stop.notify_one();
        }
    }

    fn enter(&self, pid: u64) -> InLine<'_> {
        let stop = Arc::new(Notify::new());
        self.lock().insert(pid, stop.clone());
        InLine {
            line: self,
            pid,
            stop,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Notify>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One waiter first in line; dropping it takes it off.
struct InLine<'a> {
    line: &'a FirstInLine,
    pid: u64,
    stop: Arc<Notify>,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.line.lock().remove(&self.pid);
    }
}

impl PgDriver {
    /// [`SessionDriver::wait_permit`](dlock_api::raw::SessionDriver::wait_permit): waits up to
    /// `wait` for the room, then as first in line for a permit until the same deadline, and
    /// leaves the room whatever happened (a broken connection leaves it with its session).
    pub(super) async fn wait_in_line(
        &self,
        conn: &mut PgConnection,
        (name, key): (&LockName, &RawKey),
        permits: u32,
        wait: Duration,
    ) -> std::result::Result<Waited, DriverError> {
        let k = int_key(key)?;
        let deadline = Instant::now().checked_add(wait);
        let room = self.derived.of(k, permits).room;
        let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1);
        let entered = sql::enter_room(room, ms).fetch_one(&mut *conn).await;
        let outcome = match entered {
            Ok(row) => {
                let pid: i32 = row.try_get(0).map_err(failure)?;
                let in_line = self.first_in_line.enter(u64::from(pid.unsigned_abs()));
                self.first_in_line_waits(conn, name, key, permits, deadline, &in_line)
                    .await
            }
            // The timeout (or the pool's interrupt) may have raced the grant, which outlives
            // the failed statement: the room is left below either way.
            Err(e)
                if matches!(
                    sqlstate(&e).as_deref(),
                    Some(LOCK_NOT_AVAILABLE | QUERY_CANCELED)
                ) =>
            {
                Ok(Waited::NotGranted)
            }
            Err(e) => return Err(failure(e)),
        };
        if outcome.as_ref().is_err_and(|failure| failure.broken) {
            return outcome;
        }
        // A late interrupt landing here is retried. The room is never left taken: a connection
        // that cannot give it back is called broken, and its closing gives it back.
        let left = unlock_retrying(conn, || sql::unlock(RawKey::Int(room))).await;
        match (outcome, left) {
            (_, Err(failure)) => Err(DriverError::broken(failure.error)),
            (Err(failure), Ok(_)) => Err(failure),
            (Ok(waited), Ok(_)) => Ok(waited),
        }
    }

    /// Tries the slots until granted, the deadline, or an interrupt; between tries, waits for
    /// a release's notification or [`PERMIT_RESCAN`].
    async fn first_in_line_waits(
        &self,
        conn: &mut PgConnection,
        name: &LockName,
        key: &RawKey,
        permits: u32,
        deadline: Option<Instant>,
        in_line: &InLine<'_>,
    ) -> std::result::Result<Waited, DriverError> {
        let k = int_key(key)?;
        // Listening before the first try: a release after it is heard. Without a bell (the
        // listening connection failed) the rescans alone serve.
        let channel = self.derived.of(k, permits).channel.clone();
        let mut bell: Option<ChangeBell> = match self.listener.bell(channel).await {
            Ok(bell) => Some(bell),
            Err(error) => {
                tracing::debug!(%error, "dlock: a semaphore waiter without notifications rescans");
                None
            }
        };
        loop {
            let first = random_below(permits);
            if let Some((token, slot)) = self
                .try_permit_from(conn, name, key, permits, first)
                .await?
            {
                return Ok(Waited::GrantedSlot(token, slot));
            }
            let now = Instant::now();
            let left = deadline.map_or(PERMIT_RESCAN, |d| d.saturating_duration_since(now));
            if left.is_zero() {
                return Ok(Waited::NotGranted);
            }
            let nap = left.min(PERMIT_RESCAN);
            let rung = async {
                match bell.as_mut() {
                    Some(ringing) => {
                        if !ringing.rung().await {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = rung => {}
                () = tokio::time::sleep(nap) => {}
                () = in_line.stop.notified() => return Ok(Waited::NotGranted),
            }
        }
    }
}
