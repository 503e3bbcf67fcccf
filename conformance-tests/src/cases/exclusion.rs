//! Mutual exclusion under real concurrency: the coupon and purchase scenarios.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::{Fencing, LockError, LockOptions};
use tokio::sync::Mutex;

use crate::{CaseResult, Ctx, Failure, ensure};

const CLIENTS: usize = 4;

async fn clients(ctx: &Ctx) -> Result<Vec<Arc<dyn dlock_api::DistributedLock>>, Failure> {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(ctx.client().await?);
    }
    Ok(clients)
}

/// 100 concurrent tasks each read-decrement-write a non-atomic stock of 100 under the lock:
/// exactly 0 remain, no two critical sections overlap, and fencing tokens rise in order.
pub async fn coupon_100_tasks_leave_zero(ctx: Ctx) -> CaseResult {
    let clients = clients(&ctx).await?;
    let fenced = clients[0].capabilities().fencing != Fencing::None;
    let name = ctx.name("coupon");
    let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound.saturating_mul(2));
    let stock = Arc::new(AtomicI64::new(100));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let client = clients[i % CLIENTS].clone();
        let (name, opts) = (name.clone(), opts.clone());
        let (stock, inside, overlaps) = (stock.clone(), inside.clone(), overlaps.clone());
        let (last_token, out_of_order) = (last_token.clone(), out_of_order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.acquire(&name, &opts).await?;
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            let token = guard.fencing_token().get();
            if last_token.swap(token, Ordering::SeqCst) >= token {
                out_of_order.fetch_add(1, Ordering::SeqCst);
            }
            let left = stock.load(Ordering::SeqCst);
            // Widen the race window: without the lock, other tasks read the same value here.
            tokio::task::yield_now().await;
            stock.store(left.saturating_sub(1), Ordering::SeqCst);
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await?;
            Ok::<(), LockError>(())
        }));
    }
    for task in tasks {
        ctx.within("a coupon task", task)
            .await?
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    let left = stock.load(Ordering::SeqCst);
    ensure!(left == 0, "{left} coupons left, expected exactly 0");
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(overlaps == 0, "{overlaps} overlapping critical sections");
    let out_of_order = out_of_order.load(Ordering::SeqCst);
    ensure!(
        !fenced || out_of_order == 0,
        "{out_of_order} fencing tokens did not rise in lock order"
    );
    Ok(())
}

/// 10 concurrent registrations of the same purchase code create exactly one record.
pub async fn purchase_10_registrations_create_one(ctx: Ctx) -> CaseResult {
    let clients = clients(&ctx).await?;
    let name = ctx.name("order:ABC-123");
    let opts = LockOptions::new().with_wait_timeout(ctx.timing().bound);
    let records = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let client = clients[i % CLIENTS].clone();
        let (name, opts, records) = (name.clone(), opts.clone(), records.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.acquire(&name, &opts).await?;
            let exists = records.lock().await.iter().any(|code| code == "ABC-123");
            tokio::task::yield_now().await;
            if !exists {
                records.lock().await.push("ABC-123".to_owned());
            }
            guard.release().await
        }));
    }
    for task in tasks {
        ctx.within("a purchase task", task)
            .await?
            .map_err(|e| Failure(format!("task panicked: {e}")))??;
    }
    let count = records.lock().await.len();
    ensure!(count == 1, "{count} records created, expected exactly 1");
    Ok(())
}

/// A client acquiring a name it already holds waits like any other client.
pub async fn same_client_is_not_reentrant(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let name = ctx.name("lock");
    let guard = client.acquire(&name, &LockOptions::new()).await?;
    let again = client.try_acquire(&name, &LockOptions::new()).await?;
    ensure!(
        again.is_none(),
        "the same client got a second guard for a held name"
    );
    let wait = LockOptions::new().with_wait_timeout(Duration::from_millis(300));
    let waited = client.acquire(&name, &wait).await;
    ensure!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "expected Timeout, got {waited:?}"
    );
    guard.release().await?;
    Ok(())
}

/// Distinct names never exclude each other: 1,000 names are held at once.
pub async fn thousand_names_held_at_once(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let mut guards = Vec::with_capacity(1000);
    for i in 0..1000 {
        let guard = client
            .try_acquire(&ctx.name(&format!("n{i}")), &LockOptions::new())
            .await?;
        let Some(guard) = guard else {
            return Err(Failure(format!("name {i} of 1000 was busy")));
        };
        guards.push(guard);
    }
    for guard in guards {
        guard.release().await?;
    }
    Ok(())
}
