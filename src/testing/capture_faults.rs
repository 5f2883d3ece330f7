//! Injected capture failures, for the tests (the `test-hooks` feature, and the unit tests).

use std::path::{Path, PathBuf};

/// Injected capture failures (test builds only: the `test-hooks` feature).
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

/// The failure injected for `database`, if any (read through `seam::injected_capture_fault`).
pub(crate) fn injected(database: &Path) -> Option<String> {
    let faults = FAULTS.lock();
    faults
        .iter()
        .find(|(dir, _)| database.starts_with(dir))
        .map(|(_, m)| m.clone())
}
