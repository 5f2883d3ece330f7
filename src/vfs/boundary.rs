//! The C boundary's small helpers every callback of the shim uses: `ffi_guard` (a panic becomes
//! an SQLite error code, never an unwind into C), strings from and to SQLite (a path byte for
//! byte, text for people, an answer SQLite frees), the running SQLite's version, SQLite's error
//! log. The bottom of
//! the house: it imports nothing of the shim.

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::ptr;

use rusqlite::ffi;

/// [`crate::VFS_NAME`] as SQLite is given it.
pub(super) const VFS_NAME_C: &CStr = c"hermes-guard";

/// Runs `f`, turning a panic into `on_panic`: unwinding across the FFI boundary would abort.
pub(super) fn ffi_guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            log::error!("hermes-guard: internal panic caught at the FFI boundary: {what}");
            on_panic
        }
    }
}

/// The version of the SQLite the guard runs in, as the library reports it at run time: in an
/// extension host, the host's (the `SQLITE_VERSION` constant is the one this crate was compiled
/// against, which is not what a message about the host's structures must name).
pub(super) fn running_sqlite_version() -> String {
    // SAFETY: sqlite3_libversion returns a pointer to a static NUL-terminated string (NULL is
    // handled by cstr_text).
    unsafe { cstr_text(ffi::sqlite3_libversion()) }.unwrap_or_else(|| "?".into())
}

/// Copies `s` into memory from `sqlite3_malloc`, as SQLite expects of file-control answers.
pub(super) fn sqlite_string(s: &str) -> *mut c_char {
    let bytes = s.as_bytes();
    // SAFETY: plain allocation; checked for NULL below.
    let p = unsafe { ffi::sqlite3_malloc64(bytes.len() as u64 + 1) } as *mut u8;
    if p.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: `p` has room for len + 1 bytes and does not overlap `bytes`.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
        *p.add(bytes.len()) = 0;
    }
    p as *mut c_char
}

/// `sqlite3_log(code, "%s", text)`: SQLite's error log (nothing unless a log callback is
/// configured).
pub(crate) fn sqlite_log(code: c_int, text: &CStr) {
    // SAFETY: both pointers are valid NUL-terminated strings that outlive the call; the format
    // is the literal "%s" and exactly one string argument follows it, which is what SQLite's
    // printf reads. sqlite3_log may be called from any thread at any time, before or after
    // sqlite3_initialize, and inside VFS methods (SQLite's own os_unix.c does).
    unsafe { ffi::sqlite3_log(code, c"%s".as_ptr(), text.as_ptr()) }
}

/// Text for people (a VFS name), never a path: invalid UTF-8 becomes U+FFFD.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(super) unsafe fn cstr_text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A pathname from SQLite, byte for byte: a Unix path is bytes, and a lossy conversion would
/// name another file (or none).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(super) unsafe fn cstr_path(p: *const c_char) -> Option<PathBuf> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller promises a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}
