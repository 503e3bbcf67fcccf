//! What a deployment under test provides: fresh clients and, optionally, fault hooks.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockName, Result};

/// One deployment under test: a backend in one topology (`redis`, `redis-cluster`, `memory`, …).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// Names the setup in reports, e.g. `redis-sentinel`.
    fn label(&self) -> &str;

    /// A **fresh, independent client** (its own connections or session) on every call: exclusion
    /// is tested between separate clients, as between separate processes.
    async fn client(&self) -> Result<Arc<dyn DistributedLock>>;

    /// Fault hooks backed by a server the harness controls; `None` when it cannot simulate faults
    /// (a deployed server reached by URL). Cases that need them are then not run.
    fn faults(&self) -> Option<&dyn Faults> {
        None
    }

    /// Environment variables that make this harness's setup, run in a **child process** (the
    /// same test binary, re-executed), reach the same deployment: typically
    /// `DLOCK_TEST_<BACKEND>_URL`. `None` (the default): cases that crash a holder process do not
    /// run.
    fn child_env(&self) -> Option<Vec<(String, String)>> {
        None
    }

    /// Time scale of the cases. The default suits servers on loopback.
    fn timing(&self) -> Timing {
        Timing::default()
    }
}

/// Server-side faults a harness can inject.
#[async_trait]
pub trait Faults: Send + Sync {
    /// Ends the current holder's hold on `name` from the server side, as a crashed server, a
    /// killed connection (`KILL`, `pg_terminate_backend`) or an expired session would.
    async fn kill_holder(&self, name: &LockName) -> std::result::Result<(), String>;
}

/// Durations the cases use.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// A lease short enough to wait out in a test; at least a second of margin on 2 cores.
    pub short_ttl: Duration,
    /// The generous upper bound for any awaited event. Reaching it fails the case.
    pub bound: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            short_ttl: Duration::from_secs(2),
            bound: Duration::from_secs(30),
        }
    }
}
