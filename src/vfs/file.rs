//! The io methods. Each guarded file is a `GuardFile`: SQLite's `sqlite3_file` header, then a
//! pointer to the wrapped VFS's file object, which lives on the heap so that a retired, uncaptured
//! main file can outlive SQLite's close of it (its descriptor is the only way left to the main
//! image, and closing it would drop the process's locks on that inode).

use std::alloc::{self, Layout};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::ffi;

use super::shield;
use super::state::{DbState, Gate, Site, WalIndex, WRITE_GO};
use super::{cstr_path, cstr_text, ffi_guard, sqlite_string};
use crate::capture::{self, ImageSource, Trigger};
use crate::identity::{identity_of_fd, identity_of_mapping, FileId};
use crate::status::Backfill;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Main,
    Wal,
    Other,
}

/// The guard's file object. `#[repr(C)]` and starting with `sqlite3_file`, as SQLite requires.
#[repr(C)]
pub(super) struct GuardFile {
    base: ffi::sqlite3_file,
    sub: SubFile,
    kind: Kind,
    /// `state`'s `DbState` when `kind == Kind::Main`, else NULL; decided at open: the one test
    /// the watched paths of `xShmLock` and `xFileControl` make before anything else, and the
    /// state they use (one load, no `Option` to test). Points into `state`'s allocation, which
    /// lives as long as this file object holds the `Arc`.
    main_state: *const DbState,
    /// The word `xWrite` tests for [`WRITE_GO`] to decide "pass straight down": the state's
    /// transaction bits for a WAL (set while the write lock is held, its check passed and the
    /// generation is not retired), a static without it for a guarded main file (every write
    /// takes the gate), a static with it for a file without guard state. Points at a static or
    /// into `state`'s allocation.
    write_go: *const AtomicU8,
    state: Option<Arc<DbState>>,
}

/// `write_go` of a guarded main file: its writes always take the gate.
static WRITE_GATED: AtomicU8 = AtomicU8::new(0);
/// `write_go` of a file without guard state: its writes always pass straight down.
static WRITE_UNGUARDED: AtomicU8 = AtomicU8::new(WRITE_GO);

/// The wrapped VFS's file object, in memory of our own.
struct SubFile {
    ptr: *mut ffi::sqlite3_file,
    /// The wrapped file's method table, copied from its `pMethods` once its xOpen succeeded (a
    /// VFS never changes a file's table while it is open): one load less on every call. NULL
    /// until then.
    methods: *const ffi::sqlite3_io_methods,
    /// The same table's slots, copied at open with every missing one replaced by a stub that
    /// returns what a missing method means: a call is one load and an unconditional call.
    m: SubMethods,
    layout: Layout,
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

            /// Every slot a stub: the table of a file not opened yet.
            fn none() -> SubMethods {
                SubMethods::of(&ffi::sqlite3_io_methods {
                    iVersion: 0,
                    $($slot: None,)*
                })
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

// SAFETY: the wrapped unix file object is used by one thread at a time (SQLite's connection
// mutex, or the pending-capture list's mutex once SQLite has let go of it).
unsafe impl Send for SubFile {}

impl SubFile {
    fn alloc(size: usize) -> Option<SubFile> {
        let layout = Layout::from_size_align(size.max(size_of::<ffi::sqlite3_file>()), 8).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) } as *mut ffi::sqlite3_file;
        (!ptr.is_null()).then(|| SubFile {
            ptr,
            methods: ptr::null(),
            m: SubMethods::none(),
            layout,
        })
    }

    #[inline(always)]
    fn methods(&self) -> &ffi::sqlite3_io_methods {
        // SAFETY: a SubFile only escapes `open` once the wrapped xOpen succeeded and `methods`
        // was set from the non-NULL method table it installed, which outlives the file.
        unsafe { &*self.methods }
    }

    /// Closes the wrapped file (if it was opened) and frees its memory.
    fn close(self) -> c_int {
        // SAFETY: `ptr` is our allocation; `m` holds the wrapped table's xClose once its xOpen
        // succeeded, and a stub (nothing to close) before.
        let rc = unsafe { (self.m.xClose)(self.ptr) };
        // SAFETY: allocated in `alloc` with this layout, and closed above.
        unsafe { alloc::dealloc(self.ptr as *mut u8, self.layout) };
        rc
    }
}

