//! The harness for the in-process memory backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, MemoryLock, Result};

use crate::harness::{Fault, Faults, Harness, SessionControl};

/// Runs the suite against a private [`MemoryLock`] store; faults evict holders.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: MemoryLock,
}

impl MemoryHarness {
    /// A harness over a new store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    fn label(&self) -> &str {
        "memory"
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.store.client()))
    }

    fn faults(&self) -> Option<&dyn Faults> {
        Some(self)
    }

    async fn residue(&self, names: &[LockName]) -> std::result::Result<Vec<String>, String> {
        Ok(names
            .iter()
            .filter(|name| self.store.is_in_use(name))
            .map(|name| format!("{name} is held or waited for"))
            .collect())
    }
}

/// A memory client's session, suspended, resumed and expired in-process.
struct MemorySession(MemoryLock);

#[async_trait]
impl SessionControl for MemorySession {
    async fn suspend(&self, timeout: Duration) -> std::result::Result<(), String> {
        self.0.suspend_session(timeout);
        Ok(())
    }
    async fn resume(&self) -> std::result::Result<(), String> {
        self.0.resume_session();
        Ok(())
    }
    async fn expire(&self) -> std::result::Result<(), String> {
        self.0.expire_session();
        Ok(())
    }
}

#[async_trait]
impl Faults for MemoryHarness {
    fn supports(&self, fault: Fault) -> bool {
        matches!(fault, Fault::KillHolder | Fault::SuspendSession)
    }

    async fn session_client(
        &self,
    ) -> std::result::Result<(Arc<dyn DistributedLock>, Box<dyn SessionControl>), String> {
        let client = self.store.client();
        Ok((Arc::new(client.clone()), Box::new(MemorySession(client))))
    }

    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        if self.store.evict(name) {
            Ok(())
        } else {
            Err(format!("no holder of {name:?} to kill"))
        }
    }
}
