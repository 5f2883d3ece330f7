//! The io methods. A guarded file's `pMethods` points at its [`FileTable`]: the method table
//! SQLite calls, followed by the guard's data for that file (one heap allocation per open file,
//! freed at its close).
//!
//! Where the wrapped file object lives depends on the wrapped VFS:
//!
//! - **The unix VFS** (any of SQLite's `unix` family, the common case): in SQLite's own buffer
//!   (`szOsFile` is the unix VFS's), under the guard's `pMethods`. The methods the guard has no
//!   business with (reads, sizes, barriers, fetches; every method of a journal) are the unix
//!   VFS's own functions in the table, which SQLite calls with no wrapper at all, and the
//!   wrappers hand SQLite's pointer straight down. The unix VFS never reads its file's
//!   `pMethod` back (only the Apple-only proxy locking does), so the substitution is invisible
//!   to it.
//! - **Any other VFS**: on the heap, every method wrapped; its methods get the heap pointer.
//!
//! A retired, uncaptured main file outlives SQLite's close of it: its descriptor is the only way
//! left to the main image, and closing it would drop the process's locks on that inode. A unix
//! file object in SQLite's buffer is moved to the heap at that close (a `unixFile` holds no
//! pointer into itself and nothing points at it), and its one pointer into SQLite's memory, the
//! filename, which SQLite frees with the connection, is pointed at a copy of its own (see
//! [`FileTable::hold`]).

use std::alloc::{self, Layout};
use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::shield;
use super::state::{DbState, Gate, MainFile, Site, WalGate, WalIndex};
use super::{cstr_path, cstr_text, ffi_guard, sqlite_string};
use crate::capture::{self, ImageSource, Trigger};
use crate::identity::{identity_of_fd, identity_of_mapping, path_of_mapping, FileId};
use crate::status::Backfill;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Main,
    Wal,
    Other,
}

/// What a guarded file's `pMethods` points at. `#[repr(C)]` with the method table first, so
/// that SQLite's `pMethods` is a pointer to it; the rest is the guard's, at fixed offsets from
/// the one load every wrapper starts with.
#[repr(C)]
pub(super) struct FileTable {
    /// What SQLite calls: the guard's wrappers for the methods it watches, the wrapped file's
    /// own methods for the rest (see [`FileTable::methods_for`]). A WAL's `xWrite` slot is its
    /// write gate, which the state opens and closes ([`WalGate`]): hence the cell.
    methods: UnsafeCell<ffi::sqlite3_io_methods>,
    /// The wrapped file's methods, each missing slot a stub returning what a missing method
    /// means: a call down is one load and an unconditional call.
    sub: SubMethods,
    /// The wrapped file object when it lives on the heap (a wrapped VFS outside the unix
    /// family); NULL when it is SQLite's own buffer, the pointer SQLite passes.
    heap: *mut ffi::sqlite3_file,
    /// The wrapped file's own method table, as its xOpen installed it.
    sub_table: *const ffi::sqlite3_io_methods,
    /// The wrapped VFS's `szOsFile`, and the layout of a heap copy of that size.
    sub_size: usize,
    sub_layout: Layout,
    /// The filename SQLite passed to `xOpen` (its memory, valid until the file's close).
    z_name: ffi::sqlite3_filename,
    /// The wrapped object starts as a `unixFile` does, checked at the open ([`unix_prefix`]):
    /// its filename pointer can be repointed when it is held past SQLite's close.
    unix_prefix: bool,
    kind: Kind,
    /// `state`'s `DbState` when `kind == Kind::Main`, else NULL; decided at open: the one test
    /// the watched paths of `xShmLock` and `xFileControl` make before anything else, and the
    /// state they use (one load, no `Option` to test). Points into `state`'s allocation, which
    /// lives as long as this table holds the `Arc`.
    main_state: *const DbState,
    state: Option<Arc<DbState>>,
}

/// Whether the wrapped VFS's file objects live in SQLite's buffer: SQLite's own unix family
/// (`unix`, `unix-excl`, `unix-dotfile`, `unix-none`, ...: the name, and the `xOpen` of the VFS
/// registered as `unix`, which they all share), or on the heap (anything else, a host's VFS that
/// took a unix name included).
fn unix_family(sub_vfs: &ffi::sqlite3_vfs) -> bool {
    if sub_vfs.zName.is_null() {
        return false;
    }
    // SAFETY: a registered VFS's name is a NUL-terminated string that lives as long as it.
    let name = unsafe { CStr::from_ptr(sub_vfs.zName) }.to_bytes();
    if name != b"unix" && !name.starts_with(b"unix-") {
        return false;
    }
    // SAFETY: looking up a registered VFS; a registered VFS lives for the process.
    let Some(unix) = (unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()).as_ref() }) else {
        return false;
    };
    let open_of = |v: &ffi::sqlite3_vfs| v.xOpen.map(|x| x as *const () as usize);
    open_of(unix).is_some() && open_of(unix) == open_of(sub_vfs)
}

/// The layout decided at registration ([`os_file_size`]): the one wrapped VFS of the process.
static INLINE_LAYOUT: AtomicBool = AtomicBool::new(false);

/// Whether files are opened into SQLite's buffer (see [`unix_family`]), as decided when the
/// guard was registered.
fn inline_layout() -> bool {
    INLINE_LAYOUT.load(Ordering::Acquire)
}

/// The `szOsFile` of the guard's VFS over `sub_vfs`: the wrapped file object's when it lives in
/// SQLite's buffer, else only the `sqlite3_file` header (everything of the guard's is in the
/// [`FileTable`]). Called once, at the registration (under its mutex): it decides the layout
/// every `open` uses.
pub(super) fn os_file_size(sub_vfs: &ffi::sqlite3_vfs) -> c_int {
    let header = size_of::<ffi::sqlite3_file>();
    let inline = unix_family(sub_vfs);
    INLINE_LAYOUT.store(inline, Ordering::Release);
    let size = if inline {
        (sub_vfs.szOsFile.max(0) as usize).max(header)
    } else {
        header
    };
    size.next_multiple_of(8) as c_int
}

/// Declares [`SubMethods`]: one field per io method (named after its slot), and
/// `SubMethods::of`, which fills an absent slot with a stub returning `$missing` (nothing but a
/// constant: panic-free).
macro_rules! sub_methods {
    ($($slot:ident($($ty:ty),*) -> $ret:ty = $missing:expr;)*) => {
        #[allow(non_snake_case)]
        #[derive(Clone, Copy)]
        struct SubMethods {
            $($slot: unsafe extern "C" fn(*mut ffi::sqlite3_file $(, $ty)*) -> $ret,)*
        }

        impl SubMethods {
            fn of(m: &ffi::sqlite3_io_methods) -> SubMethods {
                $(
                    #[allow(non_snake_case)]
                    unsafe extern "C" fn $slot(_: *mut ffi::sqlite3_file $(, _: $ty)*) -> $ret {
                        $missing
                    }
                )*
                SubMethods {
                    $($slot: m.$slot.unwrap_or($slot),)*
                }
            }
        }
    };
}

sub_methods! {
    xClose() -> c_int = ffi::SQLITE_OK;
    xRead(*mut c_void, c_int, ffi::sqlite3_int64) -> c_int = ffi::SQLITE_IOERR_READ;
    xWrite(*const c_void, c_int, ffi::sqlite3_int64) -> c_int = ffi::SQLITE_IOERR_WRITE;
    xTruncate(ffi::sqlite3_int64) -> c_int = ffi::SQLITE_IOERR_TRUNCATE;
    xSync(c_int) -> c_int = ffi::SQLITE_IOERR_FSYNC;
    xFileSize(*mut ffi::sqlite3_int64) -> c_int = ffi::SQLITE_IOERR_FSTAT;
    xLock(c_int) -> c_int = ffi::SQLITE_IOERR_LOCK;
    xUnlock(c_int) -> c_int = ffi::SQLITE_IOERR_UNLOCK;
    xCheckReservedLock(*mut c_int) -> c_int = ffi::SQLITE_IOERR_CHECKRESERVEDLOCK;
    xFileControl(c_int, *mut c_void) -> c_int = ffi::SQLITE_NOTFOUND;
    xSectorSize() -> c_int = 4096;
    xDeviceCharacteristics() -> c_int = 0;
    xShmMap(c_int, c_int, c_int, *mut *mut c_void) -> c_int = ffi::SQLITE_IOERR_SHMMAP;
    xShmLock(c_int, c_int, c_int) -> c_int = ffi::SQLITE_IOERR_SHMLOCK;
    xShmBarrier() -> () = ();
    xShmUnmap(c_int) -> c_int = ffi::SQLITE_IOERR_SHMMAP;
    xFetch(ffi::sqlite3_int64, c_int, *mut *mut c_void) -> c_int = ffi::SQLITE_IOERR_MMAP;
    xUnfetch(ffi::sqlite3_int64, *mut c_void) -> c_int = ffi::SQLITE_IOERR_MMAP;
}

