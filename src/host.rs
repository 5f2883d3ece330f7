//! Which program the guard's messages speak to. In a Python process (the loadable extension in
//! Python's `sqlite3` or apsw, as the `hermes_guard` package loads it) they name `hermes_guard`'s
//! Python calls first; anywhere else (a Rust program, Node, the `sqlite3` shell) the
//! `hermes-guard` command, which every package installs.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

static PYTHON: AtomicBool = AtomicBool::new(false);

/// Tells the guard that it runs in a Python process: its messages then name the `hermes_guard`
/// package's calls (`hermes_guard.recover(...)`) before the command. The loadable extension
/// calls it as it loads, when it finds the Python interpreter's C API in the process.
pub fn set_python_host() {
    PYTHON.store(true, Ordering::Relaxed);
}

fn python() -> bool {
    PYTHON.load(Ordering::Relaxed)
}

/// What to run to merge `capture` back into `database`.
pub(crate) fn recover_hint(capture: &Path, database: &Path) -> String {
    let command = format!(
        "`hermes-guard recover {} --into {} --apply`",
        capture.display(),
        database.display()
    );
    if python() {
        format!(
            "`hermes_guard.recover(\"{}\", \"{}\", apply=True)` (or the command: {command})",
            capture.display(),
            database.display()
        )
    } else {
        command
    }
}

/// What to call to retry the captures held in this process now.
pub(crate) fn retry_hint() -> &'static str {
    if python() {
        "hermes_guard.retry_pending_captures()"
    } else {
        "hermes_guard::retry_pending_captures() in a Rust program"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_python_the_hint_is_the_command_alone() {
        // The flag is process-wide and only ever set by the extension: never in this binary.
        let hint = recover_hint(
            Path::new("/d/state.db.retired-wal-x"),
            Path::new("/d/state.db"),
        );
        assert_eq!(
            hint,
            "`hermes-guard recover /d/state.db.retired-wal-x --into /d/state.db --apply`"
        );
        assert!(!retry_hint().contains("hermes_guard."));
    }
}
