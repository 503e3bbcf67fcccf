//! The GC-pause story, told with fencing tokens: holder A takes the lock with a short lease and
//! no renewal, then stalls (a stop-the-world GC, a frozen VM) past its lease; B takes the lock
//! with a higher token and writes. When A wakes it writes too, believing it still holds the
//! lock; the protected resource, which remembers the highest token it has seen
//! ([`dlock::FencingGate`], a model of `UPDATE … WHERE fence < $token`), refuses A's stale
//! write. Without the token check, A's write would silently overwrite B's.
//!
//! `DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock-rs --features redis --example gc_pause`;
//! without `DLOCK_URL`, the in-process memory backend.

use std::time::Duration;

use dlock::{DistributedLockExt, FencingGate, LockError, LockOptions, Renewal};

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://gc-pause".to_owned());
    let (a, b) = (dlock::connect(&url).await?, dlock::connect(&url).await?);
    let storage = FencingGate::new();
    let name = "orders/42";
    let lease = Duration::from_secs(2);
    let options = LockOptions::new()
        .with_ttl(lease)
        .with_renewal(Renewal::Off)
        .with_wait_timeout(Duration::from_secs(10));

    let guard_a = a.acquire_str(name, &options).await?;
    let token_a = guard_a.fencing_token();
    println!("A holds {name} with token {token_a} and a {lease:?} lease; A stalls…");
    // The stall: longer than the lease, and A's code cannot notice while it lasts.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;

    let guard_b = b.acquire_str(name, &options).await?;
    let token_b = guard_b.fencing_token();
    println!("B holds {name} with token {token_b} (A's lease ran out)");
    storage.admit(name, token_b)?;
    println!("B writes with token {token_b}: accepted");
    guard_b.release().await?;

    println!("A wakes and writes with token {token_a}, as if it still held the lock…");
    match storage.admit(name, token_a) {
        Err(LockError::Fenced {
            presented, highest, ..
        }) => println!("refused: token {presented} is older than {highest}: B's write is safe"),
        other => panic!("the stale write was not refused: {other:?}"),
    }
    // A's release finds its lease gone: the library says so instead of pretending.
    match guard_a.release().await {
        Err(error) => println!("A's release: {error}"),
        Ok(()) => println!("A's release: ok (its lease had not been taken yet)"),
    }
    Ok(())
}
