//! A test VFS stacked above hermes-guard that pauses a checkpointer at the one VFS call between
//! its read of the WAL header and its `nBackfill` check: `xUnfetch(0, NULL)` on its main file
//! while it holds the checkpoint lock (`sqlite3WalCheckpoint` in wal.c: after
//! `walIndexReadHdr`, when the header changed, `sqlite3OsUnfetch(pWal->pDbFd, 0, 0)`, then
//! `walCheckpoint`). At that call it runs the armed hook once, on the checkpointer's thread, and
//! only then goes on. Every other method is passed through to the VFS below it.

use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::size_of;
use std::ptr;

use parking_lot::Mutex;
use rusqlite::ffi;

type Hook = Box<dyn FnOnce() + Send>;

/// The VFS's own data (`pAppData`): the VFS below and the armed hook.
struct App {
    below: *mut ffi::sqlite3_vfs,
    hook: Mutex<Option<Hook>>,
    ran: Mutex<bool>,
}

/// A pausing VFS, registered (not as the default) for as long as the process runs: each test
/// makes its own, with a name of its own.
pub struct PauseVfs {
    app: &'static App,
    pub name: String,
}

// SAFETY: the App's raw pointer is to a registered VFS, which lives as long as the process; the
// rest is behind mutexes.
unsafe impl Sync for App {}
// SAFETY: as above.
unsafe impl Send for App {}

impl PauseVfs {
    /// Registers `name` above `below` (a registered VFS, e.g. "hermes-guard").
    pub fn register(name: &str, below: &str) -> PauseVfs {
        let below_c = CString::new(below).unwrap();
        // SAFETY: sqlite3_vfs_find only reads the name.
        let below_vfs = unsafe { ffi::sqlite3_vfs_find(below_c.as_ptr()) };
        assert!(!below_vfs.is_null(), "no VFS named {below}");
        let app: &'static App = Box::leak(Box::new(App {
            below: below_vfs,
            hook: Mutex::new(None),
            ran: Mutex::new(false),
        }));
        // SAFETY: `below_vfs` is a registered VFS: its szOsFile and mxPathname are plain reads.
        let (sz, mx) = unsafe { ((*below_vfs).szOsFile, (*below_vfs).mxPathname) };
        let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: (size_of::<PauseFile>() as c_int) + sz,
            mxPathname: mx,
            pNext: ptr::null_mut(),
            zName: CString::new(name).unwrap().into_raw(),
            pAppData: app as *const App as *mut c_void,
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        // SAFETY: the struct is leaked (lives as long as the process) and complete.
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        assert_eq!(rc, ffi::SQLITE_OK);
        PauseVfs {
            app,
            name: name.to_string(),
        }
    }

    /// Arms `hook`: the next checkpointer through this VFS that reaches the pause runs it.
    pub fn arm(&self, hook: impl FnOnce() + Send + 'static) {
        *self.app.hook.lock() = Some(Box::new(hook));
        *self.app.ran.lock() = false;
    }

    /// Whether the armed hook ran.
    pub fn paused(&self) -> bool {
        *self.app.ran.lock()
    }
}

#[repr(C)]
struct PauseFile {
    base: ffi::sqlite3_file,
    app: *const App,
    /// SQLite holds the checkpoint lock through this file.
    holds_ckpt: bool,
    /// The file object of the VFS below, right after this struct in SQLite's buffer.
    sub: *mut ffi::sqlite3_file,
}

/// # Safety
/// `vfs` is one of ours.
unsafe fn app_of<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a App {
    // SAFETY: pAppData is the leaked App.
    unsafe { &*((*vfs).pAppData as *const App) }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: SQLite passes its buffer of szOsFile bytes for `file`; the VFS below gets the part
    // after our struct, which is its own szOsFile.
    unsafe {
        let app = app_of(vfs);
        let p = file as *mut PauseFile;
        let sub = (file as *mut u8).add(size_of::<PauseFile>()) as *mut ffi::sqlite3_file;
        ptr::write_bytes(sub as *mut u8, 0, (*app.below).szOsFile as usize);
        (*p).app = app;
        (*p).holds_ckpt = false;
        (*p).sub = sub;
        let rc = ((*app.below).xOpen.unwrap())(app.below, name, sub, flags, out_flags);
        (*p).base.pMethods = if (*sub).pMethods.is_null() {
            ptr::null()
        } else {
            &METHODS
        };
        rc
    }
}

