//! The `dlock` command: parses arguments and hands over to the `dlock_cli` library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    dlock_cli::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dlock: cannot start the async runtime: {e}");
            return ExitCode::from(70);
        }
    };
    // Re-executed as a worker of `dlock conformance --faults`: no arguments to parse.
    if let Some(code) = dlock_cli::run_worker_if_asked(&runtime) {
        return code;
    }
    let cli = match dlock_cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(dlock_cli::command_line_exit_code(&error));
        }
    };
    runtime.block_on(dlock_cli::run(cli))
}
