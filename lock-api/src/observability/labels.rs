//! The label values of the acquire and hold metrics, and (feature `metrics`) each backend's keys
//! of those metrics, built once.
//!
//! A `metrics` macro given label values at run time builds its key on every call: a vector of
//! labels, allocated, hashed and freed, whether or not a recorder is installed. On the acquire
//! and release path that was six keys per lock. The values here are a handful per metric, so
//! each backend tag gets its keys built at its first use and kept for the life of the process (a
//! few dozen small keys per distinct tag); a call then finds them with one read lock. The
//! recorder is still asked on every call, so one installed later, or a thread's local recorder,
//! sees every call after it.

/// Which engine entry point an acquire went through.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Acquire,
    TryAcquire,
}

impl Op {
    #[cfg(feature = "metrics")]
    const ALL: [Op; 2] = [Op::Acquire, Op::TryAcquire];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::TryAcquire => "try_acquire",
        }
    }
}

/// How an acquire call ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Acquired,
    Busy,
    Timeout,
    Error,
    Cancelled,
}

impl Outcome {
    #[cfg(feature = "metrics")]
    const ALL: [Outcome; 5] = [
        Outcome::Acquired,
        Outcome::Busy,
        Outcome::Timeout,
        Outcome::Error,
        Outcome::Cancelled,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// How a guard ended, for the hold time's `end` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum End {
    Released,
    Dropped,
    Forgotten,
    Lost,
}

impl End {
    #[cfg(feature = "metrics")]
    const ALL: [End; 4] = [End::Released, End::Dropped, End::Forgotten, End::Lost];

    #[cfg(feature = "metrics")]
    fn label(self) -> &'static str {
        match self {
            End::Released => "released",
            End::Dropped => "dropped",
            End::Forgotten => "forgotten",
            End::Lost => "lost",
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use keys::BackendKeys;

#[cfg(feature = "metrics")]
mod keys {
    use std::sync::RwLock;

    use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata};

    use super::{End, Op, Outcome};

    /// What the `metrics` macros would say of a call from the observability module.
    static METADATA: Metadata<'static> = Metadata::new(
        "dlock_api::observability",
        Level::INFO,
        Some("dlock_api::observability"),
    );

    /// Every backend tag seen so far, with its keys.
    static BUILT: RwLock<Vec<&'static BackendKeys>> = RwLock::new(Vec::new());

    /// One backend's keys of the metrics each acquire and each guard reports.
    #[derive(Debug)]
    pub(crate) struct BackendKeys {
        backend: &'static str,
        /// `dlock_acquires_total`, by op and outcome.
        acquires: [[Key; Outcome::ALL.len()]; Op::ALL.len()],
        /// `dlock_acquire_duration_seconds`, by op and outcome.
        acquire_duration: [[Key; Outcome::ALL.len()]; Op::ALL.len()],
        /// `dlock_wait_duration_seconds`, by outcome.
        wait_duration: [Key; Outcome::ALL.len()],
        /// `dlock_active_guards`.
        active_guards: Key,
        /// `dlock_hold_duration_seconds`, by end.
        hold_duration: [Key; End::ALL.len()],
    }

    impl BackendKeys {
        /// The keys of `backend`, built at its first call.
        pub(crate) fn of(backend: &'static str) -> &'static BackendKeys {
            let found = |built: &[&'static BackendKeys]| {
                built.iter().copied().find(|keys| keys.backend == backend)
            };
            if let Some(keys) = found(&BUILT.read().unwrap_or_else(|e| e.into_inner())) {
                return keys;
            }
            let mut built = BUILT.write().unwrap_or_else(|e| e.into_inner());
            if let Some(keys) = found(&built) {
                return keys;
            }
            // Kept for the process's life: a handful of keys per distinct backend tag.
            let keys: &'static BackendKeys = Box::leak(Box::new(BackendKeys::build(backend)));
            built.push(keys);
            keys
        }

        fn build(backend: &'static str) -> Self {
            let key = |name: &'static str, labels: &[(&'static str, &'static str)]| {
                let mut all = vec![Label::from_static_parts("backend", backend)];
                all.extend(labels.iter().map(|(k, v)| Label::from_static_parts(k, v)));
                Key::from_parts(name, all)
            };
            let by_op_and_outcome = |name: &'static str| {
                Op::ALL.map(|op| {
                    Outcome::ALL.map(|outcome| {
                        key(name, &[("op", op.label()), ("outcome", outcome.label())])
                    })
                })
            };
            Self {
                backend,
                acquires: by_op_and_outcome("dlock_acquires_total"),
                acquire_duration: by_op_and_outcome("dlock_acquire_duration_seconds"),
                wait_duration: Outcome::ALL.map(|outcome| {
                    key(
                        "dlock_wait_duration_seconds",
                        &[("outcome", outcome.label())],
                    )
                }),
                active_guards: key("dlock_active_guards", &[]),
                hold_duration: End::ALL
                    .map(|end| key("dlock_hold_duration_seconds", &[("end", end.label())])),
            }
        }

        pub(crate) fn acquires(&self, op: Op, outcome: Outcome) -> Counter {
            counter(&self.acquires[op as usize][outcome as usize])
        }

        pub(crate) fn acquire_duration(&self, op: Op, outcome: Outcome) -> Histogram {
            histogram(&self.acquire_duration[op as usize][outcome as usize])
        }

        pub(crate) fn wait_duration(&self, outcome: Outcome) -> Histogram {
            histogram(&self.wait_duration[outcome as usize])
        }

        pub(crate) fn active_guards(&self) -> Gauge {
            metrics::with_recorder(|r| r.register_gauge(&self.active_guards, &METADATA))
        }

        pub(crate) fn hold_duration(&self, end: End) -> Histogram {
            histogram(&self.hold_duration[end as usize])
        }
    }

    fn counter(key: &Key) -> Counter {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA))
    }

    fn histogram(key: &Key) -> Histogram {
        metrics::with_recorder(|r| r.register_histogram(key, &METADATA))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn each_backend_tag_gets_its_keys_once_with_its_labels() {
            let first = BackendKeys::of("labels-test");
            assert!(std::ptr::eq(first, BackendKeys::of("labels-test")));
            assert!(!std::ptr::eq(first, BackendKeys::of("labels-test-2")));
            let key = &first.acquires[Op::TryAcquire as usize][Outcome::Busy as usize];
            assert_eq!(key.name(), "dlock_acquires_total");
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert_eq!(
                labels,
                [
                    ("backend", "labels-test"),
                    ("op", "try_acquire"),
                    ("outcome", "busy")
                ]
            );
            let hold = &first.hold_duration[End::Forgotten as usize];
            let labels: Vec<_> = hold.labels().map(|l| (l.key(), l.value())).collect();
            assert_eq!(labels, [("backend", "labels-test"), ("end", "forgotten")]);
        }
    }
}
