//! dlock's metrics as Prometheus scrapes them: a contended run on the memory backend with
//! `metrics-exporter-prometheus` as the global recorder, then the scrape's counts checked
//! against what the run did. Its own test binary (and one test) because the recorder is global
//! to the process.

use std::collections::BTreeMap;
use std::time::Duration;

use dlock::{
    DistributedLockExt, LockError, LockName, LockOptions, LostReason, MemoryLock, Renewal,
};
use metrics_exporter_prometheus::PrometheusBuilder;

const TASKS: usize = 20;
const ROUNDS: usize = 5;

/// One sample line of the scrape: `name{label="value",…} number`.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn samples(scrape: &str) -> Vec<Sample> {
    scrape
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').expect("label=value");
                    (key.to_owned(), value.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().expect("a number"),
            }
        })
        .collect()
}

/// The value of the one series named `name` whose labels are exactly `labels`.
fn value(scrape: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let wanted: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let matching: Vec<f64> = samples(scrape)
        .into_iter()
        .filter(|s| s.name == name && s.labels == wanted)
        .map(|s| s.value)
        .collect();
    match matching[..] {
        [value] => value,
        _ => {
            panic!("expected one `{name}` {labels:?} in the scrape, found {matching:?}:\n{scrape}")
        }
    }
}

fn opts() -> LockOptions {
    LockOptions::new().with_wait_timeout(Duration::from_secs(60))
}

#[tokio::test(start_paused = true)]
async fn scrape_after_a_contended_run_has_the_right_counts() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this process");
    dlock_api::observability::describe_metrics();
    let locks = MemoryLock::new();

    // 20 tasks x 5 acquires of one name: each hold spans a sleep, so the others queue.
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let locks = locks.client();
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = locks.acquire_str("coupon:1", &opts()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    // Contention seen by callers that do not wait: 3 busy try-acquires, 1 timed-out wait.
    let holder = locks.acquire_str("coupon:1", &opts()).await.unwrap();
    for _ in 0..3 {
        assert!(
            locks
                .try_acquire_str("coupon:1", &opts())
                .await
                .unwrap()
                .is_none()
        );
    }
    let short = LockOptions::new().with_wait_timeout(Duration::from_millis(50));
    let timed_out = locks.acquire_str("coupon:1", &short).await.unwrap_err();
    assert!(matches!(timed_out, LockError::Timeout { .. }));
    // A hold long enough for the watchdog to renew: every second over ten seconds.
    let renewed = locks
        .acquire_str(
            "report:1",
            &opts()
                .with_ttl(Duration::from_secs(3))
                .with_renewal(Renewal::auto()),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    renewed.release().await.unwrap();
    holder.release().await.unwrap();

    // An evicted holder: lost once, with its reason.
    let evicted = locks.acquire_str("evicted:1", &opts()).await.unwrap();
    let held_scrape = handle.render();
    assert!(locks.evict(&LockName::new("evicted:1").unwrap()));
    assert_eq!(evicted.lost().await, LostReason::SessionClosed);
    assert!(evicted.release().await.is_err());

    let scrape = handle.render();
    let memory = ("backend", "memory");
    let acquired = value(
        &scrape,
        "dlock_acquires_total",
        &[memory, ("op", "acquire"), ("outcome", "acquired")],
    );
    // The contended run's 100, the holder, the renewed hold and the evicted one.
    assert_eq!(acquired, (TASKS * ROUNDS + 3) as f64);
    assert_eq!(
        value(
            &scrape,
            "dlock_acquires_total",
            &[memory, ("op", "try_acquire"), ("outcome", "busy")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &scrape,
            "dlock_acquires_total",
            &[memory, ("op", "acquire"), ("outcome", "timeout")]
        ),
        1.0
    );
    // Every granted blocking acquire has its wait recorded, with the same outcome label.
    assert_eq!(
        value(
            &scrape,
            "dlock_wait_duration_seconds_count",
            &[memory, ("outcome", "acquired")]
        ),
        acquired
    );
    assert_eq!(
        value(
            &scrape,
            "dlock_acquire_duration_seconds_count",
            &[memory, ("op", "try_acquire"), ("outcome", "busy")]
        ),
        3.0
    );
    // The queue made the 100 wait: their waits add up to at least 99 holds of 10 ms.
    assert!(
        value(
            &scrape,
            "dlock_wait_duration_seconds_sum",
            &[memory, ("outcome", "acquired")]
        ) >= 0.99
    );

    // Guards: one was alive while the evicted holder held; none now.
    assert_eq!(value(&held_scrape, "dlock_active_guards", &[memory]), 1.0);
    assert_eq!(value(&scrape, "dlock_active_guards", &[memory]), 0.0);
    assert_eq!(
        value(
            &scrape,
            "dlock_hold_duration_seconds_count",
            &[memory, ("end", "released")]
        ),
        (TASKS * ROUNDS + 2) as f64
    );
    assert_eq!(
        value(
            &scrape,
            "dlock_hold_duration_seconds_count",
            &[memory, ("end", "lost")]
        ),
        1.0
    );

    // Losses by reason: the eviction, and nothing else.
    assert_eq!(
        value(
            &scrape,
            "dlock_losses_total",
            &[memory, ("reason", "session_closed")]
        ),
        1.0
    );
    assert_eq!(
        samples(&scrape)
            .iter()
            .filter(|s| s.name == "dlock_losses_total")
            .count(),
        1
    );

    // Renewals: one a second for ten seconds, none failed.
    let renewals = value(
        &scrape,
        "dlock_renewals_total",
        &[memory, ("outcome", "ok")],
    );
    assert!((9.0..=11.0).contains(&renewals), "{renewals} renewals");
    assert!(!scrape.contains("outcome=\"failed\""));

    // Lock names never become labels (they are unbounded).
    assert!(!scrape.contains("name=\""), "{scrape}");
    assert!(!scrape.contains("coupon:1"), "{scrape}");
}
