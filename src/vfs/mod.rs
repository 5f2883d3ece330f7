//! The shim: a `sqlite3_vfs` named `hermes-guard` that wraps the VFS that was default when it was
//! registered (the unix VFS) and hands every call down to it, intercepting only what it must to
//! pin, check, refuse, capture and keep close away from a newer generation.
//!
//! All of the crate's `unsafe` but one call (`src/sqlite_log.rs`) lives under this module, in
//! the files docs/architecture.md lists.

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

use parking_lot::Mutex;

use crate::error::GuardError;

/// Name under which the VFS is registered.
pub const VFS_NAME: &str = "hermes-guard";

static REGISTERED: Mutex<Option<methods::Registered>> = Mutex::new(None);

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
        watch::install_child_hook();
        // The SQL functions on every connection opened from now on (hosts without rusqlite's
        // types ask the guard through them).
        sql_functions::install_for_every_connection();
        *registered = Some(methods::Registered::new()?);
    }
    if make_default {
        registered
            .as_ref()
            .expect("registered above")
            .make_default()?;
    }
    Ok(())
}

/// The retired flag of `conn`'s main database, `None` when it is not a file of the guard's
/// (`GuardExt::is_retired`, a pool's `has_broken`). Reads an atomic: no system call,
/// no SQL.
pub(crate) fn retired_flag(conn: &rusqlite::Connection) -> Option<bool> {
    raw::retired_flag_of(conn)
}

/// Retries the pending captures from the application's thread (see `held::retry_pending_captures`).
pub(crate) fn retry_pending_captures() -> usize {
    held::retry_pending_captures(held::Caller::Application)
}