/// Reads the main image through the wrapped file object, never through a descriptor of our own.
struct MainImage(*mut ffi::sqlite3_file);

// SAFETY: see SubFile; the image is read under the state's mutex only.
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

/// The unix VFS's descriptor of a freshly opened main file, verified, for the lock shield; the
/// reason the shield cannot be used otherwise.
///
/// # Safety
/// `sub_vfs` is the wrapped VFS, `sub` its file object just opened by it from `z_name`.
unsafe fn main_descriptor(
    sub_vfs: *mut ffi::sqlite3_vfs,
    sub: &SubFile,
    z_name: ffi::sqlite3_filename,
    state: &DbState,
) -> Result<c_int, String> {
    if let Some(reason) = shield::platform_off_reason() {
        return Err(reason.into());
    }
    // SAFETY: the wrapped VFS is registered for the life of the process; its name is a C string.
    let (name, size) = unsafe { (cstr_text((*sub_vfs).zName), (*sub_vfs).szOsFile) };
    if name.as_deref() != Some("unix") {
        return Err(format!(
            "the VFS below the guard is {}, not the unix VFS",
            name.as_deref().unwrap_or("unnamed")
        ));
    }
    if (size as usize) < size_of::<UnixFilePrefix>() {
        return Err(format!(
            "the unix VFS's file object is {size} bytes, smaller than the fields the shield reads"
        ));
    }
    // SAFETY: the allocation is the unix VFS's file object (szOsFile bytes, 8-aligned, checked
    // above to cover the prefix), initialised by its xOpen, used on this thread only.
    let p = unsafe { &*(sub.ptr as *const UnixFilePrefix) };
    if !ptr::eq(p.p_method, sub.methods) || !ptr::eq(p.p_vfs, sub_vfs) || !ptr::eq(p.z_path, z_name)
    {
        return Err(format!(
            "the unix VFS's file object does not have the layout of SQLite {} (pMethod, pVfs or              zPath differ)",
            ffi::SQLITE_VERSION.to_str().unwrap_or("?")
        ));
    }
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
/// `gf` is a live main GuardFile whose shield is armed (so its wrapped file object has the
/// verified unix layout) and whose `xShmMap` just succeeded.
unsafe fn shm_descriptor(gf: &GuardFile, state: &DbState) -> Result<(c_int, FileId), String> {
    // SAFETY: as the caller promises: the layout was verified at the open, and `pShm`, its
    // node and the node's `pInode` and `hShm` are set by xShmMap and stay until xShmUnmap.
    let (node_inode, fd, file_inode) = unsafe {
        let p = &*(gf.sub.ptr as *const UnixFilePrefix);
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
static PENDING: Mutex<Vec<(Arc<DbState>, SubFile)>> = Mutex::new(Vec::new());
static PENDING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Retries the capture of every held retired generation; returns how many are still uncaptured.
pub(crate) fn retry_pending_captures() -> usize {
    if PENDING_COUNT.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let mut pending = PENDING.lock();
    let mut kept = Vec::new();
    for (state, sub) in pending.drain(..) {
        match state.ensure_captured(Trigger::Close) {
            Ok(_) => {
                state.main_closed();
                sub.close();
            }
            Err(_) => kept.push((state, sub)),
        }
    }
    *pending = kept;
    PENDING_COUNT.store(pending.len(), Ordering::Release);
    pending.len()
}

/// Opens `z_name` through the wrapped VFS and wraps it.
///
/// # Safety
/// Arguments as SQLite passes them to `xOpen`: `f` points at `szOsFile` writable bytes.
pub(super) unsafe fn open(
    sub_vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `f` is writable; a NULL pMethods tells SQLite not to call xClose on failure.
    unsafe { (*f).pMethods = ptr::null() };
    retry_pending_captures();
    // SAFETY: the wrapped VFS is registered for the life of the process.
    let svfs = unsafe { &*sub_vfs };
    let Some(sub) = SubFile::alloc(svfs.szOsFile as usize) else {
        return ffi::SQLITE_NOMEM;
    };
    let Some(x_open) = svfs.xOpen else {
        sub.close();
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: SQLite's own arguments, with our allocation of the wrapped VFS's size.
    let rc = unsafe { x_open(sub_vfs, z_name, sub.ptr, flags, out_flags) };
    let mut sub = sub;
    // SAFETY: `sub.ptr` is our zeroed allocation; xOpen set pMethods or left it NULL.
    sub.methods = unsafe { (*sub.ptr).pMethods };
    // SAFETY: a non-NULL table installed by the wrapped VFS outlives the file.
    if let Some(table) = unsafe { sub.methods.as_ref() } {
        sub.m = SubMethods::of(table);
    }
    if rc != ffi::SQLITE_OK || sub.methods.is_null() {
        sub.close();
        return if rc == ffi::SQLITE_OK {
            ffi::SQLITE_CANTOPEN
        } else {
            rc
        };
    }

    // SAFETY: a non-NULL filename from SQLite is NUL-terminated and outlives the file.
    let path = unsafe { cstr_path(z_name) };
    let (kind, state) = match path {
        Some(path) if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 => {
            let state = DbState::new(path);
            state.set_main_image(Some(Box::new(MainImage(sub.ptr))));
            // SAFETY: `sub` was just opened by the wrapped VFS from `z_name`.
            let main_fd = unsafe { main_descriptor(sub_vfs, &sub, z_name, &state) };
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
                        sub.close();
                        return ffi::SQLITE_CANTOPEN;
                    }
                    (Kind::Wal, Some(state))
                }
                None => (Kind::Other, None),
            }
        }
        _ => (Kind::Other, None),
    };
    let table = match sub.methods().iVersion {
        1 => &IO_V1,
        2 => &IO_V2,
        _ => &IO_V3,
    };
    let main_state = match (kind, &state) {
        (Kind::Main, Some(state)) => Arc::as_ptr(state),
        _ => ptr::null(),
    };
    let write_go: *const AtomicU8 = match (kind, &state) {
        (Kind::Wal, Some(state)) => state.write_go_word(),
        (_, Some(_)) => &WRITE_GATED,
        (_, None) => &WRITE_UNGUARDED,
    };
    // SAFETY: `f` has room for a GuardFile (szOsFile) and is suitably aligned by SQLite.
    unsafe {
        ptr::write(
            f as *mut GuardFile,
            GuardFile {
                base: ffi::sqlite3_file { pMethods: table },
                sub,
                kind,
                main_state,
                write_go,
                state,
            },
        )
    };
    ffi::SQLITE_OK
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
    let methods = unsafe { (*f).pMethods };
    let ours = [&IO_V1, &IO_V2, &IO_V3]
        .iter()
        .any(|t| ptr::eq(*t as *const _, methods));
    if !ours {
        return None;
    }
    // SAFETY: our method tables are only ever installed on GuardFiles.
    unsafe { (*(f as *const GuardFile)).state.clone() }
}

/// # Safety
/// `f` is a live GuardFile (SQLite only calls our methods on files we opened).
#[inline(always)]
unsafe fn guard<'a>(f: *mut ffi::sqlite3_file) -> &'a GuardFile {
    // SAFETY: as the caller promises.
    unsafe { &*(f as *const GuardFile) }
}

/// Calls the wrapped file's method `slot` with SQLite's arguments (a slot the wrapped table
/// lacks is a stub returning what a missing method means, see [`SubMethods`]). Panic-free: two
/// field reads and a call into C (which cannot unwind into Rust) or into a stub that returns a
/// constant. The pass-through methods below are nothing else but this and the cast of `f`, so
/// they run without `catch_unwind`.
macro_rules! sub_call {
    ($gf:expr, $slot:ident $(, $arg:expr)*) => {{
        let gf: &GuardFile = $gf;
        // SAFETY: the wrapped file is open and the slot is its own table's method (or a stub).
        unsafe { (gf.sub.m.$slot)(gf.sub.ptr $(, $arg)*) }
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
        // SAFETY: SQLite closes each file it opened exactly once; we take ownership of our
        // fields and leave pMethods NULL behind.
        let GuardFile {
            sub, kind, state, ..
        } = unsafe { ptr::read(f as *mut GuardFile) };
        // SAFETY: `f` stays valid memory until SQLite frees it after this call.
        unsafe { (*f).pMethods = ptr::null() };
        if let (Kind::Main, Some(state)) = (kind, &state) {
            // Before SQLite's descriptor is closed or parked for reuse.
            state.shield().close();
        }
        let rc = match (kind, state) {
            (Kind::Main, Some(state)) if state.must_hold_main() => {
                // Locks go (nobody may wait on a retired handle) but the descriptor stays.
                // SAFETY: the wrapped file is open; the slot is its table's (or a stub).
                unsafe { (sub.m.xUnlock)(sub.ptr, ffi::SQLITE_LOCK_NONE) };
                log::error!(
                    "hermes-guard: {} closed with its retired generation uncaptured; its \
                     descriptor is held and the capture is retried at the next open or close \
                     (or hermes_guard::retry_pending_captures)",
                    state.db_path().display()
                );
                let mut pending = PENDING.lock();
                pending.push((state, sub));
                PENDING_COUNT.store(pending.len(), Ordering::Release);
                ffi::SQLITE_OK
            }
            (Kind::Main, Some(state)) => {
                state.main_closed();
                sub.close()
            }
            (Kind::Wal, Some(state)) => {
                let rc = sub.close();
                state.wal_closed();
                rc
            }
            _ => sub.close(),
        };
        if kind == Kind::Main {
            retry_pending_captures();
        }
        rc
    })
}

unsafe extern "C" fn x_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xRead, buf, amt, ofst)
}