impl FileTable {
    /// The table SQLite calls for a file of `kind` whose wrapped table is `sub` (`iVersion` at
    /// most 3, the versions this crate knows). A slot is the guard's wrapper where the guard
    /// watches the method for this kind of file, or where the wrapped file object is on the
    /// heap (`heap`: SQLite's pointer is not the wrapped object's); else the wrapped method
    /// itself, which SQLite then calls with no wrapper in between.
    fn methods_for(
        kind: Kind,
        heap: bool,
        sub: &ffi::sqlite3_io_methods,
    ) -> ffi::sqlite3_io_methods {
        let version = sub.iVersion.clamp(1, 3);
        let main = kind == Kind::Main;
        let guarded = kind != Kind::Other;
        // A slot the wrapped table leaves NULL stays NULL: SQLite tests some of them (a NULL
        // `xShmMap` means "no WAL", a NULL `xFetch` "no memory-mapped I/O"), and a wrapper
        // there would claim a capability the wrapped file does not have.
        macro_rules! slot {
            ($watched:expr, $ours:expr, $theirs:ident) => {
                match sub.$theirs {
                    Some(_) if $watched || heap => Some($ours),
                    theirs => theirs,
                }
            };
        }
        macro_rules! slot_v {
            ($min:expr, $watched:expr, $ours:expr, $theirs:ident) => {
                if version >= $min {
                    slot!($watched, $ours, $theirs)
                } else {
                    None
                }
            };
        }
        type FileControlFn =
            unsafe extern "C" fn(*mut ffi::sqlite3_file, c_int, *mut c_void) -> c_int;
        type ShmLockFn = unsafe extern "C" fn(*mut ffi::sqlite3_file, c_int, c_int, c_int) -> c_int;
        let (file_control, shm_lock): (FileControlFn, ShmLockFn) = match (kind, heap) {
            (Kind::Main, true) => (x_file_control_main::<true>, x_shm_lock::<true>),
            (Kind::Main, false) => (x_file_control_main::<false>, x_shm_lock::<false>),
            (_, true) => (x_file_control, x_shm_lock::<true>),
            (_, false) => (x_file_control, x_shm_lock::<false>),
        };
        ffi::sqlite3_io_methods {
            iVersion: version,
            // Always the guard's: the table is freed there.
            xClose: Some(x_close),
            xRead: slot!(false, x_read, xRead),
            // A guarded file's writes take the gate: always for a main file, while its write
            // gate is closed for a WAL (it starts closed; see `open`).
            xWrite: if guarded {
                Some(write_gated)
            } else {
                slot!(false, x_write, xWrite)
            },
            xTruncate: slot!(guarded, x_truncate, xTruncate),
            xSync: slot!(main, x_sync, xSync),
            xFileSize: slot!(false, x_file_size, xFileSize),
            xLock: slot!(main, x_lock, xLock),
            xUnlock: slot!(main, x_unlock, xUnlock),
            xCheckReservedLock: slot!(false, x_check_reserved_lock, xCheckReservedLock),
            // Always the guard's: VFSNAME answers `hermes-guard/...` for every file.
            xFileControl: Some(file_control),
            xSectorSize: slot!(false, x_sector_size, xSectorSize),
            xDeviceCharacteristics: slot!(false, x_device_characteristics, xDeviceCharacteristics),
            xShmMap: slot_v!(2, main, x_shm_map, xShmMap),
            xShmLock: slot_v!(2, main, shm_lock, xShmLock),
            xShmBarrier: slot_v!(2, false, x_shm_barrier, xShmBarrier),
            xShmUnmap: slot_v!(2, main, x_shm_unmap, xShmUnmap),
            xFetch: slot_v!(3, false, x_fetch, xFetch),
            xUnfetch: slot_v!(3, false, x_unfetch, xUnfetch),
        }
    }

    /// The `xWrite` of a WAL whose write gate is open: the wrapped file's own (or, on the heap,
    /// the pass-through to it).
    fn open_write(&self) -> WriteFn {
        if self.heap.is_null() {
            self.sub.xWrite
        } else {
            x_write
        }
    }

    /// The wrapped file object of the guarded file `f`.
    #[inline(always)]
    fn sub_ptr(&self, f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        if self.heap.is_null() {
            f
        } else {
            self.heap
        }
    }
}

type WriteFn =
    unsafe extern "C" fn(*mut ffi::sqlite3_file, *const c_void, c_int, ffi::sqlite3_int64) -> c_int;

/// A WAL file object's write gate: its table's `xWrite` slot, which SQLite reads at every call.
struct WalGateSlot {
    table: *const FileTable,
    open: WriteFn,
}

// SAFETY: the slot is written under the state's mutex from inside the connection's calls, which
// SQLite serialises with its reads of it (see `WalGate`); the table outlives the handle (the
// WAL's `x_close` detaches it before freeing the table).
unsafe impl Send for WalGateSlot {}

impl WalGate for WalGateSlot {
    fn set_open(&self, open: bool) {
        let slot: WriteFn = if open { self.open } else { write_gated };
        // SAFETY: the table is alive (see Send above) and the slot is only ever written here,
        // one writer at a time, never while SQLite reads it.
        unsafe { (*(*self.table).methods.get()).xWrite = Some(slot) };
    }
}

/// The wrapped file object of `f` in a wrapper compiled for one layout (`HEAP`): no test.
#[inline(always)]
fn sub_of<const HEAP: bool>(t: &FileTable, f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    if HEAP {
        t.heap
    } else {
        f
    }
}

/// A wrapped file object on the heap, ours to close and free: a wrapped VFS outside the unix
/// family, or a retired main file held past SQLite's close.
struct HeapFile {
    ptr: *mut ffi::sqlite3_file,
    layout: Layout,
    /// A held file's filename, which its `zPath` points at once SQLite's is gone.
    path: Option<CString>,
    /// A held file of a VFS the guard cannot see into: its filename pointer is SQLite's, freed
    /// with the connection, so its `xClose` (which may read it) is never called; the object and
    /// its descriptor are left open instead.
    leak_at_close: bool,
}

// SAFETY: the wrapped file object is used by one thread at a time (SQLite's connection mutex, or
// the pending-capture list's mutex once SQLite has let go of it).
unsafe impl Send for HeapFile {}

impl HeapFile {
    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.max(size_of::<ffi::sqlite3_file>()), 8).ok()
    }

    /// Zeroed memory for a wrapped file object (`layout`, from [`HeapFile::layout`]).
    fn alloc(layout: Layout) -> Option<HeapFile> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) } as *mut ffi::sqlite3_file;
        (!ptr.is_null()).then_some(HeapFile {
            ptr,
            layout,
            path: None,
            leak_at_close: false,
        })
    }

    /// Moves the open unix file object in SQLite's buffer `f` (`size` bytes) to the heap, with
    /// `table` (its own method table) back in its `pMethod`, so that it can be read and closed
    /// after SQLite frees `f`. No field of a `unixFile` points into it and nothing points at it
    /// (its inode, shared-memory and unused-descriptor records are reached from it, never the
    /// other way), so a byte copy is the same open file; its filename, SQLite's memory, is the
    /// caller's to repoint ([`FileTable::hold`]).
    ///
    /// # Safety
    /// `f` is an open unix file object of `size` bytes that nothing uses after this call;
    /// `layout` is [`HeapFile::layout`] of `size`.
    unsafe fn relocate(
        f: *mut ffi::sqlite3_file,
        layout: Layout,
        size: usize,
        table: *const ffi::sqlite3_io_methods,
    ) -> Option<HeapFile> {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) } as *mut ffi::sqlite3_file;
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `f` is `size` readable bytes, `ptr` at least as many writable ones, and they
        // are distinct allocations.
        unsafe {
            ptr::copy_nonoverlapping(f as *const u8, ptr as *mut u8, size);
            (*ptr).pMethods = table;
        }
        Some(HeapFile {
            ptr,
            layout,
            path: None,
            leak_at_close: false,
        })
    }

    /// Closes the wrapped file through its own table (if it was opened) and frees the memory.
    fn close(self) -> c_int {
        if self.leak_at_close {
            log::warn!(
                "hermes-guard: a held main file of a VFS other than unix is left open after its \
                 capture: its close could read the filename SQLite freed (one descriptor)"
            );
            return ffi::SQLITE_OK;
        }
        // SAFETY: `ptr` is our allocation: a file object its VFS opened (pMethods set), or
        // zeroed memory it never opened or already closed (pMethods NULL).
        let rc = unsafe {
            match (*self.ptr).pMethods.as_ref().and_then(|m| m.xClose) {
                Some(x) => x(self.ptr),
                None => ffi::SQLITE_OK,
            }
        };
        // SAFETY: allocated with this layout; closed above.
        unsafe { alloc::dealloc(self.ptr as *mut u8, self.layout) };
        rc
    }
}

