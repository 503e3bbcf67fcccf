//! Elections on Redis: a leader's record beside its lock key (`scripts/election.rs`), read with
//! one script; observers listen on the name's channel, shared with its waiters, and read again
//! on every message there, after a lost connection, and when the lease they last read ends (a
//! leader that vanished announces nothing: its key just expires).

use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::OBSERVE_RETRY;
use dlock_api::raw::time::after;
use dlock_api::{FencingToken, Leader, LeaderEvent, LeaderStream, LockError, LockName, Result};
use futures::StreamExt;
use redis::Value;
use tokio::time::{Instant, sleep, sleep_until};

use super::RedisLock;
use crate::BACKEND;
use crate::client::Inner;
use crate::keys::LockKeys;
use crate::scripts::election::parse_record;
use crate::wake::Observing;

/// What one read of a name's leader found.
struct Read {
    leader: Option<Leader>,
    /// When the lease of the lock's holder ends, if someone holds it: the leader may vanish
    /// then without a word.
    lease_end: Option<Instant>,
}

impl Read {
    fn event(&self) -> LeaderEvent {
        match &self.leader {
            Some(leader) => LeaderEvent::Leads(leader.clone()),
            None => LeaderEvent::Vacant,
        }
    }
}

/// One script: the lock key's PTTL and the leader record, if its owner holds the lock now.
async fn read(inner: &Inner, keys: &LockKeys) -> Result<Read> {
    let leader = keys.leader();
    let sent = Instant::now();
    let reply: Vec<Value> = inner
        .conn
        .run_script(
            inner.config.command_timeout,
            &inner.scripts.leader,
            &[&keys.lock, &leader],
            &[],
        )
        .await?;
    let (pttl, record) = match reply.as_slice() {
        [Value::Int(pttl), Value::BulkString(record)] => (*pttl, record.as_slice()),
        other => {
            return Err(LockError::unexpected(
                BACKEND,
                format!("unexpected leader reply {other:?}"),
            ));
        }
    };
    let leader = match record {
        [] => None,
        record => {
            let (term, value) = parse_record(record).ok_or_else(|| {
                LockError::unexpected(BACKEND, "a leader record that is not `OWNER TERM VALUE`")
            })?;
            Some(Leader::new(FencingToken::new(term), value))
        }
    };
    // Measured from before the request: the lease may end a round trip early by our clock,
    // never late; a read that finds it still on waits again.
    let lease_end = u64::try_from(pttl)
        .ok()
        .map(|ms| after(sent, Duration::from_millis(ms)));
    Ok(Read { leader, lease_end })
}

/// The state of one observer's stream.
struct Observer {
    inner: Arc<Inner>,
    keys: LockKeys,
    observing: Observing,
    /// The first read is still to come.
    first: bool,
    /// Messages may have passed unheard since the last state reported (a lost connection, a
    /// failed read): `Missed` goes before the next one.
    missed: bool,
    /// The current failure has been reported (one error item per failure).
    failing: bool,
    /// A state read after a gap, to report after `Missed`.
    pending: Option<LeaderEvent>,
    /// When the holder's lease read last ends.
    lease_end: Option<Instant>,
}

impl Observer {
    async fn next(&mut self) -> Result<LeaderEvent> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        loop {
            if self.failing {
                sleep(OBSERVE_RETRY).await;
            } else if !std::mem::take(&mut self.first) {
                // Woken by the server: a message on the name's channel, a lost connection,
                // or the end of the lease the last read found.
                match self.lease_end {
                    Some(end) => tokio::select! {
                        () = self.observing.changed() => {}
                        () = sleep_until(end) => {}
                    },
                    None => self.observing.changed().await,
                }
            }
            if self.observing.take_missed() {
                self.missed = true;
            }
            let step = async {
                self.observing.ensure_subscribed().await?;
                read(&self.inner, &self.keys).await
            };
            match step.await {
                Ok(read) => {
                    self.failing = false;
                    self.lease_end = read.lease_end;
                    let event = read.event();
                    if std::mem::take(&mut self.missed) {
                        self.pending = Some(event);
                        return Ok(LeaderEvent::Missed);
                    }
                    return Ok(event);
                }
                Err(error) => {
                    self.missed = true;
                    if !std::mem::replace(&mut self.failing, true) {
                        return Err(error);
                    }
                    tracing::debug!(%error, key = %self.keys.lock, "redis: an observer's read failed again");
                }
            }
        }
    }
}

impl RedisLock {
    /// The leader of `name`: one read-only script.
    pub(super) async fn read_leader(&self, name: &LockName) -> Result<Option<Leader>> {
        Ok(read(&self.inner, &self.keys(name)).await?.leader)
    }

    /// The observer of `name`: subscribed to its channel before it returns, so nothing after
    /// its first read is missed.
    pub(super) async fn leader_changes(&self, name: &LockName) -> Result<LeaderStream> {
        let keys = self.keys(name);
        let inner = self.inner.clone();
        let observing = inner
            .hub
            .observe(&inner.conn, &keys.channel, inner.config.command_timeout)
            .await?;
        let observer = Observer {
            inner,
            keys,
            observing,
            first: true,
            missed: false,
            failing: false,
            pending: None,
            lease_end: None,
        };
        Ok(
            futures::stream::unfold(observer, |mut observer| async move {
                let item = observer.next().await;
                Some((item, observer))
            })
            .boxed(),
        )
    }
}
