//! Checks on the errors a backend returns, for the backend's own tests.

use dlock_api::{LockError, Result};

/// The reason of the [`LockError::Config`] in `result`; panics naming what came instead. For
/// tests that a bad configuration (an unreadable certificate file, an untrusted server) is
/// reported as one, with a reason that says what is wrong.
///
/// The error must also read as [`one_sentence`]; it is printed (`--nocapture` shows it).
///
/// # Panics
/// When `result` is a success or another error, or the error is not one sentence.
pub fn config_reason<T>(result: Result<T>) -> String {
    match result {
        Err(error @ LockError::Config { .. }) => {
            println!("{}", one_sentence("configuration error", &error));
            let LockError::Config { reason, .. } = error else {
                unreachable!("matched as a configuration error")
            };
            reason
        }
        Err(other) => panic!("expected a configuration error, got {other:?}"),
        Ok(_) => panic!("expected a configuration error, got a success"),
    }
}

/// Checks that `error` reads as one sentence a person can act on, as the CLI, `tracing` and
/// anyhow's `{:#}` print it ([`dlock_api::error_chain`]): one line, each cause said once, and no
/// driver's `Debug` text (`Os { code: 111, kind: … }`, `Error(Transport, …)`). Returns that
/// line, for the test to print; panics naming `what` and the offending text otherwise.
///
/// # Panics
/// When the chain spans lines, repeats a cause, or carries a driver's `Debug` text.
pub fn one_sentence(what: &str, error: &LockError) -> String {
    let chain = dlock_api::error_chain(error);
    assert!(
        !chain.contains('\n'),
        "{what}: the error spans lines: {chain}"
    );
    if let Some(repeated) = repeated_cause(error) {
        panic!("{what}: `{repeated}` is said twice in `{chain}`");
    }
    for dump in [
        "Os {", "kind: ", "source: ", "code: '", "Error(", "Some(", "{ ",
    ] {
        assert!(
            !chain.contains(dump),
            "{what}: the error prints a driver's debug text ({dump}): {chain}"
        );
    }
    chain
}

/// Where a cause of `error` repeats what the chain has already said, the repeated text.
fn repeated_cause(error: &dyn std::error::Error) -> Option<String> {
    let mut shown = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if shown.contains(&text) {
            return Some(text);
        }
        shown.push_str(&text);
        next = cause.source();
    }
    None
}