/// Reads the main image through the wrapped file object, never through a descriptor of our own.
struct MainImage(*mut ffi::sqlite3_file);

// SAFETY: see HeapFile; the image is read under the state's mutex only.
unsafe impl Send for MainImage {}

impl ImageSource for MainImage {
    fn size(&self) -> io::Result<u64> {
        let mut size: ffi::sqlite3_int64 = 0;
        // SAFETY: the pointer is the open wrapped main file (the state drops this image before
        // the file is closed).
        let rc = unsafe {
            match (*(*self.0).pMethods).xFileSize {
                Some(x) => x(self.0, &mut size),
                None => ffi::SQLITE_IOERR_FSTAT,
            }
        };
        if rc != ffi::SQLITE_OK {
            return Err(io::Error::other(format!("xFileSize returned {rc}")));
        }
        Ok(size as u64)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        // SAFETY: as in `size`; `buf` is valid for `buf.len()` bytes.
        let rc = unsafe {
            match (*(*self.0).pMethods).xRead {
                Some(x) => x(
                    self.0,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len() as c_int,
                    offset as ffi::sqlite3_int64,
                ),
                None => ffi::SQLITE_IOERR_READ,
            }
        };
        if rc != ffi::SQLITE_OK {
            return Err(io::Error::other(format!(
                "xRead of {} bytes at {offset} returned {rc}",
                buf.len()
            )));
        }
        Ok(())
    }
}

/// Region 0 of a connection's shared-memory mapping: the wal-index header (two copies of 48
/// bytes, `mxFrame` at offset 16 of the first) and the checkpoint info after them (`nBackfill` at
/// 96, `nBackfillAttempted` at 128), native-endian `u32`s that other processes update in place.
struct WalIndexView(*const u8);

// SAFETY: the address is only read, through atomics, while the mapping is alive: the state drops
// the view (under its mutex) before the connection unmaps.
unsafe impl Send for WalIndexView {}

impl WalIndexView {
    fn u32_at(&self, offset: usize) -> u32 {
        // SAFETY: region 0 is at least 32 KiB, mapped and 4-byte aligned at a page boundary, so
        // `offset` (< 136, a multiple of 4) is inside it and aligned; other processes write it
        // concurrently, hence the atomic load.
        unsafe { (*(self.0.add(offset) as *const AtomicU32)).load(Ordering::Acquire) }
    }
}

impl WalIndex for WalIndexView {
    fn backfill(&self) -> Option<Backfill> {
        const IS_INIT: usize = 12;
        // SAFETY: as in `u32_at`; one byte inside the mapped header.
        let initialised =
            unsafe { (*(self.0.add(IS_INIT) as *const AtomicU8)).load(Ordering::Acquire) } != 0;
        initialised.then(|| Backfill {
            frames: self.u32_at(16),
            backfilled: self.u32_at(96),
            attempted: self.u32_at(128),
        })
    }
}

/// The leading fields of the unix VFS's `unixFile` (sqlite3.c, `struct unixFile`), as far as the
/// lock shield reads them: `h`, the descriptor, and `pShm`. The fields before them are checked
/// against what is known independently (`pMethod`, `pVfs`, `zPath`) before `h` is trusted, and `h`
/// is `fstat`ed against the pinned main file: an extension loaded into a host SQLite whose layout
/// differs turns the shield off instead of locking a wrong descriptor.
#[repr(C)]
struct UnixFilePrefix {
    p_method: *const ffi::sqlite3_io_methods,
    p_vfs: *mut ffi::sqlite3_vfs,
    p_inode: *mut c_void,
    h: c_int,
    e_file_lock: u8,
    ctrl_flags: u16,
    last_errno: c_int,
    locking_context: *mut c_void,
    p_preallocated_unused: *mut c_void,
    z_path: *const c_char,
    p_shm: *const UnixShmPrefix,
}

/// `struct unixShm`: a connection's handle on the process's shared-memory node.
#[repr(C)]
struct UnixShmPrefix {
    p_shm_node: *const UnixShmNodePrefix,
}

/// The leading fields of `struct unixShmNode`: `pInode` (checked against the file's) and
/// `hShm`, the node's descriptor of the `-shm`, open until the node is purged.
#[repr(C)]
struct UnixShmNodePrefix {
    p_inode: *mut c_void,
    p_shm_mutex: *mut c_void,
    z_filename: *mut c_char,
    h_shm: c_int,
}

/// The wrapped file object `sub` as a `unixFile`'s leading fields, if it has them: the wrapped
/// VFS's objects are at least that large and the fields that can be checked hold what is known
/// independently (`pMethod` = the table its xOpen installed, `pVfs` = the VFS, `zPath` = the
/// filename SQLite passed).
///
/// # Safety
/// `sub` is a file object just opened by `sub_vfs` from `z_name`, still with the table
/// `sub_table` its xOpen installed.
unsafe fn unix_prefix<'a>(
    sub_vfs: *mut ffi::sqlite3_vfs,
    sub: *mut ffi::sqlite3_file,
    sub_table: *const ffi::sqlite3_io_methods,
    z_name: ffi::sqlite3_filename,
) -> Option<&'a UnixFilePrefix> {
    // SAFETY: the wrapped VFS is registered for the life of the process.
    let size = unsafe { (*sub_vfs).szOsFile };
    if size < 0 || (size as usize) < size_of::<UnixFilePrefix>() {
        return None;
    }
    // SAFETY: the object is `szOsFile` bytes (checked above to cover the prefix), 8-aligned,
    // initialised by its xOpen.
    let p = unsafe { &*(sub as *const UnixFilePrefix) };
    (ptr::eq(p.p_method, sub_table) && ptr::eq(p.p_vfs, sub_vfs) && ptr::eq(p.z_path, z_name))
        .then_some(p)
}

/// The unix VFS's descriptor of a freshly opened main file, verified, for the lock shield; the
/// reason the shield cannot be used otherwise.
///
/// # Safety
/// `sub_vfs` is the wrapped VFS; `prefix` is [`unix_prefix`] of the file object it just opened,
/// whose descriptor is still open.
unsafe fn main_descriptor(
    sub_vfs: *mut ffi::sqlite3_vfs,
    prefix: Option<&UnixFilePrefix>,
    state: &DbState,
) -> Result<c_int, String> {
    if let Some(reason) = shield::platform_off_reason() {
        return Err(reason.into());
    }
    // SAFETY: the wrapped VFS is registered for the life of the process; its name is a C string.
    let name = unsafe { cstr_text((*sub_vfs).zName) };
    if name.as_deref() != Some("unix") {
        return Err(format!(
            "the VFS below the guard is {}, not the unix VFS",
            name.as_deref().unwrap_or("unnamed")
        ));
    }
    let Some(p) = prefix else {
        return Err(format!(
            "the unix VFS's file object does not have the layout of SQLite {} (its size, \
             pMethod, pVfs or zPath differ)",
            super::running_sqlite_version()
        ));
    };
    let Some(pinned) = state.main_id() else {
        return Err("the main file is not pinned".into());
    };
    // SAFETY: `h` is the descriptor the unix VFS just opened; it stays open while this call runs.
    let now = identity_of_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(p.h) })
        .map_err(|e| format!("fstat of SQLite's descriptor {} failed: {e}", p.h))?;
    if now != pinned {
        return Err(format!(
            "SQLite's descriptor {} is {now}, not the pinned main file {pinned}",
            p.h
        ));
    }
    if !super::watch::local_filesystem(state.db_path()) {
        return Err("the database is not on a local filesystem".into());
    }
    Ok(p.h)
}

