//! Names: any valid name works, and different names are different locks.

use dlock_api::{LockName, LockOptions};

use crate::{CaseResult, Ctx, Failure, ensure};

/// Acquires both names at once (proving they are distinct locks), then checks each excludes.
async fn distinct(ctx: &Ctx, first: &str, second: &str) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let first = LockName::new(format!("{}{first}", ctx.name("").as_str()))?;
    let second = LockName::new(format!("{}{second}", ctx.name("").as_str()))?;
    let g1 = a.try_acquire(&first, &LockOptions::new()).await?;
    let Some(g1) = g1 else {
        return Err(Failure(format!("{first:?} was busy")));
    };
    let g2 = b.try_acquire(&second, &LockOptions::new()).await?;
    let Some(g2) = g2 else {
        return Err(Failure(format!("{second:?} shares a lock with {first:?}")));
    };
    ensure!(
        b.try_acquire(&first, &LockOptions::new()).await?.is_none(),
        "{first:?} did not exclude"
    );
    ensure!(
        a.try_acquire(&second, &LockOptions::new()).await?.is_none(),
        "{second:?} did not exclude"
    );
    g1.release().await?;
    g2.release().await?;
    Ok(())
}

/// Unicode names work and are distinct from each other.
pub async fn unicode_names_work(ctx: Ctx) -> CaseResult {
    distinct(&ctx, "쿠폰:발급:🎟", "쿠폰:발급:🎫").await
}

/// Names that differ only in case are different locks, even on case-folding servers.
pub async fn names_are_case_sensitive(ctx: Ctx) -> CaseResult {
    distinct(&ctx, "Coupon:1", "coupon:1").await
}

/// Names that differ only after byte 64 (MySQL's limit) are different locks.
pub async fn names_differ_after_byte_64(ctx: Ctx) -> CaseResult {
    let base = "x".repeat(100);
    distinct(&ctx, &format!("{base}1"), &format!("{base}2")).await
}

/// Names with `/` (a path separator for ZooKeeper and etcd) are distinct from look-alikes.
pub async fn names_with_slashes_work(ctx: Ctx) -> CaseResult {
    distinct(&ctx, "a/b", "a//b").await?;
    distinct(&ctx, "c/d", "c_d").await
}

/// A name of exactly 1024 bytes works and differs from its 1023-byte prefix.
pub async fn longest_name_works(ctx: Ctx) -> CaseResult {
    let prefix_len = ctx.name("").as_str().len();
    let long = "y".repeat(LockName::MAX_BYTES.saturating_sub(prefix_len));
    distinct(&ctx, &long, &long[..long.len().saturating_sub(1)]).await
}
