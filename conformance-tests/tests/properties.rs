//! Property tests (with shrinking) of input handling on the memory backend: no option set and no
//! name makes a call panic; each is refused with `InvalidArgument`/`Unsupported` or behaves.

use std::time::Duration;

use dlock_api::{DistributedLock, LockError, LockName, LockOptions, MemoryLock};
use dlock_conformance::inputs::{name_suffixes, options};
use proptest::prelude::*;

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn options_are_refused_or_behave(opts in options()) {
        paused().block_on(async {
            let a = MemoryLock::new();
            let b = a.client();
            let name = LockName::new("props").unwrap();
            let valid = a.capabilities().check("memory", &opts);
            let got = a.try_acquire(&name, &opts).await;
            match valid {
                Err(_) => {
                    let refused = matches!(got, Err(LockError::InvalidArgument { .. } | LockError::Unsupported { .. }));
                    prop_assert!(refused, "{:?}: {:?}", opts, got);
                }
                Ok(()) => {
                    let guard = got.unwrap().expect("free");
                    let _ = guard.release().await;
                    let holder = b.acquire(&name, &LockOptions::new()).await.unwrap();
                    let waiting = tokio::time::timeout(Duration::from_millis(30), a.acquire(&name, &opts)).await;
                    let waited_or_timed_out = matches!(waiting, Err(_) | Ok(Err(LockError::Timeout { .. })));
                    prop_assert!(waited_or_timed_out, "{:?}", waiting);
                    holder.release().await.unwrap();
                    prop_assert_eq!(a.active_names(), 0);
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn names_are_refused_or_work(suffix in name_suffixes()) {
        paused().block_on(async {
            let locks = MemoryLock::new();
            match LockName::new(format!("props/{suffix}")) {
                Err(e) => prop_assert!(matches!(e, LockError::InvalidArgument { .. }), "{:?}", e),
                Ok(name) => {
                    let guard = locks.try_acquire(&name, &LockOptions::new()).await.unwrap();
                    guard.expect("free").release().await.unwrap();
                }
            }
            Ok(())
        })?;
    }
}