/// The descriptor of the shared-memory node the connection just mapped (SQLite's `hShm`),
/// verified against the pinned `-shm`.
///
/// # Safety
/// `sub` is the wrapped file object of a live main file whose shield is armed (so it has the
/// verified unix layout) and whose `xShmMap` just succeeded.
unsafe fn shm_descriptor(
    sub: *mut ffi::sqlite3_file,
    state: &DbState,
) -> Result<(c_int, FileId), String> {
    // SAFETY: as the caller promises: the layout was verified at the open, and `pShm`, its
    // node and the node's `pInode` and `hShm` are set by xShmMap and stay until xShmUnmap.
    let (node_inode, fd, file_inode) = unsafe {
        let p = &*(sub as *const UnixFilePrefix);
        if p.p_shm.is_null() || (*p.p_shm).p_shm_node.is_null() {
            return Err("the unix VFS's file has no shared-memory node after xShmMap".into());
        }
        let node = &*(*p.p_shm).p_shm_node;
        (node.p_inode, node.h_shm, p.p_inode)
    };
    if node_inode != file_inode {
        return Err("the unix VFS's shared-memory node does not have the expected layout".into());
    }
    if fd < 0 {
        return Err("the shared memory has no -shm file (heap memory)".into());
    }
    let Some(pinned) = state.shm_id() else {
        return Err("the -shm is not pinned".into());
    };
    // SAFETY: `hShm` is open while the node lives, which it does while this connection maps it.
    let now = identity_of_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|e| format!("fstat of SQLite's -shm descriptor {fd} failed: {e}"))?;
    if now != pinned {
        return Err(format!(
            "SQLite's -shm descriptor {fd} is {now}, not the pinned -shm {pinned}"
        ));
    }
    Ok((fd, now))
}

/// Runs a shield transition (mutexes, logging) inside `ffi_guard`; a panic there costs the
/// shield, never the call.
#[cold]
#[inline(never)]
fn shield_slow(f: impl FnOnce()) {
    ffi_guard((), f)
}

/// Retired main files SQLite has closed but whose generation is not captured yet.
static PENDING: Mutex<Vec<(Arc<DbState>, HeapFile)>> = Mutex::new(Vec::new());
static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Held main files whose generation is captured but whose close waits for the next call from
/// inside SQLite: in an `SQLITE_THREADSAFE=0` build the unix VFS's close edits its inode list with
/// no mutex, so it may only run on a thread SQLite is running on (see [`retry_pending_captures`]).
static CLOSE_LATER: Mutex<Vec<HeapFile>> = Mutex::new(Vec::new());
static CLOSE_LATER_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Where a retry of the pending captures is made from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// Inside one of SQLite's calls into the VFS (an open or a close): SQLite's own thread.
    Sqlite,
    /// The application (`hermes_guard::retry_pending_captures`), on any thread.
    Application,
}

/// Whether the SQLite the guard runs in has no mutexes at all (`SQLITE_THREADSAFE=0`).
fn single_threaded_sqlite() -> bool {
    // SAFETY: sqlite3_threadsafe only returns a compile-time constant.
    unsafe { ffi::sqlite3_threadsafe() == 0 }
}

/// Retries the capture of every held retired generation; returns how many are still uncaptured.
/// A held file whose capture is written is closed at once, except from the application's thread
/// in an `SQLITE_THREADSAFE=0` build, where its close waits for SQLite's next open or close (the
/// capture itself only reads through the held file object, which SQLite no longer uses).
pub(crate) fn retry_pending_captures(caller: Caller) -> usize {
    let close_now = caller == Caller::Sqlite || !single_threaded_sqlite();
    if close_now && CLOSE_LATER_COUNT.load(Ordering::Acquire) > 0 {
        let parked = std::mem::take(&mut *CLOSE_LATER.lock());
        CLOSE_LATER_COUNT.store(0, Ordering::Release);
        for held in parked {
            held.close();
        }
    }
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let mut pending = PENDING.lock();
    let mut kept = Vec::new();
    for (state, held) in pending.drain(..) {
        // The application asked: at once. Inside SQLite's calls (every open and close of any
        // database): only the generations whose back-off has passed (`retry.rs`).
        let attempt = match caller {
            Caller::Application => state.ensure_captured(Trigger::Close),
            Caller::Sqlite => state.retry_capture(),
        };
        // Captured, or let go (its directory deleted): the held file goes either way.
        match attempt {
            Ok(_) => {
                state.main_closed();
                if close_now {
                    held.close();
                } else {
                    let mut later = CLOSE_LATER.lock();
                    later.push(held);
                    CLOSE_LATER_COUNT.store(later.len(), Ordering::Release);
                }
            }
            Err(_) => kept.push((state, held)),
        }
    }
    *pending = kept;
    PENDING_COUNT.store(pending.len(), Ordering::Release);
    pending.len()
}

/// The retired generations this process holds uncaptured, and the descriptors held for them
/// (each held main file, and its pinned WAL while the state keeps it): for the status.
pub(crate) fn held() -> (usize, usize) {
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return (0, 0);
    }
    let pending = PENDING.lock();
    let descriptors = pending
        .iter()
        .map(|(state, _)| 1 + usize::from(state.holds_wal()))
        .sum();
    (pending.len(), descriptors)
}

