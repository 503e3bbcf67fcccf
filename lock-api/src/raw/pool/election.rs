//! Reading and observing a name's leader over a pool: the driver's owner-checked record, read
//! on any connection, and a stream that reads it again when the driver's bell rings and on a
//! bounded interval.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::{Instant, timeout};

use super::SessionPool;
use super::core::{Conn, PoolCore};
use super::driver::{DriverError, SessionDriver};
use crate::election::{Leader, LeaderEvent, LeaderStream, OBSERVE_RETRY};
use crate::error::Result;
use crate::name::LockName;
use crate::raw::ChangeBell;
use crate::raw::detach::Detach;
use crate::raw::time::after;

/// The driver's [`leader`](SessionDriver::leader) read on a connection of the pool: the least
/// busy shared one (a read stacks nothing, so one holding locks will do), else one that holds
/// nothing, opened if need be. It runs to completion in a `Detach`, so a dropped read never
/// leaves a connection mid-statement or lent out.
pub(super) async fn leader<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    name: &LockName,
    key: &D::Key,
) -> Result<Option<Leader>> {
    let (core, name, key) = (core.clone(), name.clone(), key.clone());
    Detach::new(async move {
        // A pooled connection may have died unnoticed (its backend killed, a server restart):
        // a read that finds it dead is made once more on another, as an attempt is.
        match read_once(&core, &name, &key).await {
            Err((error, true)) => {
                tracing::debug!(%error, "dlock: a pooled connection was dead; reading the leader on another");
                read_once(&core, &name, &key).await.map_err(|(error, _)| error)
            }
            read => read.map_err(|(error, _)| error),
        }
    })
    .await
}

/// One leader read; the error says whether its connection turned out dead.
async fn read_once<D: SessionDriver>(
    core: &Arc<PoolCore<D>>,
    name: &LockName,
    key: &D::Key,
) -> std::result::Result<Option<Leader>, (crate::LockError, bool)> {
    let shared = core.registry().least_busy_shared();
    let (conn, lent) = match shared {
        Some(conn) => (conn, false),
        None => {
            let wake_at = after(Instant::now(), core.config.command_timeout);
            match core.take_waiting(wake_at).await {
                Ok(Some(conn)) => (conn, true),
                Ok(None) => {
                    let error = core.unavailable(format!(
                        "all {} connections are waiting on locks (raise `max_connections`)",
                        core.config.max_connections
                    ));
                    return Err((error, false));
                }
                Err(error) => return Err((error, false)),
            }
        }
    };
    let read = read_on(core, &conn, name, key).await;
    if lent {
        core.wait_done(&conn, None);
    }
    read.map_err(|error| (error, conn.is_dead()))
}

/// One leader read on `conn`, bounded by the command timeout; a broken connection is closed.
async fn read_on<D: SessionDriver>(
    core: &PoolCore<D>,
    conn: &Conn<D>,
    name: &LockName,
    key: &D::Key,
) -> Result<Option<Leader>> {
    // Counted as load, so that attempts go elsewhere instead of queueing behind it.
    let _load = core.unlocking(conn);
    let mut guard = conn.conn.lock().await;
    let c = core.conn_mut(&mut guard).map_err(|f| f.error)?;
    let limit = core.config.command_timeout;
    let outcome = timeout(limit, core.driver.leader(c, name, key)).await;
    core.settle(conn, &mut guard, limit, outcome)
        .map_err(|failure: DriverError| failure.error)
}

/// How often an observer with a bell reads anyway: a leader whose connection dies rings
/// nothing, so a vacancy that no successor fills is seen within this.
pub(crate) const READ_ANYWAY: Duration = Duration::from_secs(1);

/// How long an observer whose bell could not be set up reads on its timer before asking for
/// one again.
const BELL_RETRY: Duration = Duration::from_secs(5);

/// An observer's bell, if its driver offers one.
enum Bell {
    /// Ask the driver for one before the next read at or after this.
    AskAt(Instant),
    Have(ChangeBell),
    /// The driver has none: read every [`OBSERVE_RETRY`].
    NotOffered,
}

/// What an observer keeps between reads.
struct Observer<D: SessionDriver> {
    pool: SessionPool<D>,
    name: LockName,
    key: D::Key,
    /// Read at once the first time; after that, on a ring or once per interval.
    first: bool,
    bell: Bell,
    /// A read failed since the last state reported: the next state follows a `Missed`.
    missed: bool,
    ready: VecDeque<Result<LeaderEvent>>,
}

impl<D: SessionDriver> Observer<D> {
    /// Until the next read is due: a ring of the bell, or the interval of reading without one.
    async fn until_read_due(&mut self) {
        match &mut self.bell {
            Bell::Have(bell) => {
                tokio::select! {
                    rung = bell.rung() => if !rung {
                        self.bell = Bell::AskAt(Instant::now());
                    },
                    () = tokio::time::sleep(READ_ANYWAY) => {}
                }
            }
            Bell::AskAt(_) | Bell::NotOffered => tokio::time::sleep(OBSERVE_RETRY).await,
        }
    }

    /// Sets the bell up if it is due, before the read it must not miss a change after.
    async fn ring_me(&mut self) {
        let Bell::AskAt(at) = self.bell else {
            return;
        };
        if Instant::now() < at {
            return;
        }
        self.bell = match self.pool.leader_bell(&self.key).await {
            Ok(Some(bell)) => Bell::Have(bell),
            Ok(None) => Bell::NotOffered,
            Err(error) => {
                tracing::debug!(%error, "dlock: no change bell for a leader observer; reading on a timer");
                Bell::AskAt(after(Instant::now(), BELL_RETRY))
            }
        };
    }
}

/// The leader of `name` read now, then again whenever the driver's
/// [`leader_bell`](SessionDriver::leader_bell) rings and at least every [`READ_ANYWAY`] (a
/// session server tells nobody when a connection dies, and with it a leader); without a bell,
/// every [`OBSERVE_RETRY`]. Every read is reported (the engine drops repeats); a failed read is
/// reported as the error, and the next state after it follows a [`LeaderEvent::Missed`]. The
/// stream holds no connection between reads, and its bell is the driver's to share, so
/// dropping it leaves nothing behind.
pub(super) fn observe<D: SessionDriver>(
    pool: SessionPool<D>,
    name: LockName,
    key: D::Key,
) -> LeaderStream {
    let observer = Observer {
        pool,
        name,
        key,
        first: true,
        bell: Bell::AskAt(Instant::now()),
        missed: false,
        ready: VecDeque::new(),
    };
    futures::stream::unfold(observer, |mut observer| async move {
        loop {
            if let Some(item) = observer.ready.pop_front() {
                return Some((item, observer));
            }
            if !std::mem::take(&mut observer.first) {
                observer.until_read_due().await;
            }
            observer.ring_me().await;
            match observer.pool.leader(&observer.name, &observer.key).await {
                Ok(leader) => {
                    if std::mem::take(&mut observer.missed) {
                        observer.ready.push_back(Ok(LeaderEvent::Missed));
                    }
                    let state = leader.map_or(LeaderEvent::Vacant, LeaderEvent::Leads);
                    observer.ready.push_back(Ok(state));
                }
                Err(error) => {
                    observer.missed = true;
                    observer.ready.push_back(Err(error));
                }
            }
        }
    })
    .boxed()
}
