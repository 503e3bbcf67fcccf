#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", lease = "30s")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

fn main() {}
