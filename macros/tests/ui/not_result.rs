#[dlock::locked(locks = locks, name = "coupon:{coupon_id}")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> u64 {
    coupon_id
}

fn main() {}