macro_rules! vfs_forward {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs $(, $arg: $ty)*) -> $ret {
                // SAFETY: the VFS below is registered and has this method.
                unsafe {
                    let below = app_of(vfs).below;
                    ((*below).$slot.unwrap())(below $(, $arg)*)
                }
            }
        )*
    };
}

vfs_forward! {
    x_delete => xDelete(name: *const c_char, sync: c_int) -> c_int;
    x_access => xAccess(name: *const c_char, flags: c_int, out: *mut c_int) -> c_int;
    x_full_pathname => xFullPathname(name: *const c_char, n: c_int, out: *mut c_char) -> c_int;
    x_randomness => xRandomness(n: c_int, out: *mut c_char) -> c_int;
    x_sleep => xSleep(us: c_int) -> c_int;
    x_current_time => xCurrentTime(out: *mut f64) -> c_int;
    x_get_last_error => xGetLastError(n: c_int, out: *mut c_char) -> c_int;
    x_current_time_int64 => xCurrentTimeInt64(out: *mut ffi::sqlite3_int64) -> c_int;
}

macro_rules! io_forward {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
                // SAFETY: `f` is one of our open files; its sub-file is open and has the method
                // (checked: SQLite tests the slots of ours that way too).
                unsafe {
                    let sub = (*(f as *mut PauseFile)).sub;
                    ((*(*sub).pMethods).$slot.unwrap())(sub $(, $arg)*)
                }
            }
        )*
    };
}

io_forward! {
    x_read => xRead(buf: *mut c_void, n: c_int, off: ffi::sqlite3_int64) -> c_int;
    x_write => xWrite(buf: *const c_void, n: c_int, off: ffi::sqlite3_int64) -> c_int;
    x_truncate => xTruncate(size: ffi::sqlite3_int64) -> c_int;
    x_sync => xSync(flags: c_int) -> c_int;
    x_file_size => xFileSize(out: *mut ffi::sqlite3_int64) -> c_int;
    x_lock => xLock(level: c_int) -> c_int;
    x_unlock => xUnlock(level: c_int) -> c_int;
    x_check_reserved_lock => xCheckReservedLock(out: *mut c_int) -> c_int;
    x_file_control => xFileControl(op: c_int, arg: *mut c_void) -> c_int;
    x_sector_size => xSectorSize() -> c_int;
    x_device_characteristics => xDeviceCharacteristics() -> c_int;
    x_shm_map => xShmMap(region: c_int, size: c_int, extend: c_int, pp: *mut *mut c_void) -> c_int;
    x_shm_barrier => xShmBarrier() -> ();
    x_shm_unmap => xShmUnmap(delete: c_int) -> c_int;
    x_fetch => xFetch(off: ffi::sqlite3_int64, n: c_int, pp: *mut *mut c_void) -> c_int;
    x_unfetch_below => xUnfetch(off: ffi::sqlite3_int64, p: *mut c_void) -> c_int;
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `f` is one of our open files; its sub-file is open.
    unsafe {
        let sub = (*(f as *mut PauseFile)).sub;
        ((*(*sub).pMethods).xClose.unwrap())(sub)
    }
}

unsafe extern "C" fn x_shm_lock(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `f` is one of our open files; its sub-file is open and maps shared memory.
    unsafe {
        let p = f as *mut PauseFile;
        let sub = (*p).sub;
        let rc = ((*(*sub).pMethods).xShmLock.unwrap())(sub, ofst, n, flags);
        if ofst == 1 && n == 1 {
            if flags == ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE && rc == ffi::SQLITE_OK {
                (*p).holds_ckpt = true;
            } else if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
                (*p).holds_ckpt = false;
            }
        }
        rc
    }
}

/// The pause: `xUnfetch(0, NULL)` while this file holds the checkpoint lock runs the armed hook.
unsafe extern "C" fn x_unfetch(
    f: *mut ffi::sqlite3_file,
    off: ffi::sqlite3_int64,
    p: *mut c_void,
) -> c_int {
    // SAFETY: `f` is one of our open files.
    unsafe {
        let file = f as *mut PauseFile;
        if off == 0 && p.is_null() && (*file).holds_ckpt {
            let app = &*(*file).app;
            let hook = app.hook.lock().take();
            if let Some(hook) = hook {
                // A panic must not unwind into SQLite: the test sees `paused()` false instead.
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)).is_ok();
                *app.ran.lock() = ok;
            }
        }
        x_unfetch_below(f, off, p)
    }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};
