//! The scheduling VFS: stacked above `hermes-guard` (registered as `explore-guard`) and above
//! `unix` (`explore-unix`, for stock participants), it makes every call of interest a yield
//! point (`sched::yield_now`) before passing it down: `xOpen`, `xClose`, `xRead`/`xWrite`/`xSync`
//! of the main file and the WAL, `xLock`/`xUnlock`, `xShmMap`/`xShmLock`/`xShmBarrier`/
//! `xShmUnmap`, `xDelete` and `xSleep` (which yields as blocked instead of sleeping), and in the
//! scenarios that ask for it a checkpoint's `xUnfetch(0, NULL)` (`Scenario::unfetch`). Every other
//! method is passed through. The yield comes before the call, so no lock of the VFS below (the
//! guard's, the unix VFS's) is ever held while a participant waits for its turn.
//!
//! The layout: the file object of the VFS below comes first in SQLite's buffer and ours after
//! it, and while a call is passed down the file's `pMethods` is the table of the VFS below. The
//! guard recognises a main file by its own method table (`sqlite3_database_file_object` at a
//! WAL's open, then the table's data): with ours at the front, as a plain shim has it, the guard
//! would not know the WAL's database and would leave the WAL unguarded. So the WAL's open is
//! passed down with the main file's table swapped back to the guard's too.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::mem::size_of;
use std::ptr;
use std::sync::Once;

use rusqlite::ffi;

use crate::sched::{yield_now, Kind};

/// The scheduling VFS above the guard.
pub const GUARDED: &str = "explore-guard";
/// The scheduling VFS above the stock unix VFS.
pub const STOCK: &str = "explore-unix";

/// Registers the guard and the two scheduling VFSes (once per process).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        hermes_guard::register().expect("register hermes-guard");
        let size = |name: &str| {
            let c = CString::new(name).expect("a VFS name");
            // SAFETY: sqlite3_vfs_find only reads the name; the VFS is registered.
            unsafe { (*ffi::sqlite3_vfs_find(c.as_ptr())).szOsFile as usize }
        };
        let largest = size(hermes_guard::VFS_NAME).max(size("unix"));
        let _ = OFFSET.set(largest.div_ceil(8) * 8);
        register_above(GUARDED, hermes_guard::VFS_NAME);
        register_above(STOCK, "unix");
    });
}

