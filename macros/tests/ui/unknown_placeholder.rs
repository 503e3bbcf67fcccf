#[dlock::locked(locks = locks, name = "coupon:{cupon_id}")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

fn main() {}
