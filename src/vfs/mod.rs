//! The shim: a `sqlite3_vfs` named `hermes-guard` that wraps the VFS that was default when it was
//! registered (the unix VFS) and hands every call down to it, intercepting only what it must to
//! pin, check, refuse, capture and keep close away from a newer generation.
//!
//! All of the crate's `unsafe` lives under this module.

mod boundary;
mod file;
mod fork;
mod held;
mod in_use;
mod locked_fds;
mod main_reads;
mod methods;
pub mod raw;
mod retry;
mod shield;
pub mod sql_functions;
mod stale_wal;
pub(crate) mod state;
mod wal_index;
pub use retry::{set_orphan_capture_dir, ORPHAN_DIR_ENV};
mod watch;

use std::ffi::CStr;
use std::ptr;

use parking_lot::Mutex;
use rusqlite::ffi;

use crate::error::GuardError;

/// Name under which the VFS is registered.
pub const VFS_NAME: &str = "hermes-guard";

/// The registered VFS. Leaked on purpose: SQLite keeps pointers to it for the process's life.
struct Registered(*mut ffi::sqlite3_vfs);
// SAFETY: the pointer is to a leaked, never-mutated-after-registration sqlite3_vfs; SQLite itself
// shares it between threads.
unsafe impl Send for Registered {}

static REGISTERED: Mutex<Option<Registered>> = Mutex::new(None);

/// Registers `hermes-guard` over the current default VFS. Idempotent and thread-safe.
pub fn register() -> Result<(), GuardError> {
    register_impl(false)
}

/// Registers `hermes-guard` and makes it the default VFS of the process.
pub fn register_as_default() -> Result<(), GuardError> {
    register_impl(true)
}

fn register_impl(make_default: bool) -> Result<(), GuardError> {
    let mut registered = REGISTERED.lock();
    if registered.is_none() {
        // Before any file is opened through the guard: a forked child must be told apart.
        fork::install();
        // The SQL functions on every connection opened from now on (hosts without rusqlite's
        // types ask the guard through them).
        sql_functions::install_for_every_connection();
        // A last capture attempt for what is still held when the process exits normally.
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that never unwinds (it catches panics).
        unsafe { libc::atexit(held::at_exit) };
        // SAFETY: a NULL name asks for the default VFS; SQLite initialises itself if needed.
        let sub = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if sub.is_null() {
            return Err(GuardError::Register("SQLite has no default VFS".into()));
        }
        // SAFETY: `sub` is a registered VFS, valid for the life of the process.
        let sub_name = unsafe { CStr::from_ptr((*sub).zName) };
        if sub_name == boundary::VFS_NAME_C {
            return Err(GuardError::Register(
                "the default VFS is already a hermes-guard from another copy of the library".into(),
            ));
        }
        let vfs = Box::into_raw(Box::new(methods::guard_vfs(sub)));
        // SAFETY: `vfs` is a complete sqlite3_vfs that lives forever (leaked).
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        if rc != ffi::SQLITE_OK {
            // SAFETY: SQLite refused it, so it holds no pointer to `vfs`.
            drop(unsafe { Box::from_raw(vfs) });
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register returned {rc}"
            )));
        }
        *registered = Some(Registered(vfs));
    }
    if make_default {
        let vfs = registered.as_ref().map(|r| r.0).expect("registered above");
        // SAFETY: re-registering a registered VFS with makeDflt=1 only relinks it at the head.
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 1) };
        if rc != ffi::SQLITE_OK {
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register(makeDflt) returned {rc}"
            )));
        }
    }
    Ok(())
}

/// The retired flag of `conn`'s main database, `None` when it is not a file of the guard's
/// (`GuardExt::is_retired`, a pool's `has_broken`). Reads an atomic: no system call,
/// no SQL.
pub(crate) fn retired_flag(conn: &rusqlite::Connection) -> Option<bool> {
    // SAFETY: `conn` is open, and borrowed here, so no other thread uses it (a rusqlite
    // Connection is not Sync) until the call returns; the handle does not outlive the call.
    unsafe { file::retired_flag(conn.handle()) }
}

/// Retries the pending captures from the application's thread (see `held::retry_pending_captures`).
pub(crate) fn retry_pending_captures() -> usize {
    held::retry_pending_captures(held::Caller::Application)
}