/// Whether `xSleep` returns at once outside a schedule too (`never_sleep`).
static NEVER_SLEEP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes `xSleep` return at once, as if the time had passed, for the whole process: in a
/// connection in another process (`process.rs`), run while every participant of the schedule is
/// parked, a retry (SQLite's WAL read retries sleep up to about 10 s in all before
/// `SQLITE_PROTOCOL`) cannot see anything change, so its waits would only cost time.
pub fn never_sleep() {
    NEVER_SLEEP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The VFS's own data (`pAppData`): the VFS below.
struct App {
    below: *mut ffi::sqlite3_vfs,
}

/// Where our part of a file starts in SQLite's buffer: after the largest file object of the two
/// VFSes below, rounded up to 8 (one offset for both, so a method needs no VFS to find it).
static OFFSET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn offset() -> usize {
    *OFFSET.get().expect("registered")
}

fn register_above(name: &str, below: &str) {
    let below_c = CString::new(below).expect("a VFS name");
    // SAFETY: sqlite3_vfs_find only reads the name.
    let below_vfs = unsafe { ffi::sqlite3_vfs_find(below_c.as_ptr()) };
    assert!(!below_vfs.is_null(), "no VFS named {below}");
    let app: &'static App = Box::leak(Box::new(App { below: below_vfs }));
    // SAFETY: `below_vfs` is a registered VFS: its mxPathname is a plain read.
    let mx = unsafe { (*below_vfs).mxPathname };
    let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
        iVersion: 2,
        szOsFile: (offset() + size_of::<Ours>()) as c_int,
        mxPathname: mx,
        pNext: ptr::null_mut(),
        zName: CString::new(name).expect("a VFS name").into_raw(),
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
}

/// Our part of a file, at `offset()` in SQLite's buffer (the VFS below's file object is at 0).
struct Ours {
    /// "main", "wal" or "other" (journals, temp files: not yield points for I/O).
    kind: &'static str,
    /// The method table of the VFS below for this file.
    below: *const ffi::sqlite3_io_methods,
}

/// Our part of the file `f`.
///
/// # Safety
/// `f` is a buffer of our szOsFile bytes.
unsafe fn ours(f: *mut ffi::sqlite3_file) -> *mut Ours {
    // SAFETY: the buffer has `offset() + size_of::<Ours>()` bytes, and `offset()` is a multiple
    // of 8 (SQLite's buffers are 8-aligned).
    unsafe { (f as *mut u8).add(offset()) as *mut Ours }
}

/// Runs `call` with `f`'s table swapped to the VFS below's, then puts ours back (taking note of
/// the table the VFS below left, which it may change), unless `closing`.
///
/// # Safety
/// `f` is one of our open files, used by this thread only for the call (SQLite's rule).
unsafe fn below_call<R>(
    f: *mut ffi::sqlite3_file,
    closing: bool,
    call: impl FnOnce(&ffi::sqlite3_io_methods) -> R,
) -> R {
    // SAFETY: `f` is ours and open: its table is ours, `below` is the VFS below's.
    unsafe {
        let o = ours(f);
        let below = (*o).below;
        (*f).pMethods = below;
        let r = call(&*below);
        if !closing {
            (*o).below = (*f).pMethods;
            (*f).pMethods = &METHODS;
        }
        r
    }
}

/// # Safety
/// `vfs` is one of ours.
unsafe fn below(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: pAppData is the leaked App.
    unsafe { (*((*vfs).pAppData as *const App)).below }
}

/// The last path component of `name` (for the step list).
///
/// # Safety
/// `name` is null or a C string.
unsafe fn short(name: *const c_char) -> String {
    if name.is_null() {
        return "(temp)".into();
    }
    // SAFETY: SQLite's file names are C strings.
    let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    s.rsplit('/').next().unwrap_or_default().to_string()
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let kind = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        "main"
    } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
        "wal"
    } else {
        "other"
    };
    if kind != "other" {
        // SAFETY: `name` is SQLite's file name (a C string) or null.
        yield_now(Kind::Go, || format!("xOpen {}", unsafe { short(name) }));
    }
    // The WAL's main file, ours: its table back to the VFS below's while the WAL opens (the
    // guard finds the WAL's database through it).
    let main = if kind == "wal" {
        // SAFETY: a WAL's name is derived from its main file's, as the function expects.
        let m = unsafe { ffi::sqlite3_database_file_object(name) };
        // SAFETY: `m` is null or the main file, open while its WAL opens.
        let is_ours = !m.is_null() && std::ptr::eq(unsafe { (*m).pMethods }, &METHODS);
        is_ours.then_some(m)
    } else {
        None
    };
    // SAFETY: SQLite passes its buffer of szOsFile bytes for `file`: the VFS below's part at 0,
    // ours at offset(); `main` is an open file of ours, used by this thread.
    unsafe {
        let below = below(vfs);
        let o = ours(file);
        (*o).kind = kind;
        let open = || ((*below).xOpen.unwrap())(below, name, file, flags, out_flags);
        let rc = match main {
            Some(m) => below_call(m, false, |_| open()),
            None => open(),
        };
        if !(*file).pMethods.is_null() {
            (*o).below = (*file).pMethods;
            (*file).pMethods = &METHODS;
        }
        rc
    }
}

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync: c_int,
) -> c_int {
    yield_now(Kind::Release, || {
        // SAFETY: `name` is a C string from SQLite.
        format!("xDelete {}", unsafe { short(name) })
    });
    // SAFETY: the VFS below is registered and has this method.
    unsafe {
        let below = below(vfs);
        ((*below).xDelete.unwrap())(below, name, sync)
    }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    if crate::sched::in_schedule() {
        // Blocked: the turn goes to somebody else instead of the time passing.
        yield_now(Kind::Blocked, || "xSleep".into());
        return us;
    }
    if NEVER_SLEEP.load(std::sync::atomic::Ordering::Relaxed) {
        return us;
    }
    // SAFETY: the VFS below is registered and has this method.
    unsafe {
        let below = below(vfs);
        ((*below).xSleep.unwrap())(below, us)
    }
}

macro_rules! vfs_forward {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs $(, $arg: $ty)*) -> $ret {
                // SAFETY: the VFS below is registered and has this method.
                unsafe {
                    let below = below(vfs);
                    ((*below).$slot.unwrap())(below $(, $arg)*)
                }
            }
        )*
    };
}

vfs_forward! {
    x_access => xAccess(name: *const c_char, flags: c_int, out: *mut c_int) -> c_int;
    x_full_pathname => xFullPathname(name: *const c_char, n: c_int, out: *mut c_char) -> c_int;
    x_randomness => xRandomness(n: c_int, out: *mut c_char) -> c_int;
    x_current_time => xCurrentTime(out: *mut f64) -> c_int;
    x_get_last_error => xGetLastError(n: c_int, out: *mut c_char) -> c_int;
    x_current_time_int64 => xCurrentTimeInt64(out: *mut ffi::sqlite3_int64) -> c_int;
}

/// The kind of one of our files.
///
/// # Safety
/// `f` is one of our open files.
unsafe fn kind(f: *mut ffi::sqlite3_file) -> &'static str {
    // SAFETY: our part of an open file is initialised.
    unsafe { (*ours(f)).kind }
}