/// No `catch_unwind` on the way through: the gate is decided by panic-free code and only its
/// slow verdicts enter `ffi_guard` (see `gate_rc`). A WAL write inside a checked transaction
/// (the write lock held after its check passed; the bit is cleared when the generation is
/// retired, see `DbState::write_lock`) and a write to a file without guard state are one load
/// and a bit test (`write_go`) before the call; everything else goes through `write_gated`.
unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    // SAFETY: `write_go` points at a static or into the state this file object holds.
    if unsafe { &*gf.write_go }.load(Ordering::Acquire) & WRITE_GO == 0 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { write_gated(f, buf, amt, ofst) };
    }
    sub_call!(gf, xWrite, buf, amt, ofst)
}

/// `x_write` of a guarded file outside the fast path: the gate, then the write. `extern "C"`
/// with the caller's arguments, for a tail call (see `shm_lock_watched`).
///
/// # Safety
/// `f` is one of our live files.
#[inline(never)]
unsafe extern "C" fn write_gated(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as the caller promises.
    let gf = unsafe { guard(f) };
    let Some(state) = &gf.state else {
        return sub_call!(gf, xWrite, buf, amt, ofst);
    };
    let gate = match gf.kind {
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
    sub_call!(gf, xWrite, buf, amt, ofst)
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_TRUNCATE, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let gf = unsafe { guard(f) };
        if let Some(state) = &gf.state {
            let allowed = if gf.kind == Kind::Wal {
                // Below any write: a truncate outside a checked transaction always checks.
                state.before_wal_write(i64::MIN)
            } else {
                state.before_main_write()
            };
            if let Err(code) = allowed {
                return code;
            }
        }
        sub_call!(gf, xTruncate, size)
    })
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    let rc = sub_call!(gf, xSync, flags);
    if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
        // A checkpoint ends with a sync of the main file: the next one checks afresh.
        state.end_of_main_write();
    }
    rc
}

