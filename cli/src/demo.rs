//! `dlock demo`: the coupon scenario with and without a lock.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_api::{DistributedLock, LockError, LockName, LockOptions};

use crate::BackendArgs;

/// Arguments of `dlock demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Concurrent workers, each taking one coupon.
    #[arg(long, default_value_t = 100)]
    workers: u32,
    /// Coupons in stock at the start.
    #[arg(long, default_value_t = 100)]
    stock: i64,
}

/// The "database row": a stock read and written in two steps, as an ORM would.
struct Coupon {
    stock: AtomicI64,
    issued: AtomicU64,
}

impl Coupon {
    async fn take_one(&self) {
        let left = self.stock.load(Ordering::SeqCst);
        if left <= 0 {
            return;
        }
        // The time between SELECT and UPDATE, where other requests read the same value.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.stock.store(left.saturating_sub(1), Ordering::SeqCst);
        self.issued.fetch_add(1, Ordering::SeqCst);
    }
}

pub(super) async fn demo(args: DemoArgs) -> Result<ExitCode, LockError> {
    if args.workers == 0 || args.stock < 0 {
        return Err(LockError::invalid(
            "demo arguments",
            "--workers must be at least 1 and --stock at least 0",
        ));
    }
    let locks = args.backend.connect().await?;
    println!(
        "dlock demo: {} concurrent requests each take one coupon from a stock of {} (backend: {locks})\n",
        args.workers, args.stock
    );

    let started = Instant::now();
    let unlocked = run_workers(args.workers, args.stock, None).await?;
    report("without a lock", args.stock, &unlocked, started.elapsed());

    let started = Instant::now();
    let name = LockName::new(format!("dlock-demo/coupon/{}", std::process::id()))?;
    let locked = run_workers(args.workers, args.stock, Some((locks, name))).await?;
    report("with dlock", args.stock, &locked, started.elapsed());

    let expected_left = args.stock.saturating_sub(i64::from(args.workers)).max(0);
    let ok = locked.stock.load(Ordering::SeqCst) == expected_left
        && locked.issued.load(Ordering::SeqCst) as i64 == args.stock.saturating_sub(expected_left);
    println!(
        "\n{}",
        if ok {
            "With the lock every request saw the previous one's write: no lost updates, nothing oversold."
        } else {
            "UNEXPECTED: the locked run lost updates; please report this."
        }
    );
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn run_workers(
    workers: u32,
    stock: i64,
    lock: Option<(Arc<dyn DistributedLock>, LockName)>,
) -> Result<Arc<Coupon>, LockError> {
    let coupon = Arc::new(Coupon {
        stock: AtomicI64::new(stock),
        issued: AtomicU64::new(0),
    });
    let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (coupon, lock, opts) = (coupon.clone(), lock.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            match lock {
                None => {
                    coupon.take_one().await;
                    Ok(())
                }
                Some((locks, name)) => {
                    let guard = locks.acquire(&name, &opts).await?;
                    coupon.take_one().await;
                    guard.release().await
                }
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| LockError::backend("dlock", e))??;
    }
    Ok(coupon)
}

fn report(label: &str, initial: i64, coupon: &Coupon, took: Duration) {
    let left = coupon.stock.load(Ordering::SeqCst);
    let issued = coupon.issued.load(Ordering::SeqCst) as i64;
    let lost = issued.saturating_sub(initial.saturating_sub(left));
    println!(
        "{label:>15}: {left:>4} left, {issued:>4} coupons issued, {lost:>4} lost updates (oversold)  [{} ms]",
        took.as_millis()
    );
}
