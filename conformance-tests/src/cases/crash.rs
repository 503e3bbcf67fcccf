//! A holder **process** that crashes: exclusion holds across processes, and the lock comes free.
//!
//! The case re-executes the running test binary as a child (with [`CHILD_HOLDS`] set), whose
//! runner connects through the harness's [`child_env`](crate::Harness::child_env), takes the lock
//! and keeps it, renewing, until it is killed with SIGKILL: no release, no drop, no goodbye.

use std::process::Stdio;
use std::sync::Arc;

use dlock_api::{Fencing, LockName, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{CaseResult, Ctx, Failure, Harness, ensure};

/// Set in a child's environment to the lock name it must take and hold.
pub const CHILD_HOLDS: &str = "DLOCK_CONFORMANCE_CHILD_HOLDS";
const CHILD_TTL_MS: &str = "DLOCK_CONFORMANCE_CHILD_TTL_MS";

/// The child's side: take `name`, print `held TOKEN`, then hold it (renewing) until killed.
pub async fn hold_until_killed(harness: Arc<dyn Harness>, name: &str) {
    let ttl_ms = std::env::var(CHILD_TTL_MS)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2000);
    let opts = LockOptions::new()
        .with_ttl(std::time::Duration::from_millis(ttl_ms))
        .with_wait_timeout(harness.timing().bound);
    let held = async {
        let client = harness.client().await?;
        client.acquire(&LockName::new(name)?, &opts).await
    };
    match held.await {
        Ok(guard) => {
            println!("held {}", guard.fencing_token());
            std::future::pending::<()>().await;
            drop(guard);
        }
        Err(error) => println!("failed {error}"),
    }
}

/// A child process holds the lock: another process cannot take it; SIGKILL the child, and the
/// lock comes free (after the TTL, or when the server sees the session gone), with a higher token.
pub async fn crashed_holder_process_frees_the_lock(ctx: Ctx) -> CaseResult {
    let env = ctx
        .child_env()
        .ok_or_else(|| Failure("no child environment".into()))?;
    let name = ctx.name("lock");
    let exe = std::env::current_exe()
        .map_err(|e| Failure(format!("cannot find the test binary: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .envs(env)
        .env(CHILD_HOLDS, name.as_str())
        .env(CHILD_TTL_MS, ctx.timing().short_ttl.as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure(format!("cannot start the child process: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Failure("no child stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = ctx
        .within("the child process to take the lock", lines.next_line())
        .await?
        .map_err(|e| Failure(e.to_string()))?
        .unwrap_or_default();
    let child_token: u64 = match line.strip_prefix("held ") {
        Some(token) => token
            .parse()
            .map_err(|_| Failure(format!("child said {line:?}")))?,
        None => {
            return Err(Failure(format!(
                "the child could not take the lock: {line:?}"
            )));
        }
    };

    let client = ctx.client().await?;
    ensure!(
        client
            .try_acquire(&name, &LockOptions::new())
            .await?
            .is_none(),
        "the lock held by another process was free"
    );
    child
        .start_kill()
        .map_err(|e| Failure(format!("cannot kill the child: {e}")))?;
    let _ = child.wait().await;

    let wait = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let next = ctx
        .within(
            "the lock after its holder process crashed",
            client.acquire(&name, &wait),
        )
        .await??;
    if client.capabilities().fencing != Fencing::None {
        ensure!(
            next.fencing_token().get() > child_token,
            "token {} after the crashed holder's {child_token}",
            next.fencing_token()
        );
    }
    next.release().await?;
    Ok(())
}