/// Opens `z_name` through the wrapped VFS and wraps it.
///
/// # Safety
/// Arguments as SQLite passes them to `xOpen`: `f` points at `szOsFile` writable bytes (the size
/// [`os_file_size`] gave for `sub_vfs`).
pub(super) unsafe fn open(
    sub_vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `f` is writable; a NULL pMethods tells SQLite not to call xClose on failure.
    unsafe { (*f).pMethods = ptr::null() };
    retry_pending_captures(Caller::Sqlite);
    // SAFETY: the wrapped VFS is registered for the life of the process.
    let svfs = unsafe { &*sub_vfs };
    let Some(x_open) = svfs.xOpen else {
        return ffi::SQLITE_CANTOPEN;
    };
    let sub_size = (svfs.szOsFile.max(0) as usize).max(size_of::<ffi::sqlite3_file>());
    let Some(sub_layout) = HeapFile::layout(sub_size) else {
        return ffi::SQLITE_CANTOPEN;
    };
    let heap = if inline_layout() {
        // SAFETY: `f` is szOsFile writable bytes, at least `sub_size` in this layout (see
        // `os_file_size`); zeroed as the heap layout's memory is.
        unsafe { ptr::write_bytes(f as *mut u8, 0, sub_size) };
        None
    } else {
        match HeapFile::alloc(sub_layout) {
            Some(h) => Some(h),
            None => return ffi::SQLITE_NOMEM,
        }
    };
    let sub = heap.as_ref().map_or(f, |h| h.ptr);
    if flags & ffi::SQLITE_OPEN_WAL != 0 {
        // Issue 19: an existing WAL is judged before SQLite opens (and replays) it.
        // SAFETY: `z_name` is the WAL name SQLite passes to xOpen.
        let rc = unsafe { stale_wal_gate(z_name) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    // SAFETY: SQLite's own arguments, with a zeroed file object of the wrapped VFS's size.
    let rc = unsafe { x_open(sub_vfs, z_name, sub, flags, out_flags) };
    // SAFETY: `sub` is the zeroed object; xOpen set pMethods or left it NULL.
    let sub_table = unsafe { (*sub).pMethods };
    // Until the guard's table is installed, any way out (a failure below, or a panic that
    // `ffi_guard` catches) closes what the wrapped xOpen opened and leaves `f` as SQLite expects
    // of a failed open.
    let mut unfinished = UnfinishedOpen { f, sub_table, heap };
    if rc != ffi::SQLITE_OK || sub_table.is_null() {
        return if rc == ffi::SQLITE_OK {
            ffi::SQLITE_CANTOPEN
        } else {
            rc
        };
    }
    // SAFETY: a non-NULL table installed by the wrapped VFS outlives the file.
    let sub_methods = unsafe { &*sub_table };
    // SAFETY: `sub` was just opened by the wrapped VFS from `z_name`, with this table.
    let prefix = unsafe { unix_prefix(sub_vfs, sub, sub_table, z_name) };
    let is_unix = prefix.is_some();

    // SAFETY: a non-NULL filename from SQLite is NUL-terminated and outlives the file.
    let path = unsafe { cstr_path(z_name) };
    let (kind, state) = match path {
        Some(path) if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 => {
            let state = DbState::new(path);
            state.set_main_image(Some(Box::new(MainImage(sub))));
            // SAFETY: `prefix` is that of `sub`, just opened by the wrapped VFS.
            let main_fd = unsafe { main_descriptor(sub_vfs, prefix, &state) };
            state.shield().arm(main_fd, state.db_path());
            (Kind::Main, Some(state))
        }
        Some(path) if flags & ffi::SQLITE_OPEN_WAL != 0 => {
            // SAFETY: for a WAL, SQLite passes the name it derived from the main file's, which
            // is what sqlite3_database_file_object expects.
            let main = unsafe { ffi::sqlite3_database_file_object(z_name) };
            // SAFETY: `main` is NULL or the main database's file object, open while its WAL is.
            match unsafe { guard_state(main) } {
                Some(state) => {
                    if state.pin_wal(&path).is_err() {
                        return ffi::SQLITE_CANTOPEN;
                    }
                    (Kind::Wal, Some(state))
                }
                None => (Kind::Other, None),
            }
        }
        _ => (Kind::Other, None),
    };
    let main_state = match (kind, &state) {
        (Kind::Main, Some(state)) => Arc::as_ptr(state),
        _ => ptr::null(),
    };
    let heap = unfinished.finish();
    let table = Box::new(FileTable {
        methods: UnsafeCell::new(FileTable::methods_for(kind, heap.is_some(), sub_methods)),
        sub: SubMethods::of(sub_methods),
        // Owned by the table from here on: closed and freed in `x_close`.
        heap: heap.map_or(ptr::null_mut(), |h| h.ptr),
        sub_table,
        sub_size,
        sub_layout,
        z_name,
        unix_prefix: is_unix,
        kind,
        main_state,
        state,
    });
    let open_write = table.open_write();
    let table = Box::into_raw(table);
    // SAFETY: `f` is writable; from here on SQLite calls the guard's table (freed in x_close).
    unsafe { (*f).pMethods = table as *const ffi::sqlite3_io_methods };
    if kind == Kind::Wal {
        // SAFETY: just made; alive until x_close, which detaches the gate first.
        if let Some(state) = unsafe { &(*table).state } {
            state.attach_wal_gate(Box::new(WalGateSlot {
                table,
                open: open_write,
            }));
        }
    }
    ffi::SQLITE_OK
}

/// A wrapped open the guard has not finished: dropped before [`UnfinishedOpen::finish`], it closes
/// the wrapped file (if its xOpen opened it), frees a heap object and leaves a NULL `pMethods`
/// in SQLite's file, so that SQLite calls nothing on it.
struct UnfinishedOpen {
    f: *mut ffi::sqlite3_file,
    sub_table: *const ffi::sqlite3_io_methods,
    heap: Option<HeapFile>,
}

impl UnfinishedOpen {
    /// The open is complete: the heap object (if any) goes to the guard's table.
    fn finish(&mut self) -> Option<HeapFile> {
        self.sub_table = ptr::null();
        self.f = ptr::null_mut();
        self.heap.take()
    }
}

impl Drop for UnfinishedOpen {
    fn drop(&mut self) {
        if self.f.is_null() {
            return;
        }
        match self.heap.take() {
            Some(h) => {
                h.close();
            }
            // SAFETY: `f` is the wrapped VFS's object in SQLite's buffer, opened with this
            // table, or left by a failed xOpen with a NULL one.
            None => unsafe {
                if let Some(x) = self.sub_table.as_ref().and_then(|m| m.xClose) {
                    x(self.f);
                }
            },
        }
        // SAFETY: `f` is SQLite's writable file object.
        unsafe { (*self.f).pMethods = ptr::null() };
    }
}

/// The state of a main file object if it is one of ours.
///
/// # Safety
/// `f` is NULL or a live `sqlite3_file`.
unsafe fn guard_state(f: *mut ffi::sqlite3_file) -> Option<Arc<DbState>> {
    if f.is_null() {
        return None;
    }
    // SAFETY: `f` is live; its pMethods identifies its type.
    let methods = unsafe { (*f).pMethods.as_ref() }?;
    // Every table of the guard's, and only those, closes through `x_close` (one function, not
    // generic: one address in the program).
    let close = methods.xClose? as *const () as usize;
    if close != x_close as *const () as usize {
        return None;
    }
    // SAFETY: `x_close` is only ever installed in FileTables, which start with the methods.
    unsafe { (*(methods as *const _ as *const FileTable)).state.clone() }
}

/// # Safety
/// `f` is one of our live files (SQLite only calls our methods on files we opened): its
/// pMethods is its FileTable, alive until `x_close`.
#[inline(always)]
unsafe fn table<'a>(f: *mut ffi::sqlite3_file) -> &'a FileTable {
    // SAFETY: as the caller promises.
    unsafe { &*((*f).pMethods as *const FileTable) }
}

/// Calls the wrapped file's method `slot` with SQLite's arguments on the wrapped file object
/// (`$sub`); a slot the wrapped table lacks is a stub returning what a missing method means
/// (see [`SubMethods`]). Panic-free: a field read and a call into C (which cannot unwind into
/// Rust) or into a stub that returns a constant. The pass-through methods below are nothing
/// else but this, so they run without `catch_unwind`.
macro_rules! sub_call {
    ($t:expr, $sub:expr, $slot:ident $(, $arg:expr)*) => {{
        let t: &FileTable = $t;
        // SAFETY: the wrapped file is open and the slot is its own table's method (or a stub).
        unsafe { (t.sub.$slot)($sub $(, $arg)*) }
    }};
}

/// Carries out a write gate: `SQLITE_OK` to go ahead, else the code to return. The common
/// verdicts — already checked in this transaction, or the directory watch vouches — are decided
/// by panic-free code (the gates are atomics; `check_fast` is atomics and one `epoll_wait`), so
/// they need no `catch_unwind`; only a full check or a refusal (`stat`, logging, allocation, a
/// capture) runs inside `ffi_guard`.
#[inline(always)]
fn gate_rc(state: &DbState, gate: Gate, on_panic: c_int) -> c_int {
    if gate == Gate::Go {
        ffi::SQLITE_OK
    } else {
        gate_check(state, gate, on_panic)
    }
}

/// `gate_rc` past `Go`: out of line, so the pass-through path of the callers stays short.
#[inline(never)]
fn gate_check(state: &DbState, gate: Gate, on_panic: c_int) -> c_int {
    match gate {
        Gate::Check(site) if state.check_fast(site) => ffi::SQLITE_OK,
        _ => slow_gate(state, gate, on_panic),
    }
}

#[cold]
#[inline(never)]
fn slow_gate(state: &DbState, gate: Gate, on_panic: c_int) -> c_int {
    ffi_guard(on_panic, || {
        let verdict = match gate {
            Gate::Go => Ok(()),
            Gate::Check(site) => state.check(site),
            Gate::Refuse => Err(state.refuse()),
        };
        verdict.err().unwrap_or(ffi::SQLITE_OK)
    })
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_CLOSE, || {
        // SAFETY: SQLite closes each file it opened exactly once: the table is ours again (it
        // clears pMethods after this call and never reads the table afterwards).
        let t = unsafe { Box::from_raw((*f).pMethods as *mut FileTable) };
        let sub = t.sub_ptr(f);
        let heap = (!t.heap.is_null()).then_some(HeapFile {
            ptr: t.heap,
            layout: t.sub_layout,
            path: None,
            leak_at_close: false,
        });
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            // Before SQLite's descriptor is closed or parked for reuse.
            state.shield().close();
        }
        let rc = match (t.kind, &t.state) {
            (Kind::Main, Some(state)) if state.must_hold_main() => {
                // Locks go (nobody may wait on a retired handle) but the descriptor stays.
                sub_call!(&t, sub, xUnlock, ffi::SQLITE_LOCK_NONE);
                // SAFETY: `f` is the open file SQLite is closing, this table's.
                match unsafe { t.hold(f, heap) } {
                    Ok(held) => {
                        state.set_main_image(Some(Box::new(MainImage(held.ptr))));
                        log::error!(
                            "hermes-guard: {} closed with its retired generation uncaptured; its \
                             descriptor is held and the capture is retried at the next open or \
                             close (or hermes_guard::retry_pending_captures)",
                            state.db_path().display()
                        );
                        let mut pending = PENDING.lock();
                        pending.push((state.clone(), held));
                        PENDING_COUNT.store(pending.len(), Ordering::Release);
                        ffi::SQLITE_OK
                    }
                    Err(why) => {
                        log::error!(
                            "hermes-guard: {} closed with its retired generation uncaptured, and \
                             its main file cannot be held past the close ({why}): the retired \
                             generation can no longer be captured",
                            state.db_path().display()
                        );
                        state.main_closed();
                        sub_call!(&t, sub, xClose)
                    }
                }
            }
            (Kind::Main, Some(state)) => {
                // Its capture is written (or nothing was at stake): when nothing newer exists,
                // the retired generation goes back into the main file (`state/healing.rs`).
                state.heal_at_close(&Unlocked { t: &t, sub });
                state.main_closed();
                close_sub(&t, sub, heap)
            }
            (Kind::Wal, Some(state)) => {
                // SQLite lets go of the WAL here whatever it asked before: with
                // `SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE` it never sent `SQLITE_FCNTL_HAS_MOVED`. A WAL
                // retired since the last check is found now, while its descriptor and the main
                // file are still open, and captured (or held, see `wal_closed`).
                state.check_at_close();
                // Before the table goes (at the end of this call).
                state.detach_wal_gate();
                let rc = close_sub(&t, sub, heap);
                state.wal_closed();
                rc
            }
            _ => close_sub(&t, sub, heap),
        };
        if t.kind == Kind::Main {
            retry_pending_captures(Caller::Sqlite);
        }
        rc
    })
}

