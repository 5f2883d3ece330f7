//! The `sqlite3_vfs` methods: `xOpen` wraps the file, `xDelete` refuses to delete a WAL that is
//! no longer the one its connection pinned, everything else is handed to the wrapped VFS.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use rusqlite::ffi;

use super::boundary::{cstr_path, ffi_guard, VFS_NAME_C};
use super::file;
use super::state::may_delete;

/// Builds the guard's `sqlite3_vfs` over `sub`.
pub(super) fn guard_vfs(sub: *mut ffi::sqlite3_vfs) -> ffi::sqlite3_vfs {
    // SAFETY: `sub` is a registered VFS, valid for the life of the process.
    let s = unsafe { &*sub };
    ffi::sqlite3_vfs {
        iVersion: s.iVersion.min(3),
        // The unix VFS's file object lives in SQLite's buffer, any other on the heap (file.rs).
        szOsFile: file::os_file_size(s),
        mxPathname: s.mxPathname,
        pNext: ptr::null_mut(),
        zName: VFS_NAME_C.as_ptr(),
        pAppData: sub as *mut c_void,
        // Every slot the wrapped VFS leaves NULL stays NULL (SQLite reads some as "not
        // supported"); xOpen and xDelete are the guard's own.
        xOpen: Some(x_open),
        xDelete: Some(x_delete),
        xAccess: s.xAccess.map(|_| x_access as _),
        xFullPathname: s.xFullPathname.map(|_| x_full_pathname as _),
        xDlOpen: s.xDlOpen.map(|_| x_dl_open as _),
        xDlError: s.xDlError.map(|_| x_dl_error as _),
        xDlSym: s.xDlSym.map(|_| x_dl_sym as _),
        xDlClose: s.xDlClose.map(|_| x_dl_close as _),
        xRandomness: s.xRandomness.map(|_| x_randomness as _),
        xSleep: s.xSleep.map(|_| x_sleep as _),
        xCurrentTime: s.xCurrentTime.map(|_| x_current_time as _),
        xGetLastError: s.xGetLastError.map(|_| x_get_last_error as _),
        xCurrentTimeInt64: s.xCurrentTimeInt64.map(|_| x_current_time_int64 as _),
        xSetSystemCall: s.xSetSystemCall.map(|_| x_set_system_call as _),
        xGetSystemCall: s.xGetSystemCall.map(|_| x_get_system_call as _),
        xNextSystemCall: s.xNextSystemCall.map(|_| x_next_system_call as _),
    }
}

/// # Safety
/// `vfs` is the guard's registered VFS.
unsafe fn wrapped(vfs: *mut ffi::sqlite3_vfs) -> &'static ffi::sqlite3_vfs {
    // SAFETY: pAppData was set to the wrapped VFS at registration and never changes.
    unsafe { &*((*vfs).pAppData as *const ffi::sqlite3_vfs) }
}

/// # Safety
/// `vfs` is the guard's registered VFS.
unsafe fn wrapped_ptr(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: as in `wrapped`.
    unsafe { (*vfs).pAppData as *mut ffi::sqlite3_vfs }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    ffi_guard(ffi::SQLITE_CANTOPEN, || {
        // SAFETY: SQLite passes the VFS it registered, a file buffer of szOsFile bytes and a
        // filename that is NULL or valid until the file is closed.
        unsafe { file::open(wrapped_ptr(vfs), z_name, f, flags, out_flags) }
    })
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_DELETE, || {
        // SAFETY: SQLite passes NULL or a NUL-terminated pathname.
        if let Some(path) = unsafe { cstr_path(z_name) } {
            if !may_delete(&path) {
                return ffi::SQLITE_OK;
            }
        }
        // SAFETY: pass-through to the wrapped VFS with SQLite's own arguments.
        unsafe {
            match wrapped(vfs).xDelete {
                Some(x) => x(wrapped_ptr(vfs), z_name, sync_dir),
                None => ffi::SQLITE_IOERR_DELETE,
            }
        }
    })
}

macro_rules! vfs_pass_through {
    ($name:ident, $slot:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $missing:expr) => {
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> $ret {
            // SAFETY: pass-through to the wrapped VFS with SQLite's own arguments.
            unsafe {
                match wrapped(vfs).$slot {
                    Some(x) => x(wrapped_ptr(vfs), $($arg),*),
                    None => $missing,
                }
            }
        }
    };
}

vfs_pass_through!(x_access, xAccess, (z: *const c_char, flags: c_int, out: *mut c_int) -> c_int, ffi::SQLITE_IOERR_ACCESS);
vfs_pass_through!(x_full_pathname, xFullPathname, (z: *const c_char, n: c_int, out: *mut c_char) -> c_int, ffi::SQLITE_CANTOPEN);
vfs_pass_through!(x_dl_open, xDlOpen, (z: *const c_char) -> *mut c_void, ptr::null_mut());
vfs_pass_through!(x_dl_error, xDlError, (n: c_int, out: *mut c_char) -> (), ());
vfs_pass_through!(x_dl_sym, xDlSym, (h: *mut c_void, z: *const c_char) -> Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>, None);
vfs_pass_through!(x_dl_close, xDlClose, (h: *mut c_void) -> (), ());
vfs_pass_through!(x_randomness, xRandomness, (n: c_int, out: *mut c_char) -> c_int, 0);
vfs_pass_through!(x_sleep, xSleep, (us: c_int) -> c_int, 0);
vfs_pass_through!(x_current_time, xCurrentTime, (out: *mut f64) -> c_int, ffi::SQLITE_ERROR);
vfs_pass_through!(x_get_last_error, xGetLastError, (n: c_int, out: *mut c_char) -> c_int, 0);
vfs_pass_through!(x_current_time_int64, xCurrentTimeInt64, (out: *mut ffi::sqlite3_int64) -> c_int, ffi::SQLITE_ERROR);
vfs_pass_through!(x_set_system_call, xSetSystemCall, (z: *const c_char, p: ffi::sqlite3_syscall_ptr) -> c_int, ffi::SQLITE_NOTFOUND);
vfs_pass_through!(x_get_system_call, xGetSystemCall, (z: *const c_char) -> ffi::sqlite3_syscall_ptr, None);
vfs_pass_through!(x_next_system_call, xNextSystemCall, (z: *const c_char) -> *const c_char, ptr::null());
