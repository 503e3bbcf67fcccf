//! `dlock conformance`: the conformance suite against a deployed backend.

use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_api::{DistributedLock, LockError};
use dlock_conformance::{Harness, Outcome};

use super::BackendArgs;

/// Arguments of `dlock conformance`.
#[derive(Debug, clap::Args)]
pub struct ConformanceArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Run only the cases whose id contains this text (e.g. `fencing::`).
    #[arg(long)]
    filter: Option<String>,
}

/// Each client is a fresh connection to the deployed backend.
#[derive(Debug)]
struct DeployedHarness {
    backend: BackendArgs,
    label: String,
}

#[async_trait]
impl Harness for DeployedHarness {
    fn label(&self) -> &str {
        &self.label
    }

    async fn client(&self) -> Result<Arc<dyn DistributedLock>, LockError> {
        self.backend.connect().await
    }
}

pub(super) async fn conformance(args: ConformanceArgs) -> Result<ExitCode, LockError> {
    let first = args.backend.connect().await?;
    let label = first.to_string();
    drop(first);
    println!("dlock conformance against {label}\n");
    let harness = Arc::new(DeployedHarness {
        backend: args.backend,
        label,
    });
    let report = dlock_conformance::run_all(harness, args.filter.as_deref())
        .await
        .map_err(|f| LockError::Config {
            backend: "dlock",
            reason: f.0,
        })?;
    for case in &report.cases {
        let ms = case.elapsed.as_millis();
        match &case.outcome {
            Outcome::Passed => println!("ok       {} ({ms} ms)", case.id),
            Outcome::Failed(why) => println!("FAILED   {} ({ms} ms): {why}", case.id),
            Outcome::NotRun(why) => println!("skipped  {}: {why}", case.id),
        }
    }
    println!("\n{}", report.summary());
    let (_, failed, _) = report.counts();
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
