#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", wait = "5 secnds")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", ttl = 30)]
async fn take_again(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", ttl = "0s")]
async fn take_once_more(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

fn main() {}
