// What `LockOptions::validate` would refuse at every call is refused at the build.

// Renewal is on by default, every third of the ttl: under 1 ms here.
#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", ttl = "2ms")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", ttl = "500us")]
async fn take_again(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", ttl = "366days")]
async fn take_once_more(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}", max_hold = "0s")]
async fn take_for_good(locks: &dlock::MemoryLock, coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

fn main() {}
