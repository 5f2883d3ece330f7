//! The guard's retirement and capture events, also handed to SQLite's own error log
//! (`sqlite3_log`), so a program that configured `SQLITE_CONFIG_LOG` (rusqlite's
//! `trace::config_log`, Python's or the shell's hooks) sees them without the `log` crate.
//!
//! `sqlite3_log` does nothing unless a log callback is configured, takes no lock and allocates
//! nothing: it formats into a buffer of 210 bytes on its stack, so a line longer than that (very
//! long paths) is cut short there. The same events go to the `log` crate in full.

use std::ffi::{c_int, CString};
use std::path::Path;

use rusqlite::ffi;

use crate::status::RetireReason;

/// The connection to `database` is retired: `SQLITE_READONLY_DBMOVED`, the code its writes get.
pub(crate) fn retired(database: &Path, reason: RetireReason) {
    emit(
        ffi::SQLITE_READONLY_DBMOVED,
        &format!(
            "hermes-guard: {} is retired for this connection: {}; writes to it are refused",
            database.display(),
            reason.describe()
        ),
    );
}

/// The retired generation of `database` is captured in `capture`: `SQLITE_WARNING` (rows to
/// recover are waiting there).
pub(crate) fn captured(database: &Path, capture: &Path) {
    emit(
        ffi::SQLITE_WARNING,
        &format!(
            "hermes-guard: captured the retired generation of {} into {}",
            database.display(),
            capture.display()
        ),
    );
}

/// The WAL-reset race's tripwire: the wal-index shows `nBackfill` past `mxFrame` (`message` says
/// where): `SQLITE_CORRUPT`, what the committed frames it hides amount to.
pub(crate) fn wal_index_alarm(message: &str) {
    emit(ffi::SQLITE_CORRUPT, message);
}

/// `sqlite3_log(code, "%s", message)`.
fn emit(code: c_int, message: &str) {
    // A path cannot hold a NUL; anything else that does is shown with U+FFFD there.
    let Ok(text) = CString::new(message.replace('\0', "\u{fffd}")) else {
        return;
    };
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call; the format
    // is the literal "%s" and exactly one string argument follows it, which is what SQLite's
    // printf reads. sqlite3_log may be called from any thread at any time, before or after
    // sqlite3_initialize, and inside VFS methods (SQLite's own os_unix.c does).
    unsafe { ffi::sqlite3_log(code, c"%s".as_ptr(), text.as_ptr()) }
}
