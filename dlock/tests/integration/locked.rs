//! `#[dlock::locked]` on the memory backend: the coupon scenario, the lost signal, the wait limit,
//! and the shapes of function the attribute must accept.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dlock::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions, MemoryLock};
use tokio::sync::Notify;

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    SoldOut,
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

/// The coupon scenario's table: a stock read and written in two steps, as a row read and then
/// updated would be, with a suspension point between them where another request can run.
struct Shop {
    locks: Arc<dyn DistributedLock>,
    stock: AtomicU32,
    issued: AtomicU32,
}

impl Shop {
    fn new(locks: Arc<dyn DistributedLock>, stock: u32) -> Arc<Self> {
        Arc::new(Self {
            locks,
            stock: AtomicU32::new(stock),
            issued: AtomicU32::new(0),
        })
    }

    #[dlock::locked(locks = self.locks, name = "coupon:{coupon_id}", wait = "30s", ttl = "10s")]
    async fn take(&self, coupon_id: u64) -> Result<u32, ShopError> {
        self.take_unlocked(coupon_id).await
    }

    async fn take_unlocked(&self, _coupon_id: u64) -> Result<u32, ShopError> {
        let left = self.stock.load(Ordering::SeqCst);
        if left == 0 {
            return Err(ShopError::SoldOut);
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_micros(200)).await;
        self.stock.store(left - 1, Ordering::SeqCst);
        self.issued.fetch_add(1, Ordering::SeqCst);
        Ok(left - 1)
    }
}

async fn run_100(shop: &Arc<Shop>, locked: bool) {
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let shop = shop.clone();
            tokio::spawn(async move {
                if locked {
                    shop.take(42).await
                } else {
                    shop.take_unlocked(42).await
                }
            })
        })
        .collect();
    for task in tasks {
        match task.await.expect("task panicked") {
            Ok(_) => {}
            Err(ShopError::Lock(e)) => panic!("lock error: {e}"),
            Err(ShopError::SoldOut) => panic!("sold out before 100 coupons"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_scenario_ends_with_zero_left() {
    let memory = MemoryLock::new();
    let shop = Shop::new(Arc::new(memory.clone()), 100);
    run_100(&shop, true).await;
    assert_eq!(shop.stock.load(Ordering::SeqCst), 0, "left");
    assert_eq!(shop.issued.load(Ordering::SeqCst), 100, "issued");
    assert!(matches!(shop.take(42).await, Err(ShopError::SoldOut)));
    assert_eq!(memory.active_names(), 0, "a lock or waiter was left behind");
}

/// The control: the same requests without the attribute oversell, so the test above shows the
/// lock at work and not a scenario that cannot race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_the_scenario_oversells() {
    let shop = Shop::new(Arc::new(MemoryLock::new()), 100);
    run_100(&shop, false).await;
    assert_eq!(shop.issued.load(Ordering::SeqCst), 100);
    assert!(
        shop.stock.load(Ordering::SeqCst) > 0,
        "100 coupons issued and the stock still shows lost updates"
    );
}

struct Worker {
    locks: MemoryLock,
    started: Notify,
    finished: AtomicBool,
}

/// Sets a flag when dropped: the body's future was stopped rather than left running.
struct DropFlag<'a>(&'a AtomicBool);

impl Drop for DropFlag<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Worker {
    #[dlock::locked(locks = self.locks, name = "job:{job}", context = lock)]
    async fn run(&self, job: &str, dropped: &AtomicBool) -> dlock::Result<u64> {
        let _flag = DropFlag(dropped);
        self.started.notify_one();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        self.finished.store(true, Ordering::SeqCst);
        Ok(lock.fencing_token().get())
    }
}

#[tokio::test]
async fn a_lost_lock_stops_the_body_and_reaches_the_caller() {
    let worker = Worker {
        locks: MemoryLock::new(),
        started: Notify::new(),
        finished: AtomicBool::new(false),
    };
    let dropped = AtomicBool::new(false);
    let call = worker.run("nightly", &dropped);
    let evict = async {
        worker.started.notified().await;
        assert!(worker.locks.evict(&LockName::new("job:nightly").unwrap()));
    };
    let (result, ()) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(call, evict) })
            .await
            .expect("the body was not stopped when the lock was lost");
    match result {
        Err(LockError::Lost { name, .. }) => assert_eq!(name, "job:nightly"),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the body's future was not dropped"
    );
    assert!(
        !worker.finished.load(Ordering::SeqCst),
        "the body ran on without the lock"
    );
}

