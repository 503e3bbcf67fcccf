//! The harness for the in-process memory backend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, MemoryLock, Result};

use crate::harness::{ClientLink, Fault, Faults, Harness, SessionControl};

/// Runs the suite against a private [`MemoryLock`] store; faults evict holders.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: MemoryLock,
    task_workers: bool,
}

impl MemoryHarness {
    /// A harness over a new store, for tokio's paused time: the fault suite's worker cases do
    /// not run (their histories are stamped with the host's clock).
    pub fn new() -> Self {
        Self::default()
    }

    /// A harness over a new store whose fault cases run their workers as tasks of this process
    /// (paused by not polling them and cutting their client off, killed by aborting them): for
    /// a runtime on real time ([`main`](crate::main)).
    pub fn with_task_workers() -> Self {
        Self {
            task_workers: true,
            ..Self::default()
        }
    }
}

/// A memory client's link to its store.
struct MemoryLink(MemoryLock);

impl ClientLink for MemoryLink {
    fn cut(&self) {
        self.0.cut_off();
    }
    fn restore(&self) {
        self.0.reconnect();
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
        match fault {
            Fault::KillHolder | Fault::KillOneHold | Fault::SuspendSession => true,
            Fault::TaskWorkers => self.task_workers,
            _ => false,
        }
    }

    fn task_client(&self) -> std::result::Result<crate::TaskClient, String> {
        if !self.task_workers {
            return Err("this memory harness runs on paused time: no worker tasks".into());
        }
        let client = self.store.client();
        Ok((Arc::new(client.clone()), Box::new(MemoryLink(client))))
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
