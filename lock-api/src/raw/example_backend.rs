// A whole backend: locks in a `HashMap` behind a mutex, the "server" every client made from one
// `MapServer` shares. A real backend keeps the same state in Redis keys, table rows or etcd keys,
// and answers the same four questions: take a name if it is free, wait until it may be, release
// it and extend it, each only for the owner that holds it.
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::raw::time::after;
use dlock_api::raw::{Grant, Holdings, LeaseState, RawLease, RawLock, RenewedBy};
use dlock_api::{Capabilities, Fencing, FencingToken, LockError, LockName, LockOptions, Result};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The shared state: who holds each name until when, the last fencing token handed out, and a
/// notification for waiters.
#[derive(Default)]
pub struct MapServer {
    locks: Mutex<HashMap<LockName, Held>>,
    last_token: Mutex<u64>,
    released: Notify,
}

struct Held {
    /// The grant's token, which is also its owner value: unique per grant.
    owner: u64,
    /// The server's own expiry of the hold, as a Redis TTL would be.
    until: Instant,
}

impl MapServer {
    fn locks(&self) -> std::sync::MutexGuard<'_, HashMap<LockName, Held>> {
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One client of a [`MapServer`].
#[derive(Clone)]
pub struct MapLock {
    pub server: Arc<MapServer>,
    /// The guards this client holds, which `close` releases.
    pub holdings: Holdings,
}

impl MapLock {
    /// Takes `name` if nobody holds it (or the holder's TTL ran out): all in one step under the
    /// mutex, so a dropped caller never leaves half a grant.
    fn take(&self, name: &LockName, options: &LockOptions) -> Option<Grant> {
        // Validity counts from before the request, as it must on a real server.
        let started = Instant::now();
        let mut locks = self.server.locks();
        if locks.get(name).is_some_and(|held| held.until > started) {
            return None;
        }
        let token = {
            let mut last = self.server.last_token.lock().unwrap_or_else(|e| e.into_inner());
            *last = last.saturating_add(1);
            *last
        };
        let until = after(started, options.ttl());
        locks.insert(name.clone(), Held { owner: token, until });
        let lease = Arc::new(MapLease {
            server: self.server.clone(),
            name: name.clone(),
            owner: token,
        });
        Some(Grant::new(
            name.clone(),
            FencingToken::new(token),
            lease,
            Arc::new(LeaseState::new(Some(until))),
            RenewedBy::Guard,
        ))
    }

    /// When the current holder's TTL runs out, if someone holds `name`.
    fn held_until(&self, name: &LockName) -> Option<Instant> {
        self.server.locks().get(name).map(|held| held.until)
    }
}

#[dlock_api::raw::async_trait]
impl RawLock for MapLock {
    fn backend(&self) -> &'static str {
        "hashmap"
    }

    fn capabilities(&self) -> Capabilities {
        // Tokens come from one counter under the same mutex as the grants: strictly rising.
        Capabilities {
            fencing: Fencing::Strict,
            ..Capabilities::TTL_LEASE
        }
    }

    fn holdings(&self) -> &Holdings {
        &self.holdings
    }

    /// `limit` is always 1: without `max_permits` in its capabilities, the engine asks no
    /// backend for more.
    async fn try_grant(
        &self,
        name: &LockName,
        _limit: u32,
        options: &LockOptions,
    ) -> Result<Option<Grant>> {
        Ok(self.take(name, options))
    }

    async fn wait_grant(
        &self,
        name: &LockName,
        _limit: u32,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<Grant>> {
        loop {
            // Armed before the attempt, so a release during it is not missed.
            let released = self.server.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(grant) = self.take(name, options) {
                return Ok(Some(grant));
            }
            // Woken by a release, or when the holder's TTL runs out (nothing announces that).
            let wake_at = match (self.held_until(name), deadline) {
                (Some(until), Some(deadline)) => until.min(deadline),
                (Some(until), None) => until,
                (None, Some(deadline)) => deadline,
                (None, None) => after(Instant::now(), Duration::from_millis(10)),
            };
            tokio::select! {
                _ = &mut released => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(None);
            }
        }
    }
}

/// One grant's hold: released and extended only while it is still this owner's.
struct MapLease {
    server: Arc<MapServer>,
    name: LockName,
    owner: u64,
}

#[dlock_api::raw::async_trait]
impl RawLease for MapLease {
    async fn release(&self) -> Result<()> {
        let now = Instant::now();
        let mut locks = self.server.locks();
        match locks.get(&self.name) {
            Some(held) if held.owner == self.owner && held.until > now => {
                locks.remove(&self.name);
                drop(locks);
                self.server.released.notify_waiters();
                Ok(())
            }
            _ => Err(LockError::NotHeld {
                name: self.name.to_string(),
            }),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<Instant> {
        let started = Instant::now();
        let mut locks = self.server.locks();
        match locks.get_mut(&self.name) {
            Some(held) if held.owner == self.owner && held.until > started => {
                held.until = after(started, ttl);
                Ok(held.until)
            }
            _ => Err(LockError::NotHeld {
                name: self.name.to_string(),
            }),
        }
    }
}

impl fmt::Debug for MapLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapLock").finish_non_exhaustive()
    }
}

impl fmt::Display for MapLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("hashmap")
    }
}

impl fmt::Debug for MapLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MapLease")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

// `DistributedLock` (acquire, try_acquire, with_lock, …) through the engine.
dlock_api::impl_distributed_lock!(MapLock);
