#[derive(Debug)]
struct AppError;

#[dlock::locked(locks = locks, name = "coupon:{coupon_id}")]
async fn take(locks: &dlock::MemoryLock, coupon_id: u64) -> Result<u64, AppError> {
    Ok(coupon_id)
}

fn main() {}
