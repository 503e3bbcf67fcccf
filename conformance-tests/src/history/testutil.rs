//! Helpers for the history modules' unit tests.

use std::path::PathBuf;

use super::clock::now_ns;

/// A fresh directory under the system temp dir; the test removes it when it passes.
pub(crate) fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dlock-history-{label}-{}-{}",
        std::process::id(),
        now_ns()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
