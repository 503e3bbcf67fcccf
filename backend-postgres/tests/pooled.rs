//! The conformance suite through PgBouncer in session mode, in front of a private Postgres: a
//! session pool keeps each client on one server session, so session advisory locks behave as
//! on a direct connection. (Transaction mode is refused at connect: see `faults.rs`.)

mod common;

fn main() -> std::process::ExitCode {
    dlock_conformance::main(|| async { common::PgHarness::start_pooled() })
}