unsafe extern "C" fn x_file_size(
    f: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xFileSize, size)
}

/// No `catch_unwind` on the way through (see `x_write`).
unsafe extern "C" fn x_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
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
        return lock_shielded(gf, state, level);
    }
    sub_call!(gf, xLock, level)
}

/// `xLock` of a guarded main file, with the lock shield around it: it steps aside before an
/// EXCLUSIVE attempt (its OFD locks would conflict with this process's own write lock) and takes
/// back what the new level allows. Outside WAL mode the shield holds nothing and this is two
/// atomic loads and a store around the call.
#[inline(always)]
fn lock_shielded(gf: &GuardFile, state: &DbState, level: c_int) -> c_int {
    let shield = state.shield();
    let engaged = shield.engaged();
    let stepping_aside = engaged && level == ffi::SQLITE_LOCK_EXCLUSIVE;
    if stepping_aside {
        shield_slow(|| shield.before_exclusive());
    }
    let rc = sub_call!(gf, xLock, level);
    if rc == ffi::SQLITE_OK {
        shield.set_level(level);
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
    let gf = unsafe { guard(f) };
    let rc = sub_call!(gf, xUnlock, level);
    if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
        let shield = state.shield();
        if rc == ffi::SQLITE_OK {
            shield.set_level(level);
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

unsafe extern "C" fn x_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xCheckReservedLock, out)
}

/// The file controls the guard answers or acts on run inside `ffi_guard`; every other one
/// (SQLite sends several per transaction) passes straight down, and the commit boundary only
/// stores atomics: neither can panic.
unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    /// The file controls `file_control_answered` handles, as bits.
    const ANSWERED: u32 = 1 << ffi::SQLITE_FCNTL_VFSNAME
        | 1 << ffi::SQLITE_FCNTL_SIZE_HINT
        | 1 << ffi::SQLITE_FCNTL_HAS_MOVED
        | 1 << ffi::SQLITE_FCNTL_PRAGMA;
    if op == ffi::SQLITE_FCNTL_COMMIT_PHASETWO {
        // SAFETY: `main_state` is NULL or points into the state this file object holds.
        if let Some(state) = unsafe { gf.main_state.as_ref() } {
            // Sent after every commit, in every locking mode: the transaction is over.
            state.end_of_transaction();
        }
    } else if (op as u32) < 32 && ANSWERED & (1 << op) != 0 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { file_control_answered(f, op, arg) };
    }
    sub_call!(gf, xFileControl, op, arg)
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
    let gf = unsafe { guard(f) };
    ffi_guard(ffi::SQLITE_ERROR, || {
        match (op, gf.kind, &gf.state) {
            (ffi::SQLITE_FCNTL_VFSNAME, _, _) => {
                let rc = sub_call!(gf, xFileControl, op, arg);
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
                sub_call!(gf, xFileControl, op, arg)
            }
            (ffi::SQLITE_FCNTL_HAS_MOVED, Kind::Main, Some(state)) => {
                let rc = sub_call!(gf, xFileControl, op, arg);
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
                    None => sub_call!(gf, xFileControl, op, arg),
                }
            }
            _ => sub_call!(gf, xFileControl, op, arg),
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

unsafe extern "C" fn x_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xSectorSize)
}

