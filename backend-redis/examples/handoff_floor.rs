//! Prints the raw pub/sub hand-off floor against a Redis URL (default redis://127.0.0.1:6379).

#[tokio::main]
async fn main() -> dlock_api::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let mut samples =
        dlock_redis::raw_handoff_floor(&url, std::time::Duration::from_secs(3)).await?;
    samples.sort();
    let p = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_micros();
    println!(
        "raw notified hand-off: {} samples, p50 {} µs, p99 {} µs",
        samples.len(),
        p(0.5),
        p(0.99)
    );
    Ok(())
}
