//! The guard's calls on a raw connection handle (`*mut sqlite3`), for hosts that do not hand out
//! a `rusqlite::Connection`: sqlx (`conn.lock_handle().await?.as_raw_handle().as_ptr()`), diesel
//! (`SqliteConnection::with_raw_connection`), any rusqlite's `Connection::handle()`, or a C
//! host's handle. Each is [`GuardExt`](crate::GuardExt)'s call of the same name, or
//! [`crate::pool`]'s check, on the handle's `main` database, with the same answers and errors;
//! none closes the handle.
//!
//! The handle must come from the SQLite library this crate links (in a Cargo graph there is one:
//! Cargo allows one `links = "sqlite3"` package), be open, and not be used by another thread
//! during the call.

use std::ffi::c_int;

use rusqlite::{ffi, Connection};

use crate::{ErrorClass, GuardError, GuardExt, GuardStatus};

/// Borrows `db` as a `rusqlite::Connection` that does not own it (its drop closes nothing).
///
/// # Safety
/// As the module says: an open handle of this SQLite library, not used elsewhere meanwhile.
unsafe fn borrowed(db: *mut ffi::sqlite3) -> rusqlite::Result<Connection> {
    // SAFETY: as the caller promises; `from_handle` does not take ownership.
    unsafe { Connection::from_handle(db) }
}

/// The guard's status of the handle's `main` database, after the retirement check
/// ([`GuardExt::guard_status`]). [`GuardError::NotGuarded`] when it was not opened through the
/// guard.
///
/// # Safety
/// `db` is an open connection handle of the SQLite library this crate links, not used by another
/// thread during the call.
pub unsafe fn status(db: *mut ffi::sqlite3) -> Result<GuardStatus, GuardError> {
    // SAFETY: as the caller promises.
    unsafe { borrowed(db) }?.guard_status()
}

/// Makes sure a retired generation of the handle's `main` database is captured; the status
/// ([`GuardExt::ensure_captured`]). Call it before closing the handle where the host's close
/// cannot be kept from running ([`crate::close`]'s promise, by hand): on an error the
/// generation is not captured yet, and the handle should stay open for a retry.
///
/// # Safety
/// As for [`status`].
pub unsafe fn ensure_captured(db: *mut ffi::sqlite3) -> Result<GuardStatus, GuardError> {
    // SAFETY: as the caller promises.
    unsafe { borrowed(db) }?.ensure_captured()
}

/// Whether the guard has retired the handle's `main` database, as far as it knows now
/// ([`GuardExt::is_retired`]): an atomic load, no system call, no SQL — cheap enough for a
/// pool's check at every checkout. `false` for a handle not opened through the guard.
///
/// # Safety
/// As for [`status`].
pub unsafe fn is_retired(db: *mut ffi::sqlite3) -> bool {
    // SAFETY: as the caller promises; the handle does not outlive the call.
    unsafe { super::file::retired_flag(db) }.unwrap_or(false)
}

/// [`is_retired`] of a connection borrowed here, `None` when it is not a file of the guard's.
pub(crate) fn retired_flag_of(conn: &Connection) -> Option<bool> {
    // SAFETY: `conn` is open, and borrowed here, so no other thread uses it (a rusqlite
    // Connection is not Sync) until the call returns; the handle does not outlive the call.
    unsafe { super::file::retired_flag(conn.handle()) }
}

/// `SQLITE_FCNTL_RESERVE_BYTES` on `conn`'s `main` database: sets the reserved bytes per page
/// to `*n` when it is 0..=255, and writes the former value into `*n`; SQLite's return code.
#[cfg(test)]
pub(crate) fn reserve_bytes(conn: &Connection, n: &mut c_int) -> c_int {
    // SAFETY: the handle is the open connection's and is used on this thread only, while `conn`
    // is borrowed; "main" is a NUL-terminated name; SQLITE_FCNTL_RESERVE_BYTES reads and writes
    // one `int` through the pointer, which points at `n`, alive for the call.
    unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_RESERVE_BYTES,
            (n as *mut c_int).cast::<std::ffi::c_void>(),
        )
    }
}

/// What an error with SQLite's `extended_code`, returned on this handle, means for the
/// application ([`GuardExt::classify`]): for hosts whose error type keeps only the code
/// (`SQLITE_READONLY_DBMOVED` is 1032).
///
/// # Safety
/// As for [`status`].
pub unsafe fn classify(db: *mut ffi::sqlite3, extended_code: c_int) -> ErrorClass {
    let err = rusqlite::Error::SqliteFailure(ffi::Error::new(extended_code), None);
    // SAFETY: as the caller promises.
    match unsafe { borrowed(db) } {
        Ok(conn) => conn.classify(&err),
        Err(_) => ErrorClass::from_parts(&err, None),
    }
}

/// A new connection's test for a pool's hook ([`crate::pool::check_new`]): one read, then the
/// guard's check; `Err` (the refusal, 1032) when the handle attached to a lost generation.
///
/// # Safety
/// As for [`status`].
pub unsafe fn check_new(db: *mut ffi::sqlite3) -> rusqlite::Result<()> {
    // SAFETY: as the caller promises.
    crate::pool::check_new(&unsafe { borrowed(db) }?)
}

/// The checkout test for a pool's hook ([`crate::pool::check_out`]): `Err` (the refusal, 1032)
/// when the handle's generation is retired.
///
/// # Safety
/// As for [`status`].
pub unsafe fn check_out(db: *mut ffi::sqlite3) -> rusqlite::Result<()> {
    // SAFETY: as the caller promises.
    crate::pool::check_out(&unsafe { borrowed(db) }?)
}
