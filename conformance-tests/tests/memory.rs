//! The whole conformance suite against the memory backend, under paused time.

fn main() -> std::process::ExitCode {
    dlock_conformance::main_paused(dlock_conformance::MemoryHarness::new)
}
