//! A small timing loop: the raw floor against dlock's own acquire + release, uncontended and
//! contended (hand-off). Not a test: numbers for the report.
//!
//! `cargo run --release -p dlock-mysql --example bench [-- mysql://root@127.0.0.1:3306/test]`
//! (without a URL it starts a private MariaDB).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_mysql::{MySqlLock, raw_floor};
use sqlx::mysql::MySqlConnection;
use sqlx::{Connection, Executor, Row};
use tokio::sync::Mutex;
use tokio::time::Instant;

const RUN: Duration = Duration::from_secs(3);

fn summary(what: &str, mut samples: Vec<Duration>, run: Duration) {
    samples.sort();
    let n = samples.len().max(1);
    let p = |q: f64| samples[((n as f64 * q) as usize).min(n - 1)].as_micros();
    println!(
        "{what:<34} {:>8.0}/s  p50 {:>5} µs  p99 {:>6} µs  (n={})",
        samples.len() as f64 / run.as_secs_f64(),
        p(0.5),
        p(0.99),
        samples.len()
    );
}

async fn dlock_pairs(url: &str) -> Vec<Duration> {
    let locks = MySqlLock::connect_url(url).await.expect("connect");
    let name = LockName::new(format!("bench/{:x}", rand::random::<u32>())).unwrap();
    let opts = LockOptions::new();
    let mut samples = Vec::new();
    let begun = Instant::now();
    while begun.elapsed() < RUN + Duration::from_millis(200) {
        let t = Instant::now();
        let guard = locks
            .try_acquire(&name, &opts)
            .await
            .unwrap()
            .expect("free");
        guard.release().await.unwrap();
        if begun.elapsed() > Duration::from_millis(200) {
            samples.push(t.elapsed());
        }
    }
    samples
}

/// 4 workers on one name, each holding 2 ms; after a release the releaser waits until someone
/// else holds. Hand-off = next acquire returned − previous holder issued its release.
async fn handoff<F, Fut>(workers: Vec<F>) -> Vec<Duration>
where
    F: FnOnce(Arc<Shared>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let shared = Arc::new(Shared::default());
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(w(shared.clone())))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    std::mem::take(&mut *shared.samples.lock().await)
}

#[derive(Default)]
struct Shared {
    released_at: Mutex<Option<Instant>>,
    samples: Mutex<Vec<Duration>>,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    acquisitions: AtomicUsize,
    stop: AtomicBool,
    someone_entered: tokio::sync::Notify,
}

impl Shared {
    async fn entered(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(at) = self.released_at.lock().await.take() {
            self.samples.lock().await.push(at.elapsed());
        }
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        self.someone_entered.notify_waiters();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    async fn leaving(&self) -> usize {
        self.inside.fetch_sub(1, Ordering::SeqCst);
        *self.released_at.lock().await = Some(Instant::now());
        self.acquisitions.load(Ordering::SeqCst)
    }
    async fn wait_other(&self, seen: usize) {
        loop {
            let entered = self.someone_entered.notified();
            tokio::pin!(entered);
            entered.as_mut().enable();
            if self.acquisitions.load(Ordering::SeqCst) != seen || self.stop.load(Ordering::SeqCst)
            {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), entered).await;
        }
    }
}

/// The same pair with dlock's fenced acquire statement, issued directly: the SQL's own cost.
async fn raw_fenced_pairs(url: &str) -> Vec<Duration> {
    let mut conn = MySqlConnection::connect(url).await.unwrap();
    conn.execute("CREATE TABLE IF NOT EXISTS dlock_fence (name VARBINARY(255) NOT NULL PRIMARY KEY, token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB").await.unwrap();
    let key = format!("bench-f/{:x}", rand::random::<u32>());
    let acquire = "INSERT INTO dlock_fence (name, token) SELECT ?, LAST_INSERT_ID(CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)) FROM DUAL WHERE GET_LOCK(?, ?) = 1 ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(GREATEST(token + 1, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS UNSIGNED)))";
    let mut samples = Vec::new();
    let begun = Instant::now();
    while begun.elapsed() < RUN + Duration::from_millis(200) {
        let t = Instant::now();
        let done = conn
            .execute(
                sqlx::query(acquire)
                    .bind(key.clone())
                    .bind(key.clone())
                    .bind(0.0f64),
            )
            .await
            .unwrap();
        assert!(done.rows_affected() > 0);
        conn.fetch_one(sqlx::query("SELECT RELEASE_LOCK(?)").bind(key.clone()))
            .await
            .unwrap();
        if begun.elapsed() > Duration::from_millis(200) {
            samples.push(t.elapsed());
        }
    }
    samples
}

#[tokio::main]
async fn main() {
    let server;
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => {
            server = dlock_test_servers::MariaDb::start().expect("start MariaDB");
            server.url()
        }
    };
    println!("uncontended pairs, {RUN:?} each");
    for round in 0..3 {
        let floor = raw_floor(&url, RUN).await.expect("floor");
        summary(&format!("raw floor GET_LOCK+RELEASE #{round}"), floor, RUN);
        summary(
            &format!("raw fenced statement+RELEASE #{round}"),
            raw_fenced_pairs(&url).await,
            RUN,
        );
        summary(
            &format!("dlock try_acquire+release #{round}"),
            dlock_pairs(&url).await,
            RUN,
        );
        let plain = format!(
            "{url}{}fencing=off",
            if url.contains('?') { '&' } else { '?' }
        );
        summary(
            &format!("dlock fencing=off #{round}"),
            dlock_pairs(&plain).await,
            RUN,
        );
    }

    println!("contended hand-off, 4 workers, 2 ms hold, {RUN:?}");
    // Floor: blocking GET_LOCK(n, 10) on one connection per worker.
    let name = format!("bench-h/{:x}", rand::random::<u32>());
    let mut floor_workers = Vec::new();
    for _ in 0..4 {
        let mut conn = MySqlConnection::connect(&url).await.unwrap();
        let name = name.clone();
        floor_workers.push(move |shared: Arc<Shared>| async move {
            let begun = Instant::now();
            while begun.elapsed() < RUN {
                let row = conn
                    .fetch_one(sqlx::query("SELECT GET_LOCK(?, 10)").bind(name.clone()))
                    .await
                    .unwrap();
                assert_eq!(row.try_get::<Option<i64>, _>(0).unwrap(), Some(1));
                shared.entered().await;
                let seen = shared.leaving().await;
                conn.fetch_one(sqlx::query("SELECT RELEASE_LOCK(?)").bind(name.clone()))
                    .await
                    .unwrap();
                shared.wait_other(seen).await;
            }
            shared.stop.store(true, Ordering::SeqCst);
        });
    }
    let floor = handoff(floor_workers).await;
    summary("raw floor hand-off", floor, RUN);

    let name = LockName::new(format!("bench-h/{:x}", rand::random::<u32>())).unwrap();
    let mut dlock_workers = Vec::new();
    for _ in 0..4 {
        let locks = MySqlLock::connect_url(&url).await.unwrap();
        let name = name.clone();
        dlock_workers.push(move |shared: Arc<Shared>| async move {
            let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(10));
            let begun = Instant::now();
            while begun.elapsed() < RUN {
                let guard = locks.acquire(&name, &opts).await.unwrap();
                shared.entered().await;
                let seen = shared.leaving().await;
                guard.release().await.unwrap();
                shared.wait_other(seen).await;
            }
            shared.stop.store(true, Ordering::SeqCst);
        });
    }
    let dlock = handoff(dlock_workers).await;
    summary("dlock hand-off", dlock, RUN);
    println!("(overlaps are counted per run; any would be a bug)");
}