struct Ledger {
    locks: Arc<dyn DistributedLock>,
    entries: Vec<String>,
}

#[derive(Debug)]
struct Order {
    id: u32,
    account: (u8, u8),
}

impl Ledger {
    /// `&mut self` beside `self.locks`, a field placeholder and a tuple index, `?` and `return`.
    #[dlock::locked(locks = self.locks, name = "ledger:{order.id}:{order.account.1:03}", wait = "1s")]
    async fn post(
        &mut self,
        order: Order,
        note: String,
    ) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        if note.is_empty() {
            return Err("empty note".into());
        }
        let amount: u32 = note.parse()?;
        self.entries.push(format!("{} {amount}", order.id));
        Ok(self.entries.len())
    }

    /// Checks, from inside the body, that the lock is held under the expected name.
    #[dlock::locked(locks = self.locks, name = "ledger:{id}", context = lock)]
    async fn held_inside(&self, id: u32) -> dlock::Result<bool> {
        assert_eq!(lock.name().as_str(), format!("ledger:{id}"));
        let opts = LockOptions::new();
        Ok(self
            .locks
            .try_acquire_str(lock.name().as_str(), &opts)
            .await?
            .is_none())
    }
}

#[tokio::test]
async fn methods_with_mut_self_fields_and_early_returns() {
    let memory = MemoryLock::new();
    let mut ledger = Ledger {
        locks: Arc::new(memory.clone()),
        entries: Vec::new(),
    };
    let order = || Order {
        id: 7,
        account: (1, 2),
    };
    assert_eq!(ledger.post(order(), "15".into()).await.unwrap(), 1);
    assert!(ledger.post(order(), String::new()).await.is_err());
    assert!(ledger.post(order(), "x".into()).await.is_err());
    assert_eq!(ledger.entries, ["7 15"]);
    assert!(
        ledger.held_inside(3).await.unwrap(),
        "the lock was not held in the body"
    );
    // Released after the body returned, on every path.
    assert_eq!(memory.active_names(), 0);

    // The name the attribute formats, seen from outside while another client holds it.
    let other = memory.client();
    let guard = other
        .acquire_str("ledger:7:002", &LockOptions::new())
        .await
        .unwrap();
    let err = ledger.post(order(), "1".into()).await.unwrap_err();
    let err = err.downcast::<LockError>().expect("a LockError");
    assert!(matches!(*err, LockError::Timeout { .. }), "{err}");
    guard.release().await.unwrap();
}

#[dlock::locked(locks = locks, name = "report:{day}", wait = "0s", max_hold = "1m")]
async fn free_function(locks: &MemoryLock, day: u32) -> dlock::Result<u32> {
    Ok(day)
}

#[dlock::locked(
    locks = make_client(&shared),
    name = "fixed",
    options = LockOptions::new().with_wait_timeout(Duration::from_millis(10)),
    crate = ::dlock
)]
async fn from_a_call(shared: MemoryLock) -> dlock::Result<()> {
    Ok(())
}

fn make_client(shared: &MemoryLock) -> Arc<dyn DistributedLock> {
    Arc::new(shared.clone())
}

#[tokio::test(start_paused = true)]
async fn free_functions_clients_from_calls_and_a_zero_wait() {
    let memory = MemoryLock::new();
    assert_eq!(free_function(&memory, 3).await.unwrap(), 3);
    from_a_call(memory.clone()).await.unwrap();

    // wait = "0s": one try, then Timeout while another client holds the name.
    let guard = memory
        .client()
        .acquire_str("report:4", &LockOptions::new())
        .await
        .unwrap();
    assert!(matches!(
        free_function(&memory, 4).await,
        Err(LockError::Timeout { .. })
    ));
    guard.release().await.unwrap();
    assert_eq!(free_function(&memory, 4).await.unwrap(), 4);
    assert_eq!(memory.active_names(), 0);
}