/// The wrapped main file at its close, for a heal: its own methods, through the guard's table
/// (the calls SQLite would make for a checkpoint).
struct Unlocked<'a> {
    t: &'a FileTable,
    sub: *mut ffi::sqlite3_file,
}

impl MainFile for Unlocked<'_> {
    fn lock(&self, level: c_int) -> c_int {
        sub_call!(self.t, self.sub, xLock, level)
    }

    fn unlock(&self, level: c_int) -> c_int {
        sub_call!(self.t, self.sub, xUnlock, level)
    }

    fn write_at(&self, bytes: &[u8], offset: i64) -> c_int {
        let Ok(len) = c_int::try_from(bytes.len()) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        sub_call!(
            self.t,
            self.sub,
            xWrite,
            bytes.as_ptr() as *const c_void,
            len,
            offset
        )
    }

    fn truncate(&self, size: i64) -> c_int {
        sub_call!(self.t, self.sub, xTruncate, size)
    }

    fn sync(&self) -> c_int {
        sub_call!(self.t, self.sub, xSync, ffi::SQLITE_SYNC_NORMAL)
    }
}

impl FileTable {
    /// The wrapped main file, moved out of SQLite's reach for the pending capture: relocated to
    /// the heap if it is in SQLite's buffer, and its filename pointer, SQLite's memory that the
    /// close frees, repointed at a copy when it is a `unixFile`; a foreign VFS's object keeps
    /// SQLite's pointer and is never closed (`leak_at_close`). Why not, when it cannot be held:
    /// an object in SQLite's buffer whose `unixFile` layout did not check out at the open is not
    /// moved (it may point into itself), nor one without memory for the move.
    ///
    /// # Safety
    /// `f` is the open file SQLite is closing, whose table this is; `heap` its heap object.
    unsafe fn hold(
        &self,
        f: *mut ffi::sqlite3_file,
        heap: Option<HeapFile>,
    ) -> Result<HeapFile, &'static str> {
        let mut held = match heap {
            Some(h) => h,
            None if !self.unix_prefix => {
                return Err(
                    "its file object does not have the layout of SQLite's unix VFS, so it \
                            cannot be moved out of SQLite's memory",
                )
            }
            None => {
                // SAFETY: `f` is the open unix file object (inline layout: the unix family,
                // its layout checked at the open) of `sub_size` bytes; SQLite frees it after
                // this call.
                unsafe { HeapFile::relocate(f, self.sub_layout, self.sub_size, self.sub_table) }
                    .ok_or("no memory to move it")?
            }
        };
        if self.unix_prefix {
            // SAFETY: `z_name` is SQLite's filename, still valid inside its close.
            let path = CString::from(unsafe { CStr::from_ptr(self.z_name) });
            // SAFETY: checked at the open to have the `unixFile` layout (`unix_prefix`); the
            // held object is ours alone now.
            unsafe { (*(held.ptr as *mut UnixFilePrefix)).z_path = path.as_ptr() };
            held.path = Some(path);
        } else {
            held.leak_at_close = true;
        }
        Ok(held)
    }
}

/// Closes the wrapped file object `sub` (on the heap when `heap` is given: freed too).
fn close_sub(t: &FileTable, sub: *mut ffi::sqlite3_file, heap: Option<HeapFile>) -> c_int {
    match heap {
        Some(h) => h.close(),
        None => sub_call!(t, sub, xClose),
    }
}

/// Declares the pass-through methods: the wrapped file's method called with SQLite's arguments
/// on the wrapped object, nothing else (so no `catch_unwind`: see `sub_call!`). Installed where
/// SQLite's pointer is not the wrapped object (the heap layout); in SQLite's buffer these slots
/// are the wrapped VFS's own functions. `x_write` is also a WAL's open gate on the heap.
macro_rules! pass_through {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
                // SAFETY: SQLite calls our methods only on our live files.
                let t = unsafe { table(f) };
                sub_call!(t, t.sub_ptr(f), $slot $(, $arg)*)
            }
        )*
    };
}

pass_through! {
    x_read => xRead(buf: *mut c_void, amt: c_int, ofst: ffi::sqlite3_int64) -> c_int;
    x_write => xWrite(buf: *const c_void, amt: c_int, ofst: ffi::sqlite3_int64) -> c_int;
    x_file_size => xFileSize(size: *mut ffi::sqlite3_int64) -> c_int;
    x_check_reserved_lock => xCheckReservedLock(out: *mut c_int) -> c_int;
    x_sector_size => xSectorSize() -> c_int;
    x_device_characteristics => xDeviceCharacteristics() -> c_int;
    x_shm_barrier => xShmBarrier() -> ();
    x_fetch => xFetch(ofst: ffi::sqlite3_int64, amt: c_int, pp: *mut *mut c_void) -> c_int;
    x_unfetch => xUnfetch(ofst: ffi::sqlite3_int64, p: *mut c_void) -> c_int;
}

/// The `xWrite` of a guarded main file, and of a WAL while its write gate is closed: the gate
/// (no `catch_unwind`: it is decided by panic-free code and only its slow verdicts enter
/// `ffi_guard`, see `gate_rc`), then the write.
unsafe extern "C" fn write_gated(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    let sub = t.sub_ptr(f);
    let Some(state) = &t.state else {
        return sub_call!(t, sub, xWrite, buf, amt, ofst);
    };
    let gate = match t.kind {
        Kind::Wal => state.wal_write_gate(ofst),
        // In WAL mode the main file is written only by checkpoints; in rollback mode the
        // RESERVED lock before any write was checked.
        _ if state.wal_pinned() || state.is_retired() => state.main_write_gate(),
        _ => Gate::Go,
    };
    let rc = gate_rc(state, gate, ffi::SQLITE_IOERR_WRITE);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    sub_call!(t, sub, xWrite, buf, amt, ofst)
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_TRUNCATE, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let t = unsafe { table(f) };
        let sub = t.sub_ptr(f);
        if let Some(state) = &t.state {
            let allowed = if t.kind == Kind::Wal {
                // Below any write: a truncate outside a checked transaction always checks.
                state.before_wal_write(i64::MIN)
            } else {
                state.before_main_write()
            };
            if let Err(code) = allowed {
                return code;
            }
        }
        sub_call!(t, sub, xTruncate, size)
    })
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    let sub = t.sub_ptr(f);
    let rc = sub_call!(t, sub, xSync, flags);
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        // A checkpoint ends with a sync of the main file: the next one checks afresh.
        state.end_of_main_write();
        if rc == ffi::SQLITE_OK && state.stamp_due() {
            // The main file as this connection's checkpoint left it (one `stat` per
            // checkpoint): what a heal at close compares with (`state/healing.rs`).
            shield_slow(|| state.stamp_main());
        }
        // Issue 19: a restart may follow (or just happened): a WAL-base record is due.
        state.stale_wal().checkpoint_synced();
    }
    rc
}

