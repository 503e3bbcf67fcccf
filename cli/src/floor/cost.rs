//! What a measured loop cost this process: CPU time and context switches, from `getrusage`.
//!
//! A pair's latency says how long it took, not whose work it was. Next to the floor's, the
//! client's CPU per pair separates what the client library spends from what the server and the
//! network do: when dlock's pair takes 20 µs longer than the floor's and its CPU per pair is 20 µs
//! higher, the gap is the client's; when the CPU is the same, it is the server's or the wire's.
//! Context switches per pair count the wake-ups: a library that hands each command to another
//! task pays one more per round trip.

use std::time::Duration;

/// CPU time and context switches of this whole process (every thread), at one moment or over a
/// span between two.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessCost {
    /// User plus system CPU time.
    pub(crate) cpu: Duration,
    /// Voluntary (waiting for something) and involuntary (preempted) context switches.
    pub(crate) context_switches: u64,
}

impl ProcessCost {
    /// The process's totals so far; zero if the kernel will not say.
    pub(crate) fn now() -> Self {
        // SAFETY: getrusage(2) writes one `rusage` into the zeroed value we own; RUSAGE_SELF
        // always exists.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
                return Self::default();
            }
            usage
        };
        let time = |t: libc::timeval| {
            Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
                .saturating_add(Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0)))
        };
        let count = |n: libc::c_long| u64::try_from(n).unwrap_or(0);
        Self {
            cpu: time(usage.ru_utime).saturating_add(time(usage.ru_stime)),
            context_switches: count(usage.ru_nvcsw).saturating_add(count(usage.ru_nivcsw)),
        }
    }

    /// The cost of what ran since `earlier`, a reading taken before now.
    pub(crate) fn since(earlier: Self) -> Self {
        Self::now().saturating_sub(earlier)
    }

    /// CPU microseconds per operation, for `operations` operations.
    pub(crate) fn cpu_us_per(&self, operations: u64) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / operations.max(1) as f64
    }

    /// Context switches per operation, for `operations` operations.
    pub(crate) fn switches_per(&self, operations: u64) -> f64 {
        self.context_switches as f64 / operations.max(1) as f64
    }

    /// The cost of both spans together.
    pub(crate) fn saturating_add(self, other: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_add(other.cpu),
            context_switches: self.context_switches.saturating_add(other.context_switches),
        }
    }

    /// The cost between `earlier` and this reading. Saturating: two readings of the same
    /// process never go backwards, but a zero reading (the kernel refused) must not underflow.
    pub(crate) fn saturating_sub(self, earlier: Self) -> Self {
        Self {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            context_switches: self
                .context_switches
                .saturating_sub(earlier.context_switches),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_costs_cpu_time() {
        // Spins until the process has spent 10 ms of CPU, however long a loaded machine takes
        // to give it that; only a reading that never rises runs into the generous bound.
        let before = ProcessCost::now();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        let mut spent = ProcessCost::default();
        while spent.cpu < Duration::from_millis(10) && started.elapsed() < Duration::from_secs(30) {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            spent = ProcessCost::since(before);
        }
        assert!(spent.cpu >= Duration::from_millis(10), "{spent:?}");
        assert!(spent.cpu_us_per(10) >= 1000.0, "{spent:?}");
    }

    #[test]
    fn sums_and_differences_never_underflow() {
        let a = ProcessCost {
            cpu: Duration::from_micros(5),
            context_switches: 2,
        };
        let zero = ProcessCost::default();
        assert_eq!(zero.saturating_sub(a), zero);
        assert_eq!(a.saturating_add(a).saturating_sub(a), a);
        assert!((a.switches_per(4) - 0.5).abs() < 1e-9);
        assert!((a.cpu_us_per(0) - 5.0).abs() < 1e-9);
    }
}
