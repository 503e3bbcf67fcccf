//! Ad-hoc timing: the raw floor (`raw_floor`) next to dlock's own pairs and hand-off.
//!
//! `cargo run --release -p dlock-postgres --example bench [-- postgres://…]`; without a URL it
//! starts a private Postgres (dlock-test-servers). Not a test: numbers only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_postgres::{PostgresLock, raw_floor};
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

const RUN: Duration = Duration::from_secs(3);

fn report(label: &str, mut samples: Vec<Duration>, over: Duration) {
    samples.sort();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    println!(
        "{label:<34} {:>8.0}/s  p50 {:>6.0} µs  p99 {:>6.0} µs  (n={})",
        samples.len() as f64 / over.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        samples.len()
    );
}

async fn dlock_pairs(url: &str) -> Vec<Duration> {
    let locks = PostgresLock::connect_url(url).await.unwrap();
    let name = LockName::new(format!("bench/{}", rand::random::<u32>())).unwrap();
    let opts = LockOptions::new();
    let pair = async || {
        let started = Instant::now();
        let g = locks.try_acquire(&name, &opts).await.unwrap().unwrap();
        g.release().await.unwrap();
        started.elapsed()
    };
    let warm = Instant::now() + Duration::from_millis(300);
    while Instant::now() < warm {
        pair().await;
    }
    let mut out = Vec::new();
    let until = Instant::now() + RUN;
    while Instant::now() < until {
        out.push(pair().await);
    }
    out
}

/// 4 workers on one key, each holding 2 ms; hand-off = next grant − previous release start.
async fn handoff<F, Fut>(workers: usize, make: F) -> (Vec<Duration>, usize)
where
    F: Fn(Arc<AtomicU64>, Arc<AtomicUsize>, Instant, Instant) -> Fut,
    Fut: std::future::Future<Output = Vec<Duration>> + Send + 'static,
{
    let released = Arc::new(AtomicU64::new(0));
    let holder = Arc::new(AtomicUsize::new(usize::MAX));
    let origin = Instant::now();
    let until = origin + RUN;
    let tasks: Vec<_> = (0..workers)
        .map(|_| tokio::spawn(make(released.clone(), holder.clone(), origin, until)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let n = all.len();
    (all, n)
}

fn since(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server;
    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => {
            server = dlock_test_servers::Postgres::start().expect("postgres");
            server.url()
        }
    };
    let floor = raw_floor(&url, RUN).await.unwrap();
    report("raw floor (try_lock+unlock)", floor, RUN);
    report("dlock pairs (fencing on)", dlock_pairs(&url).await, RUN);
    let plain = format!("{url}?fencing=false");
    report(
        "dlock pairs (fencing=false)",
        dlock_pairs(&plain).await,
        RUN,
    );

    let key: i64 = rand::random();
    let raw_url = url.clone();
    let (raw, n) = handoff(4, move |released, holder, origin, until| {
        let url = raw_url.clone();
        async move {
            let me = rand::random::<u32>() as usize;
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let mut out = Vec::new();
            while Instant::now() < until {
                sqlx::query("SET lock_timeout = '2s'")
                    .execute(&mut conn)
                    .await
                    .unwrap();
                if sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(key)
                    .execute(&mut conn)
                    .await
                    .is_err()
                {
                    continue;
                }
                let prev = holder.swap(me, Ordering::SeqCst);
                let at = released.load(Ordering::SeqCst);
                if prev != me && prev != usize::MAX && at > 0 {
                    out.push(Duration::from_nanos(since(origin).saturating_sub(at)));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                released.store(since(origin), Ordering::SeqCst);
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut conn)
                    .await
                    .unwrap();
                // Let someone else take it before trying again.
                while holder.load(Ordering::SeqCst) == me && Instant::now() < until {
                    tokio::task::yield_now().await;
                }
            }
            out
        }
    })
    .await;
    let _ = n;
    report("raw hand-off (pg_advisory_lock, 4)", raw, RUN);

    let name = LockName::new(format!("bench-handoff/{}", rand::random::<u32>())).unwrap();
    let dl_url = url.clone();
    let (dl, _) = handoff(4, move |released, holder, origin, until| {
        let (url, name) = (dl_url.clone(), name.clone());
        async move {
            let me = rand::random::<u32>() as usize;
            let locks = PostgresLock::connect_url(&url).await.unwrap();
            let opts = LockOptions::new().with_wait_timeout(Duration::from_secs(2));
            let mut out = Vec::new();
            while Instant::now() < until {
                let Ok(guard) = locks.acquire(&name, &opts).await else {
                    continue;
                };
                let prev = holder.swap(me, Ordering::SeqCst);
                let at = released.load(Ordering::SeqCst);
                if prev != me && prev != usize::MAX && at > 0 {
                    out.push(Duration::from_nanos(since(origin).saturating_sub(at)));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                released.store(since(origin), Ordering::SeqCst);
                guard.release().await.unwrap();
                while holder.load(Ordering::SeqCst) == me && Instant::now() < until {
                    tokio::task::yield_now().await;
                }
            }
            out
        }
    })
    .await;
    report("dlock hand-off (acquire, 4)", dl, RUN);
}