unsafe extern "C" fn x_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xDeviceCharacteristics)
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
        let gf = unsafe { guard(f) };
        let rc = sub_call!(gf, xShmMap, region, size, extend, pp);
        if let (Kind::Main, Some(state), ffi::SQLITE_OK, 0) = (gf.kind, &gf.state, rc, region) {
            // SAFETY: on success the wrapped VFS stored the region's address (or NULL) in *pp.
            let addr = unsafe { *pp } as *const u8;
            if !addr.is_null() {
                state.pin_shm(
                    || identity_of_mapping(addr as usize),
                    Box::new(WalIndexView(addr)),
                );
                if state.shield().enabled() {
                    // SAFETY: an armed shield means the wrapped file's unix layout was verified
                    // at the open; xShmMap just mapped region 0.
                    match unsafe { shm_descriptor(gf, state) } {
                        Ok((fd, id)) => state.shield().join_shm(fd, id),
                        Err(reason) => state.shield().disable(reason, state.db_path()),
                    }
                }
            }
        }
        rc
    })
}

/// No `catch_unwind` on the way through (see `x_write`): readers' locks pass straight down, and
/// around the two watched locks only atomics run outside `slow_gate`.
unsafe extern "C" fn x_shm_lock(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // Only the WAL write lock (0) and the checkpoint lock (1) of a guarded main file are
    // watched; every other lock (each read transaction's read mark, 3 and up) passes straight
    // down after this one compare. The rest of the test is `shm_lock_watched`'s.
    if (ofst as u32) < 2 {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { shm_lock_watched(f, ofst, n, flags) };
    }
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xShmLock, ofst, n, flags)
}

const LOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;
const UNLOCK_EXCLUSIVE: c_int = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;

