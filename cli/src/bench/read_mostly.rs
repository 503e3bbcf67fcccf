//! `dlock bench --read-mostly 8`: a read-mostly mix on a reader-writer lock, next to the same
//! clients taking the name's lock. Readers on clients of their own take a share, hold it
//! `--hold` and give it back, back to back; one writer on a client of its own takes the lock,
//! holds it as long, and lets a pause of ten holds pass before it asks again. Reported: the
//! readers' throughput against the mutex throughput of the same readers taking the lock
//! (what sharing buys), and the writer's wait, p50 and p99 (what writer preference keeps short
//! under a stream of readers).

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockName, LockOptions};
use serde_json::json;
use tokio::time::Instant;

use super::{BenchArgs, Samples, ratio, rounded};

/// What one phase of the mix measured.
struct Mix {
    /// Grants to the readers (or, in the mutex phase, to the same clients taking the lock), per
    /// second.
    per_sec: f64,
    /// The writer's waits, from its request to its grant.
    writer_waits: Samples,
}

pub(super) async fn bench(
    args: &BenchArgs,
    readers: usize,
    client: &Arc<dyn DistributedLock>,
    label: &str,
    run: &str,
) -> Result<ExitCode, LockError> {
    if readers == 0 {
        return Err(LockError::invalid(
            "--read-mostly",
            "a read-mostly mix needs at least one reader",
        ));
    }
    if !client.capabilities().reader_writer {
        return Err(LockError::Unsupported {
            backend: "this backend",
            operation: "reader-writer locks (--read-mostly)",
        });
    }
    let mut clients = Vec::with_capacity(readers.saturating_add(1));
    for _ in 0..=readers {
        clients.push(args.backend.connect().await?);
    }
    let mut mutex = Vec::new();
    let mut shared = Vec::new();
    for round in 0..args.rounds {
        // Each side goes first in turn, so drift in the machine's speed hits both alike.
        for side in if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        } {
            let name = LockName::new(format!("{run}/read-mostly-{round}-{side}"))?;
            let measured = mix(&clients, &name, side, args.duration, args.hold).await?;
            if side {
                shared.push(measured);
            } else {
                mutex.push(measured);
            }
        }
    }
    let median = |values: Vec<f64>| -> f64 {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let readers_per_sec = median(shared.iter().map(|m| m.per_sec).collect());
    let mutex_per_sec = median(mutex.iter().map(|m| m.per_sec).collect());
    let wait = |p: f64| {
        median(
            shared
                .iter()
                .map(|m| m.writer_waits.percentile(p))
                .collect(),
        )
    };
    let mutex_wait = |p: f64| median(mutex.iter().map(|m| m.writer_waits.percentile(p)).collect());
    let report = json!({
        "readers": readers,
        "reads_per_sec": readers_per_sec.round(),
        "mutex_per_sec": mutex_per_sec.round(),
        "reads_vs_mutex": rounded(ratio(readers_per_sec, mutex_per_sec), 2),
        "writer_wait_p50_us": wait(50.0).round(),
        "writer_wait_p99_us": wait(99.0).round(),
        "mutex_writer_wait_p50_us": mutex_wait(50.0).round(),
        "mutex_writer_wait_p99_us": mutex_wait(99.0).round(),
    });
    if args.json {
        println!(
            "{}",
            json!({ "backend": label, "rounds": args.rounds, "read_mostly": report })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "dlock bench --read-mostly {readers} against {label}: {:?} a phase, {} round(s) (median), \
         each holding {:?}, one writer asking every {:?}",
        args.duration,
        args.rounds,
        args.hold,
        writer_pause(args.hold)
    );
    println!(
        "readers: {readers_per_sec:.0} grants/s; the same clients taking the lock: \
         {mutex_per_sec:.0} grants/s; {:.2}x",
        ratio(readers_per_sec, mutex_per_sec)
    );
    println!(
        "writer's wait among readers: p50 {:.0} µs, p99 {:.0} µs (among the same clients taking \
         the lock: p50 {:.0} µs, p99 {:.0} µs)",
        wait(50.0),
        wait(99.0),
        mutex_wait(50.0),
        mutex_wait(99.0)
    );
    Ok(ExitCode::SUCCESS)
}

/// How long the writer waits between its holds: ten holds, so the mix stays read-mostly.
fn writer_pause(hold: Duration) -> Duration {
    hold.saturating_mul(10)
}

/// One phase: the first clients but one as readers (`shared`) or as lock takers, the last as
/// the writer, for `duration`.
async fn mix(
    clients: &[Arc<dyn DistributedLock>],
    name: &LockName,
    shared: bool,
    duration: Duration,
    hold: Duration,
) -> Result<Mix, LockError> {
    let Some((writer, readers)) = clients.split_last() else {
        return Err(LockError::invalid("--read-mostly", "no clients"));
    };
    let options =
        LockOptions::new().with_wait_timeout(duration.saturating_add(Duration::from_secs(30)));
    let stop = Arc::new(AtomicBool::new(false));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for reader in readers {
        let (reader, name, options) = (reader.clone(), name.clone(), options.clone());
        let (stop, granted) = (stop.clone(), granted.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = if shared {
                    reader.read(&name, &options).await?
                } else {
                    reader.acquire(&name, &options).await?
                };
                granted.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(hold).await;
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        });
    }
    let started = Instant::now();
    let mut waits = Vec::new();
    while started.elapsed() < duration {
        let asked = Instant::now();
        let guard = writer.write(name, &options).await?;
        waits.push(asked.elapsed());
        tokio::time::sleep(hold).await;
        guard.release().await?;
        tokio::time::sleep(writer_pause(hold)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    while let Some(ended) = tasks.join_next().await {
        ended.map_err(|e| LockError::unexpected("bench", e.to_string()))??;
    }
    Ok(Mix {
        per_sec: granted.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        writer_waits: Samples::from_durations(&waits),
    })
}
