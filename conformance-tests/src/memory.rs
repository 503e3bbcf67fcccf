//! The harness for the in-process memory backend.

use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, MemoryLock, Result};

use crate::harness::{Faults, Harness};

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

#[async_trait]
impl Faults for MemoryHarness {
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String> {
        if self.store.evict(name) {
            Ok(())
        } else {
            Err(format!("no holder of {name:?} to kill"))
        }
    }
}