/// `x_shm_lock` at `ofst` 0 or 1: an exclusive lock goes on to `shm_lock_exclusive` (a tail
/// call); the release of the WAL write lock (0) or the checkpoint lock (1), one slot, of a
/// guarded main file clears what its check allowed; anything else passes down. Out of line so
/// that the pass-through of every other lock stays a few instructions; `extern "C"` (cannot
/// unwind) with the caller's arguments, so that the caller reaches it with a tail call. It
/// stores flags and tail-calls, so it pushes nothing.
///
/// # Safety
/// `f` is one of our live files.
#[inline(never)]
unsafe extern "C" fn shm_lock_watched(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    if flags == LOCK_EXCLUSIVE {
        // SAFETY: `f` is the live file SQLite passed (same arguments: a tail call).
        return unsafe { shm_lock_exclusive(f, ofst, n, flags) };
    }
    // SAFETY: as the caller promises.
    let gf = unsafe { guard(f) };
    if flags == UNLOCK_EXCLUSIVE && n == 1 {
        // SAFETY: `main_state` is NULL or points into the state this file object holds.
        if let Some(state) = unsafe { gf.main_state.as_ref() } {
            // Cleared whatever the release returns, as always; before it rather than after
            // (until it returns this connection writes nothing), so the call below is a tail
            // call.
            if ofst == 0 {
                state.write_lock(false);
            } else {
                state.end_of_main_write();
            }
        }
    }
    sub_call!(gf, xShmLock, ofst, n, flags)
}

/// The exclusive lock at `ofst` 0 or 1. The WAL write lock (0) opens every write transaction
/// (and FULL/RESTART/TRUNCATE checkpoints), the checkpoint lock (1) every checkpoint; of those,
/// one slot, of a guarded main file: the check (its fast path inlined here: atomics and one
/// `epoll_wait`, panic-free; a full check or a refusal in `slow_gate`, inside `ffi_guard`),
/// the lock, and, once it is taken, the flags that say the transaction or checkpoint was
/// checked. Anything else passes down.
///
/// # Safety
/// `f` is one of our live files.
#[inline(never)]
unsafe extern "C" fn shm_lock_exclusive(
    f: *mut ffi::sqlite3_file,
    ofst: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: as the caller promises.
    let gf = unsafe { guard(f) };
    // SAFETY: `main_state` is NULL or points into the state this file object holds.
    let Some(state) = (unsafe { gf.main_state.as_ref() }) else {
        return sub_call!(gf, xShmLock, ofst, n, flags);
    };
    if n != 1 {
        return sub_call!(gf, xShmLock, ofst, n, flags);
    }
    let site = if ofst == 0 {
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
    let rc = sub_call!(gf, xShmLock, ofst, 1, LOCK_EXCLUSIVE);
    match site {
        Site::WalWrite => state.write_lock(rc == ffi::SQLITE_OK),
        Site::MainWrite => state.checkpoint_lock(rc == ffi::SQLITE_OK),
    }
    rc
}

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xShmBarrier)
}

unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files.
        let gf = unsafe { guard(f) };
        let mut delete = delete;
        if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
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
        if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
            state.shm_unmapping();
            // Before the unmap that may unlink the -shm (and, last, close the node's
            // descriptor): the DMS lock goes with the node's last guarded connection.
            left = state.shield().leave_shm();
        }
        let rc = sub_call!(gf, xShmUnmap, delete);
        if let (Kind::Main, Some(state)) = (gf.kind, &gf.state) {
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

unsafe extern "C" fn x_fetch(
    f: *mut ffi::sqlite3_file,
    ofst: ffi::sqlite3_int64,
    amt: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xFetch, ofst, amt, pp)
}

unsafe extern "C" fn x_unfetch(
    f: *mut ffi::sqlite3_file,
    ofst: ffi::sqlite3_int64,
    p: *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files.
    let gf = unsafe { guard(f) };
    sub_call!(gf, xUnfetch, ofst, p)
}

/// One table per wrapped `iVersion`: declaring a version the wrapped file cannot serve would
/// make SQLite call a method the wrapped file lacks.
const fn io_methods(version: c_int) -> ffi::sqlite3_io_methods {
    ffi::sqlite3_io_methods {
        iVersion: version,
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
        xShmMap: if version >= 2 { Some(x_shm_map) } else { None },
        xShmLock: if version >= 2 { Some(x_shm_lock) } else { None },
        xShmBarrier: if version >= 2 {
            Some(x_shm_barrier)
        } else {
            None
        },
        xShmUnmap: if version >= 2 {
            Some(x_shm_unmap)
        } else {
            None
        },
        xFetch: if version >= 3 { Some(x_fetch) } else { None },
        xUnfetch: if version >= 3 { Some(x_unfetch) } else { None },
    }
}

static IO_V1: ffi::sqlite3_io_methods = io_methods(1);
static IO_V2: ffi::sqlite3_io_methods = io_methods(2);
static IO_V3: ffi::sqlite3_io_methods = io_methods(3);
