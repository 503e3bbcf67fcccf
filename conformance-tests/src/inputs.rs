//! Strategies over every input a user can give: durations at their extremes, whole
//! [`LockOptions`] values, lock names. The `input::` cases sample them against a backend, and
//! property tests (with shrinking) use them against the memory backend.

use std::time::Duration;

use dlock_api::{LockOptions, Renewal, RetryPolicy};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

/// Durations a user might pass, extremes first: zero, 1 ns, sub-millisecond, 1 ms,
/// `u64::MAX` ms, `Duration::MAX`, then ordinary and random values.
pub fn durations() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_micros(500)),
        Just(Duration::from_millis(1)),
        Just(Duration::from_millis(u64::MAX)),
        Just(Duration::MAX),
        (0u64..120_000).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn renewals() -> impl Strategy<Value = Renewal> {
    prop_oneof![
        Just(Renewal::Off),
        Just(Renewal::auto()),
        durations().prop_map(Renewal::every),
    ]
}

fn retries() -> impl Strategy<Value = RetryPolicy> {
    let multipliers = prop_oneof![
        Just(1.0),
        Just(2.0),
        Just(0.5),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(1e300),
        1.0f64..1e6,
    ];
    (durations(), durations(), multipliers, any::<bool>()).prop_map(
        |(initial, max, multiplier, jitter)| {
            RetryPolicy::exponential(initial, max)
                .with_multiplier(multiplier)
                .with_jitter(jitter)
        },
    )
}

/// Every [`LockOptions`] field over its whole range, the default as often as any value.
pub fn options() -> impl Strategy<Value = LockOptions> {
    (
        prop::option::of(durations()),
        prop::option::of(durations()),
        prop::option::of(renewals()),
        prop::option::of(durations()),
        prop::option::of(retries()),
    )
        .prop_map(|(ttl, wait, renewal, max_hold, retry)| {
            let mut opts = LockOptions::new();
            if let Some(ttl) = ttl {
                opts = opts.with_ttl(ttl);
            }
            if let Some(wait) = wait {
                opts = opts.with_wait_timeout(wait);
            }
            if let Some(renewal) = renewal {
                opts = opts.with_renewal(renewal);
            }
            if let Some(max_hold) = max_hold {
                opts = opts.with_max_hold(max_hold);
            }
            if let Some(retry) = retry {
                opts = opts.with_retry(retry);
            }
            opts
        })
}

/// Name suffixes: empty, NUL, very long, any Unicode, characters backends treat specially.
pub fn name_suffixes() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("\0".to_owned()),
        Just("a".repeat(2000)),
        Just("~{}\\/.. %'\"`;".to_owned()),
        any::<String>(),
        "[a-zA-Z0-9~/:._ -]{0,80}",
        prop::collection::vec(any::<char>(), 0..300).prop_map(|c| c.into_iter().collect()),
    ]
}

/// Draws `count` values of `strategy` at random (no shrinking): for cases that run against a
/// live backend inside an async runtime, where `proptest!` cannot drive them.
pub fn sample<S: Strategy>(strategy: S, count: usize) -> Vec<S::Value> {
    let mut runner = proptest::test_runner::TestRunner::default();
    (0..count)
        .map(|_| {
            strategy
                .new_tree(&mut runner)
                .expect("strategies here never reject")
                .current()
        })
        .collect()
}
