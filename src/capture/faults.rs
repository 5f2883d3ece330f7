//! Injected capture failures, for the tests (the `test-hooks` feature).

use std::path::Path;
#[cfg(any(test, feature = "test-hooks"))]
use std::path::PathBuf;

/// Injected capture failures (test builds only: the `test-hooks` feature).
#[cfg(any(test, feature = "test-hooks"))]
static FAULTS: parking_lot::Mutex<Vec<(PathBuf, String)>> = parking_lot::Mutex::new(Vec::new());

/// Test hook: make every capture of a database under `dir` fail with `message` (as a disk-full
/// would) until [`clear_capture_fault`] is called. Scoped by directory so parallel tests do not
/// see each other's faults.
#[cfg(feature = "test-hooks")]
pub fn inject_capture_fault(dir: &Path, message: &str) {
    FAULTS.lock().push((dir.to_path_buf(), message.to_owned()));
}

/// Test hook: undo [`inject_capture_fault`] for `dir`.
#[cfg(feature = "test-hooks")]
pub fn clear_capture_fault(dir: &Path) {
    FAULTS.lock().retain(|(d, _)| d != dir);
}

#[cfg(any(test, feature = "test-hooks"))]
pub(super) fn injected_fault(database: &Path) -> Option<String> {
    let faults = FAULTS.lock();
    faults
        .iter()
        .find(|(dir, _)| database.starts_with(dir))
        .map(|(_, m)| m.clone())
}

/// Without the test hooks no fault is ever injected, and nothing is locked to find that out.
#[cfg(not(any(test, feature = "test-hooks")))]
#[inline]
pub(super) fn injected_fault(_database: &Path) -> Option<String> {
    None
}