/// Forwards a method; `$y` (with the file's kind bound to `$k` and the call's arguments) says
/// whether and how to yield first.
macro_rules! io_forward {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty, [$k:ident] $y:expr;)*) => {
        $(
            #[allow(unused_variables)]
            unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
                // SAFETY: `f` is one of our open files.
                let $k = unsafe { kind(f) };
                let y: Option<(Kind, String)> = $y;
                if let Some((how, what)) = y {
                    yield_now(how, || what);
                }
                // SAFETY: `f` is one of our open files, open below too, whose table has the
                // method (SQLite tests the slots of ours the same way).
                unsafe { below_call(f, false, |m| (m.$slot.unwrap())(f $(, $arg)*)) }
            }
        )*
    };
}

/// Main file and WAL I/O yields; other files' does not.
fn io(k: &str, call: &str, off: i64) -> Option<(Kind, String)> {
    (k != "other").then(|| (Kind::Go, format!("{call} {k}@{off}")))
}

const LEVELS: [&str; 5] = ["NONE", "SHARED", "RESERVED", "PENDING", "EXCLUSIVE"];

fn level(l: c_int) -> &'static str {
    LEVELS.get(l as usize).copied().unwrap_or("?")
}

io_forward! {
    x_read => xRead(buf: *mut c_void, n: c_int, off: ffi::sqlite3_int64) -> c_int,
        [k] io(k, "xRead", off);
    x_write => xWrite(buf: *const c_void, n: c_int, off: ffi::sqlite3_int64) -> c_int,
        [k] io(k, "xWrite", off);
    x_truncate => xTruncate(size: ffi::sqlite3_int64) -> c_int, [k] io(k, "xTruncate", size);
    x_sync => xSync(flags: c_int) -> c_int, [k] io(k, "xSync", 0);
    x_file_size => xFileSize(out: *mut ffi::sqlite3_int64) -> c_int, [k] None;
    x_lock => xLock(l: c_int) -> c_int, [k] Some((Kind::Go, format!("xLock {k} {}", level(l))));
    x_unlock => xUnlock(l: c_int) -> c_int,
        [k] Some((Kind::Release, format!("xUnlock {k} {}", level(l))));
    x_check_reserved_lock => xCheckReservedLock(out: *mut c_int) -> c_int, [k] None;
    x_file_control => xFileControl(op: c_int, arg: *mut c_void) -> c_int, [k] None;
    x_sector_size => xSectorSize() -> c_int, [k] None;
    x_device_characteristics => xDeviceCharacteristics() -> c_int, [k] None;
    x_shm_map => xShmMap(region: c_int, size: c_int, extend: c_int, pp: *mut *mut c_void) -> c_int,
        [k] Some((Kind::Go, format!("xShmMap {region}")));
    x_shm_lock => xShmLock(ofst: c_int, n: c_int, flags: c_int) -> c_int,
        [k] Some(shm_lock(ofst, n, flags));
    x_shm_barrier => xShmBarrier() -> (), [k] Some((Kind::Go, "xShmBarrier".to_string()));
    x_shm_unmap => xShmUnmap(delete: c_int) -> c_int,
        [k] Some((Kind::Release, format!("xShmUnmap delete={delete}")));
    x_fetch => xFetch(off: ffi::sqlite3_int64, n: c_int, pp: *mut *mut c_void) -> c_int, [k] None;
    x_unfetch => xUnfetch(off: ffi::sqlite3_int64, p: *mut c_void) -> c_int,
        [k] unfetch(k, off, p);
}

/// `xUnfetch(0, NULL)` of a main file: with mmap off, only `sqlite3WalCheckpoint` calls it,
/// after its read of the WAL header when the header changed (the WAL-reset race's window). A
/// yield point only in the scenarios that ask (`Scenario::unfetch`).
fn unfetch(k: &str, off: i64, p: *mut c_void) -> Option<(Kind, String)> {
    (k == "main" && off == 0 && p.is_null() && crate::sched::yields_at_unfetch()).then(|| {
        (
            Kind::Go,
            "xUnfetch main (checkpoint: header read)".to_string(),
        )
    })
}

fn shm_lock(ofst: c_int, n: c_int, flags: c_int) -> (Kind, String) {
    let excl = if flags & ffi::SQLITE_SHM_EXCLUSIVE != 0 {
        "excl"
    } else {
        "shared"
    };
    if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
        (Kind::Release, format!("xShmLock {ofst}+{n} unlock {excl}"))
    } else {
        (Kind::Go, format!("xShmLock {ofst}+{n} {excl}"))
    }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: `f` is one of our open files.
    let k = unsafe { kind(f) };
    if k != "other" {
        yield_now(Kind::Release, || format!("xClose {k}"));
    }
    // SAFETY: `f` is one of our open files, open below too.
    unsafe { below_call(f, true, |m| (m.xClose.unwrap())(f)) }
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
