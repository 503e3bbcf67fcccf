#[dlock::locked(name = "coupon:{coupon_id}")]
async fn take(coupon_id: u64) -> dlock::Result<u64> {
    Ok(coupon_id)
}

fn main() {}
