//! Attaching to the same session again from another runtime, once the runtime that ran its
//! client's connection (and with it the heartbeat and the watches on held nodes) stopped.
//!
//! Nothing listened to the server while no runtime served the session, so the session is put in
//! order before it is used again:
//! - past its validity it is taken as expired, as the heartbeat would have taken it: its guards
//!   are lost, and the attach only closes it, so its nodes go now rather than at the server's
//!   expiry;
//! - otherwise its guards are suspended until it is attached and its ephemeral nodes are listed.
//!   A held node that is not among them loses its guard (`TakenOver`). A node among them that no
//!   guard holds, and no acquire in progress (on a runtime that still runs) queued, is deleted:
//!   its release, or the cleanup of a dropped acquire, was a task of the stopped runtime, and
//!   the session, alive again, would keep its lock for as long as it lives;
//! - then the heartbeat, and the watch on each held node, start again on this runtime.
//!
//! A server that no longer has the session, or cannot list its nodes (`getEphemerals` came with
//! ZooKeeper 3.6), ends it: its guards are lost and the new client closes it.

use std::collections::HashSet;
use std::sync::Arc;

use dlock_api::raw::{Detach, LeaseState, SessionStatus};
use dlock_api::{LostReason, Result};
use tokio::time::Instant;
use zookeeper_client::{Client, Error as ZkError};

use super::{Attached, ZkSession, ended, heartbeat};
use crate::error::Fail;
use crate::{connect, lease};

impl ZkSession {
    /// Attaches to the session again from the runtime that calls, its client's having stopped.
    /// `Err` if that fails, with the session ended if it cannot come back.
    ///
    /// # Cancel safety
    /// Cancel safe: the attach runs to completion in the background, so a client attached is
    /// never dropped (which would close the session) before it is in place.
    pub(super) async fn reattach(&self) -> Result<Client> {
        let Some(me) = self.me.upgrade() else {
            return Err(ended());
        };
        Detach::new(async move { me.reattach_now().await }).await
    }

    async fn reattach_now(&self) -> Result<Client> {
        let _one = self.reattaching.lock().await;
        let info = match &*self.attached.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(attached) if !attached.is_stale() => return Ok(attached.client.clone()),
            Some(attached) => attached.client.session().clone(),
            None => return Err(ended()),
        };
        if matches!(self.session.status(), SessionStatus::Ended(_))
            || Instant::now() >= self.valid_until()
        {
            self.end(LostReason::SessionExpired);
            connect::close_session(&self.config, info).await;
            return Err(ended());
        }
        // Nothing heartbeats until the attach is done and the nodes are checked.
        self.session.suspend(self.valid_until());
        let sent = Instant::now();
        let Some(client) = connect::reattach(&self.config, info).await? else {
            self.end(LostReason::SessionExpired);
            return Err(ended());
        };
        if let Err(fail) = self.reconcile(&client).await {
            self.end(if fail.is(&ZkError::SessionExpired) {
                LostReason::SessionExpired
            } else {
                LostReason::SessionClosed
            });
            connect::close(client, self.command_timeout).await;
            return Err(fail.into());
        }
        // The server answered the attach: it had the session after `sent`.
        self.acked(sent);
        *self.attached.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Attached::new(client.clone()));
        tokio::spawn(heartbeat(self.me.clone(), client.state_watcher()));
        self.session.resume();
        for (path, czxid, state) in self.held_now() {
            lease::start_watch(&self.me, &self.session, &state, &path, czxid);
        }
        tracing::debug!(
            session = format_args!("{:#x}", self.id),
            "zookeeper session attached again from another runtime"
        );
        Ok(client)
    }

    /// The held nodes whose guard still holds them.
    fn held_now(&self) -> Vec<(String, i64, Arc<LeaseState>)> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|h| {
                let state = h.state.upgrade()?;
                let holds = !state.is_closed() && state.lost_reason().is_none();
                holds.then(|| (h.path.clone(), h.czxid, state))
            })
            .collect()
    }

    /// Makes the session's nodes on the server match its guards (see the module's account).
    async fn reconcile(&self, client: &Client) -> std::result::Result<(), Fail> {
        let bound = self.command_timeout;
        let prefix = &self.beat_path;
        // After a sync, so the server answering has seen every create the session made.
        let sync = client.sync(prefix);
        let listing = client.list_ephemerals(prefix);
        let (_, listed) = tokio::time::timeout(bound, futures::future::join(sync, listing))
            .await
            .map_err(|_| Fail::TimedOut(bound))?;
        let under = format!("{prefix}/");
        let listed: HashSet<String> = listed
            .map_err(Fail::Zk)?
            .into_iter()
            .filter(|path| path.starts_with(&under))
            .collect();
        for (path, _, state) in self.held_now() {
            if !listed.contains(&path) {
                tracing::warn!(node = %path, "a held zookeeper node is gone after its runtime stopped; its guard is lost");
                state.mark_lost(LostReason::TakenOver);
                self.forget(&path);
            }
        }
        // A guard released meanwhile, on a runtime that runs, deletes its node itself; an
        // acquire still in progress on one (queued, or granted and not yet a guard) keeps its.
        let mut unheld = listed;
        for h in self.held.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if h.state.strong_count() > 0 {
                unheld.remove(&h.path);
            }
        }
        unheld.retain(|path| !self.is_queued(path.rsplit('/').next().unwrap_or_default()));
        let deletes: Vec<_> = unheld
            .iter()
            .map(|path| client.delete(path, None))
            .collect();
        let deleted = tokio::time::timeout(bound, futures::future::join_all(deletes))
            .await
            .map_err(|_| Fail::TimedOut(bound))?;
        for result in deleted {
            match result {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(error) => return Err(Fail::Zk(error)),
            }
        }
        if !unheld.is_empty() {
            tracing::debug!(
                nodes = unheld.len(),
                "deleted zookeeper nodes no guard held, left by a stopped runtime"
            );
        }
        Ok(())
    }
}