/// No `catch_unwind` on the way through (see `x_write`).
unsafe extern "C" fn x_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    let sub = t.sub_ptr(f);
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        // WAL mode takes EXCLUSIVE on the main file only to close, switch journal mode or
        // enter locking_mode=EXCLUSIVE. Rollback mode takes RESERVED for every write, and
        // EXCLUSIVE straight from SHARED to roll back a hot journal (which writes the main
        // file and deletes the journal by pathname): both are checked, once per lock.
        let gate = if state.wal_pinned() {
            if level == ffi::SQLITE_LOCK_EXCLUSIVE {
                Gate::Check(Site::MainWrite)
            } else {
                Gate::Go
            }
        } else if level >= ffi::SQLITE_LOCK_RESERVED {
            state.main_write_gate()
        } else {
            Gate::Go
        };
        let rc = gate_rc(state, gate, ffi::SQLITE_IOERR_LOCK);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        return lock_shielded(t, sub, state, level);
    }
    sub_call!(t, sub, xLock, level)
}

/// `xLock` of a guarded main file, with the lock shield around it: it steps aside before an
/// EXCLUSIVE attempt (its OFD locks would conflict with this process's own write lock) and takes
/// back what the new level allows. Outside WAL mode the shield holds nothing and this is two
/// atomic loads and a store around the call.
#[inline(always)]
fn lock_shielded(
    t: &FileTable,
    sub: *mut ffi::sqlite3_file,
    state: &DbState,
    level: c_int,
) -> c_int {
    let shield = state.shield();
    let engaged = shield.engaged();
    let stepping_aside = engaged && level == ffi::SQLITE_LOCK_EXCLUSIVE;
    if stepping_aside {
        shield_slow(|| shield.before_exclusive());
    }
    let rc = sub_call!(t, sub, xLock, level);
    if rc == ffi::SQLITE_OK {
        shield.set_level(level);
        state.main_lock_level(level > ffi::SQLITE_LOCK_SHARED);
    }
    if stepping_aside {
        shield_slow(|| shield.after_exclusive());
    } else if engaged && rc == ffi::SQLITE_OK {
        shield_slow(|| shield.reconcile());
    }
    rc
}

unsafe extern "C" fn x_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    let sub = t.sub_ptr(f);
    let rc = sub_call!(t, sub, xUnlock, level);
    if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
        let shield = state.shield();
        if rc == ffi::SQLITE_OK {
            shield.set_level(level);
            state.main_lock_level(level > ffi::SQLITE_LOCK_SHARED);
            if shield.engaged() {
                // Back to SHARED after EXCLUSIVE: the shield takes its locks back.
                shield_slow(|| shield.reconcile());
            }
        }
        if level <= ffi::SQLITE_LOCK_SHARED {
            // A rollback-mode write (or hot-journal rollback) is over.
            state.end_of_main_write();
        }
    }
    rc
}

/// The file controls the guard answers or acts on run inside `ffi_guard`; every other one
/// (SQLite sends several per transaction) passes straight down: neither can panic.
const ANSWERED: u32 = 1 << ffi::SQLITE_FCNTL_VFSNAME
    | 1 << ffi::SQLITE_FCNTL_SIZE_HINT
    | 1 << ffi::SQLITE_FCNTL_HAS_MOVED
    | 1 << ffi::SQLITE_FCNTL_PRAGMA;

/// `xFileControl` of a guarded main file: as `x_file_control`, and the commit boundary, which
/// only stores atomics.
unsafe extern "C" fn x_file_control_main<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    if op == ffi::SQLITE_FCNTL_COMMIT_PHASETWO {
        // SAFETY: a guarded main file's `main_state` points into the state its table holds.
        let state = unsafe { &*t.main_state };
        // Sent after every commit, in every locking mode: the transaction is over.
        state.end_of_transaction();
    } else if (op as u32) < 32 && ANSWERED & (1 << op) != 0 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { file_control_answered(f, op, arg) };
    }
    sub_call!(t, sub_of::<HEAP>(t, f), xFileControl, op, arg)
}

/// `xFileControl` of every other file: the controls in [`ANSWERED`] go to
/// `file_control_answered`, the rest straight down.
unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    if (op as u32) < 32 && ANSWERED & (1 << op) != 0 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { file_control_answered(f, op, arg) };
    }
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    sub_call!(t, t.sub_ptr(f), xFileControl, op, arg)
}

/// The file controls the guard answers or acts on, inside `ffi_guard`. `extern "C"` with the
/// caller's arguments, for a tail call (see `shm_lock_watched`).
///
/// # Safety
/// `f` is one of our live files.
#[cold]
#[inline(never)]
unsafe extern "C" fn file_control_answered(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    let sub = t.sub_ptr(f);
    ffi_guard(ffi::SQLITE_ERROR, || {
        match (op, t.kind, &t.state) {
            (ffi::SQLITE_FCNTL_VFSNAME, _, _) => {
                let rc = sub_call!(t, sub, xFileControl, op, arg);
                // SAFETY: for VFSNAME, `arg` is a `char **` owned by the caller.
                unsafe { chain_vfs_name(arg as *mut *mut c_char, rc) }
            }
            (ffi::SQLITE_FCNTL_SIZE_HINT, Kind::Main, Some(state))
                if state.wal_pinned() || state.is_retired() =>
            {
                // A checkpoint's size hint may grow the main file before its first write.
                if let Err(code) = state.before_main_write() {
                    return code;
                }
                sub_call!(t, sub, xFileControl, op, arg)
            }
            (ffi::SQLITE_FCNTL_HAS_MOVED, Kind::Main, Some(state)) => {
                let rc = sub_call!(t, sub, xFileControl, op, arg);
                // SQLite asks this just before its close-time checkpoint: a retired generation
                // answers "moved" so that checkpoint (and the WAL delete after it) never runs.
                if state.check_pins().is_some() {
                    let _ = state.ensure_captured(Trigger::Close);
                    // SAFETY: for HAS_MOVED, `arg` is an `int *`.
                    unsafe { *(arg as *mut c_int) = 1 };
                    return ffi::SQLITE_OK;
                }
                rc
            }
            (ffi::SQLITE_FCNTL_PRAGMA, Kind::Main, Some(state)) => {
                // SAFETY: for PRAGMA, `arg` is SQLite's `char *azArg[3]`.
                match unsafe { pragma(state, arg as *mut *mut c_char) } {
                    Some(rc) => rc,
                    None => sub_call!(t, sub, xFileControl, op, arg),
                }
            }
            _ => sub_call!(t, sub, xFileControl, op, arg),
        }
    })
}

/// `hermes-guard/<wrapped VFS's answer>`, the convention of shims such as cksumvfs.
///
/// # Safety
/// `out` is the `char **` of a VFSNAME file control.
unsafe fn chain_vfs_name(out: *mut *mut c_char, rc: c_int) -> c_int {
    // SAFETY: as the caller promises; the old string came from sqlite3_malloc.
    unsafe {
        let below = if rc == ffi::SQLITE_OK {
            cstr_text(*out)
        } else {
            None
        };
        if rc == ffi::SQLITE_OK && !(*out).is_null() {
            ffi::sqlite3_free(*out as *mut c_void);
        }
        let name = match below {
            Some(b) => format!("{}/{b}", super::VFS_NAME),
            None => super::VFS_NAME.to_string(),
        };
        *out = sqlite_string(&name);
    }
    ffi::SQLITE_OK
}

/// `PRAGMA hermes_guard_status` and `PRAGMA hermes_guard_capture`; `None` for any other pragma.
///
/// # Safety
/// `az` is SQLite's `char *azArg[3]` for a PRAGMA file control.
unsafe fn pragma(state: &DbState, az: *mut *mut c_char) -> Option<c_int> {
    // SAFETY: azArg[1] is the pragma's name, NUL-terminated.
    let name = unsafe { CStr::from_ptr(*az.add(1)) }.to_bytes();
    let reply = if name.eq_ignore_ascii_case(b"hermes_guard_status") {
        Ok(())
    } else if name.eq_ignore_ascii_case(b"hermes_guard_capture") {
        // The typed error stays on this thread for the library call that ran the pragma.
        state
            .ensure_captured(Trigger::Close)
            .map(|_| ())
            .map_err(capture::hand_over)
    } else {
        return None;
    };
    let (rc, text) = match reply
        .and_then(|()| serde_json::to_string(&state.status()).map_err(|e| e.to_string()))
    {
        Ok(json) => (ffi::SQLITE_OK, json),
        Err(message) => (ffi::SQLITE_ERROR, message),
    };
    // SAFETY: azArg[0] is where SQLite takes the result (or error) string from, and frees it.
    unsafe { *az = sqlite_string(&text) };
    Some(rc)
}

unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let t = unsafe { table(f) };
        let sub = t.sub_ptr(f);
        let rc = sub_call!(t, sub, xShmMap, region, size, extend, pp);
        if let (Kind::Main, Some(state), ffi::SQLITE_OK) = (t.kind, &t.state, rc) {
            // SAFETY: on success the wrapped VFS stored the region's address (or NULL) in *pp.
            let addr = unsafe { *pp } as usize;
            if region > 0 && addr != 0 {
                state
                    .shield()
                    .mapped_region(region, size, addr, state.db_path());
            }
        }
        if let (Kind::Main, Some(state), ffi::SQLITE_OK, 0) = (t.kind, &t.state, rc, region) {
            // SAFETY: on success the wrapped VFS stored the region's address (or NULL) in *pp.
            let addr = unsafe { *pp } as *const u8;
            if !addr.is_null() {
                state.pin_shm(
                    || {
                        let id = identity_of_mapping(addr as usize)?;
                        Some((id, path_of_mapping(addr as usize)))
                    },
                    Box::new(WalIndexView(addr)),
                );
                // Issue 19: the record reads the generation's salts from this mapping.
                state.stale_wal().mapped(addr);
                if state.shield().enabled() {
                    // SAFETY: an armed shield means the wrapped file's unix layout was verified
                    // at the open; xShmMap just mapped region 0.
                    match unsafe { shm_descriptor(sub, state) } {
                        Ok((fd, id)) => {
                            let region0 = (addr as usize, size.max(0) as usize);
                            state.shield().join_shm(fd, id, Some(region0))
                        }
                        Err(reason) => state.shield().disable(reason, state.db_path()),
                    }
                }
            }
        }
        rc
    })
}

/// No `catch_unwind` on the way through (see `x_write`): readers' locks pass straight down, and
/// around the two watched locks only atomics run outside `slow_gate`. Installed on guarded main
/// files (and, in the heap layout, on every file: SQLite only calls it on main files).
unsafe extern "C" fn x_shm_lock<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // Only the WAL write lock (0) and the checkpoint lock (1) are watched; every other lock
    // (each read transaction's read mark, 3 and up) passes straight down after this one
    // compare. The rest of the test is `shm_lock_watched`'s.
    if (ofst as u32) < 2 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { shm_lock_watched::<HEAP>(f, ofst, n, flags) };
    }
    // SAFETY: SQLite calls our methods only on our live files.
    let t = unsafe { table(f) };
    sub_call!(t, sub_of::<HEAP>(t, f), xShmLock, ofst, n, flags)
}

const LOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// `x_shm_lock` at `ofst` 0 or 1. An exclusive lock of one slot goes on to `shm_watched_lock`
/// (at 0: the WAL write lock, which opens every write transaction; at 1: the checkpoint lock,
/// every checkpoint), as a tail call; any other call at 0 or 1 (a release, above all) clears
/// what the check of that lock allowed first (clearing only ever costs a check more); the rest
/// passes down. Out of line so that the pass-through of every other lock stays a few
/// instructions; `extern "C"` (cannot unwind) with the caller's arguments, so that the caller
/// reaches it with a tail call. It stores flags and tail-calls, so it pushes nothing.
///
/// # Safety
/// `f` is one of our live files.
#[inline(never)]
unsafe extern "C" fn shm_lock_watched<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    // In SQLite's buffer, `x_shm_lock` is only installed on guarded main files (whose
    // `main_state` is set); on the heap, on every file.
    if !HEAP || !t.main_state.is_null() {
        if flags == LOCK_EXCLUSIVE {
            if n == 1 {
                // SAFETY: `f` is the live file SQLite passed, its table's `main_state` is not
                // NULL (tail calls).
                return unsafe {
                    if ofst == 0 {
                        shm_watched_lock::<HEAP, 0>(f)
                    } else {
                        shm_watched_lock::<HEAP, 1>(f)
                    }
                };
            }
        } else {
            // SAFETY: not NULL (above), into the state the table holds.
            let state = unsafe { &*t.main_state };
            // Cleared whatever the release returns, as always; before it rather than after
            // (until it returns this connection writes nothing), so the call below is a tail
            // call.
            if ofst == 0 {
                state.end_of_transaction();
            } else {
                state.end_of_main_write();
            }
        }
    }
    sub_call!(t, sub_of::<HEAP>(t, f), xShmLock, ofst, n, flags)
}

/// A watched exclusive lock, one slot, of a guarded main file: `OFST` 0, the WAL write lock,
/// which opens every write transaction (and FULL/RESTART/TRUNCATE checkpoints), or `OFST` 1, the
/// checkpoint lock, which opens every checkpoint. The check (its fast path inlined here: atomics
/// and one `epoll_wait`, panic-free; a full check or a refusal in `slow_gate`, inside
/// `ffi_guard`), the lock, and, once it is taken, the flags that say the transaction or the
/// checkpoint was checked ([`DbState::write_lock`], [`DbState::checkpoint_lock`]). The hot path
/// of the guard: every write transaction runs it (`OFST` is a constant: one function each, no
/// test of it at run time).
///
/// # Safety
/// `f` is one of our live files and its table's `main_state` is not NULL.
#[inline(never)]
unsafe extern "C" fn shm_watched_lock<const HEAP: bool, const OFST: c_int>(
    f: *mut ffi::sqlite3_file,
) -> c_int {
    // SAFETY: as the caller promises.
    let t = unsafe { table(f) };
    // SAFETY: as the caller promises: not NULL, into the state the table holds.
    let state = unsafe { &*t.main_state };
    let site = if OFST == 0 {
        Site::WalWrite
    } else {
        Site::MainWrite
    };
    if !state.vouched_fast() {
        let rc = slow_gate(state, Gate::Check(site), ffi::SQLITE_IOERR_SHMLOCK);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    let rc = sub_call!(t, sub_of::<HEAP>(t, f), xShmLock, OFST, 1, LOCK_EXCLUSIVE);
    if OFST == 0 {
        state.write_lock(rc == ffi::SQLITE_OK);
        // Issue 19: a WAL-base record due (the connection's first write, or after a checkpoint)?
        if state.stale_wal().record_due() {
            let main = MainImage(sub_of::<HEAP>(t, f));
            state.stale_wal().at_write_lock(rc, state, &main);
        }
    } else {
        state.checkpoint_lock(rc == ffi::SQLITE_OK);
    }
    rc
}

unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let t = unsafe { table(f) };
        let sub = t.sub_ptr(f);
        let mut delete = delete;
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            if delete != 0 && !state.may_delete_shm() {
                log::warn!(
                    "hermes-guard: not unlinking {}-shm at close: it is not the one this \
                     connection mapped",
                    state.db_path().display()
                );
                delete = 0;
            }
        }
        let mut left = None;
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            // The WAL is about to be let go of (a close, or a switch out of WAL mode): a full
            // check first, while the wal-index still shows how far the WAL was checkpointed.
            state.check_at_close();
            state.shm_unmapping();
            // Issue 19: the record stops reading this mapping.
            state.stale_wal().unmapping();
            // Before the unmap that may unlink the -shm (and, last, close the node's
            // descriptor): the DMS lock goes with the node's last guarded connection.
            left = state.shield().leave_shm();
        }
        let rc = sub_call!(t, sub, xShmUnmap, delete);
        if let (Kind::Main, Some(state)) = (t.kind, &t.state) {
            if rc == ffi::SQLITE_OK {
                state.shm_unmapped();
            } else {
                // Still mapped: still shielded.
                state.shield().rejoin_shm(left);
            }
        }
        rc
    })
}

/// Issue 19's judgement of an existing WAL, before SQLite opens it (`stale_wal.rs`).
///
/// # Safety
/// `z_name` is the name SQLite passes to `xOpen` for a WAL.
unsafe fn stale_wal_gate(z_name: ffi::sqlite3_filename) -> c_int {
    // SAFETY: a WAL's name is derived from its main file's, as sqlite3_database_file_object
    // expects.
    let main = unsafe { ffi::sqlite3_database_file_object(z_name) };
    // SAFETY: `main` is NULL or the main database's file object, open while its WAL opens.
    let Some(state) = (unsafe { guard_state(main) }) else {
        return ffi::SQLITE_OK;
    };
    // SAFETY: a main file of ours (it has a state), open.
    let sub = unsafe { table(main) }.sub_ptr(main);
    // SAFETY: a non-NULL filename from SQLite is NUL-terminated and outlives the call.
    let Some(path) = (unsafe { cstr_path(z_name) }) else {
        return ffi::SQLITE_OK;
    };
    super::stale_wal::before_wal_open(&state, &MainImage(sub), &path)
}
