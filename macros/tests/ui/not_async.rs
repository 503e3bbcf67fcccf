use std::sync::Arc;

struct Coupons {
    locks: Arc<dyn dlock::DistributedLock>,
}

impl Coupons {
    #[dlock::locked(locks = self.locks, name = "coupon:{coupon_id}")]
    fn take(&self, coupon_id: u64) -> dlock::Result<u32> {
        Ok(1)
    }
}

fn main() {}
