//! The conformance suite against the memory backend on real time, with the fault suite's
//! worker cases run as tasks of this process (paused by not polling them and cutting their
//! client off from the store, killed by aborting them): the faults a memory store can have
//! simulated, judged by the same history checker as every other backend's.

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { dlock_conformance::MemoryHarness::with_task_workers() })
}
