//! The whole conformance suite against the memory backend, under paused time.

fn main() -> std::process::ExitCode {
    dlock_conformance::main_per_case(dlock_conformance::MemoryHarness::new, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("tokio runtime")
    })
}
