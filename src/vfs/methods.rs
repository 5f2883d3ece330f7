//! The `sqlite3_vfs` methods: `xOpen` wraps the file, `xDelete` refuses to delete a WAL that is
//! no longer the one its connection pinned, everything else is handed to the wrapped VFS. And the
//! guard's other calls of SQLite's VFS API: its registration, the unix VFS's mutex.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;

use rusqlite::ffi;

use super::boundary::{cstr_path, ffi_guard, VFS_NAME_C};
use super::file;
use super::state::may_delete;
use crate::error::GuardError;

/// The registered VFS. Leaked on purpose: SQLite keeps pointers to it for the process's life.
pub(super) struct Registered(*mut ffi::sqlite3_vfs);

// SAFETY: the pointer is to a leaked, never-mutated-after-registration sqlite3_vfs; SQLite itself
// shares it between threads.
unsafe impl Send for Registered {}

impl Registered {
    /// Registers the guard's VFS over the current default one: the exit hook installed first
    /// (a last capture attempt for what is still held when the process exits normally).
    pub(super) fn new() -> Result<Registered, GuardError> {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that never unwinds (it catches panics).
        unsafe { libc::atexit(file::at_exit) };
        // SAFETY: a NULL name asks for the default VFS; SQLite initialises itself if needed.
        let sub = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if sub.is_null() {
            return Err(GuardError::Register("SQLite has no default VFS".into()));
        }
        // SAFETY: `sub` is a registered VFS, valid for the life of the process.
        let sub_name = unsafe { CStr::from_ptr((*sub).zName) };
        if sub_name == VFS_NAME_C {
            return Err(GuardError::Register(
                "the default VFS is already a hermes-guard from another copy of the library".into(),
            ));
        }
        let vfs = Box::into_raw(Box::new(guard_vfs(sub)));
        // SAFETY: `vfs` is a complete sqlite3_vfs that lives forever (leaked).
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        if rc != ffi::SQLITE_OK {
            // SAFETY: SQLite refused it, so it holds no pointer to `vfs`.
            drop(unsafe { Box::from_raw(vfs) });
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register returned {rc}"
            )));
        }
        Ok(Registered(vfs))
    }

    /// Makes it the default VFS of the process.
    pub(super) fn make_default(&self) -> Result<(), GuardError> {
        // SAFETY: re-registering a registered VFS with makeDflt=1 only relinks it at the head.
        let rc = unsafe { ffi::sqlite3_vfs_register(self.0, 1) };
        if rc != ffi::SQLITE_OK {
            return Err(GuardError::Register(format!(
                "sqlite3_vfs_register(makeDflt) returned {rc}"
            )));
        }
        Ok(())
    }
}

/// Builds the guard's `sqlite3_vfs` over `sub`.
fn guard_vfs(sub: *mut ffi::sqlite3_vfs) -> ffi::sqlite3_vfs {
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

/// SQLite's unix VFS mutex (`unixBigLock`), held while alive: no connection of this process
/// opens a `-shm` (and takes its dead-man-switch lock) meanwhile. Not recursive: never taken
/// inside a call into the unix VFS (the guard asks before or after each wrapped call).
pub(super) struct UnixVfsMutex(*mut rusqlite::ffi::sqlite3_mutex);

impl UnixVfsMutex {
    /// The mutex: static, allocated by SQLite once and never freed (NULL in a build without
    /// mutexes, which every mutex call accepts).
    fn get() -> *mut rusqlite::ffi::sqlite3_mutex {
        // SAFETY: asking for a static mutex has no precondition.
        unsafe { rusqlite::ffi::sqlite3_mutex_alloc(rusqlite::ffi::SQLITE_MUTEX_STATIC_VFS1) }
    }

    pub(super) fn enter() -> UnixVfsMutex {
        let m = UnixVfsMutex::get();
        // SAFETY: `m` is that mutex or NULL; this thread does not hold it (see the type's docs).
        unsafe { rusqlite::ffi::sqlite3_mutex_enter(m) };
        UnixVfsMutex(m)
    }

    /// [`UnixVfsMutex::enter`] if no other thread holds it now.
    pub(super) fn try_enter() -> Option<UnixVfsMutex> {
        let m = UnixVfsMutex::get();
        // SAFETY: `m` is that mutex or NULL (then SQLITE_OK: no mutexes in this build).
        let rc = unsafe { rusqlite::ffi::sqlite3_mutex_try(m) };
        (rc == rusqlite::ffi::SQLITE_OK).then_some(UnixVfsMutex(m))
    }
}

impl Drop for UnixVfsMutex {
    fn drop(&mut self) {
        // SAFETY: entered by this thread in `enter`.
        unsafe { rusqlite::ffi::sqlite3_mutex_leave(self.0) };
    }
}
