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
//!
//! The rooms, one concern each:
//!
//! - this file: the [`FileTable`] (the method table SQLite calls, and the guard's data after
//!   it), the wrapped file's methods ([`SubMethods`]), and [`verdict`], the one function that
//!   turns a write gate into SQLite's answer;
//! - `layout.rs`: where the wrapped file object lives (SQLite's buffer or the heap), its open
//!   there (`xOpen`'s C side), and moving a held main file out of SQLite's buffer;
//! - `entry.rs`: the C side of the methods: [`Live`] (SQLite's pointer made safe once per call),
//!   [`Io`] (the wrapped file's methods, called safely), the C entry points. With `layout.rs` and
//!   `sqlite_private.rs`, every `unsafe` of the io methods;
//! - `sqlite_private.rs`: every read of a SQLite-private structure (`unixFile`, `unixShm`,
//!   `unixShmNode`), checked at run time and keyed to the SQLite versions it was verified
//!   against;
//! - `held.rs`: the connection's state and a held main file as entries of the process-wide
//!   held lists (`vfs/held/`);
//! - `open.rs` and `close.rs`: `xOpen`'s decisions and `xClose`;
//! - `controls.rs`: the file controls and pragmas the guard answers;
//! - `hot.rs`: the write, truncate, sync and lock trampolines (the hot path);
//! - `frame_write.rs`: a WAL frame's header and page written as one (the frame rule);
//! - `shm.rs`: the shared-memory methods;
//! - `reset_lock.rs`: the WAL-reset rule's `xShmLock` callbacks, keeping SQLite's WAL reset and
//!   a checkpoint apart (and the tripwire at a checkpoint's end).

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use rusqlite::ffi;

use super::boundary::ffi_guard;
use super::state::{ConnectionState, Gate};

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

#[macro_use]
mod entry;
mod close;
mod controls;
mod frame_write;
mod held;
mod hot;
mod layout;
mod open;
mod reset_lock;
mod shm;
mod sqlite_private;

pub(super) use self::layout::os_file_size;
pub(super) use self::layout::{open, retired_flag};
use self::{entry::*, hot::*, layout::*, shm::*, sqlite_private::*};

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
    /// `state`'s `ConnectionState` when `kind == Kind::Main`, else NULL; decided at open: the one
    /// test the watched paths of `xShmLock` and `xFileControl` make before anything else, and the
    /// state they use (one load, no `Option` to test). Points into `state`'s allocation, which
    /// lives as long as this table holds the `Arc`.
    main_state: *const ConnectionState,
    state: Option<Arc<ConnectionState>>,
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
            // A main file's reads of its first pages are kept (`vfs/main_reads.rs`).
            xRead: match (main, heap) {
                (true, true) => slot!(true, x_read_main::<true>, xRead),
                (true, false) => slot!(true, x_read_main::<false>, xRead),
                _ => slot!(false, x_read, xRead),
            },
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

    /// The `xWrite` of a WAL whose write gate is open: the frame rule around the wrapped
    /// file's own (`hot::write_wal`).
    fn open_write(&self) -> WriteFn {
        write_wal
    }

    /// The wrapped file object of the guarded file `f`.
    #[inline(always)]
    fn sub_object(&self, f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
        if self.heap.is_null() {
            f
        } else {
            self.heap
        }
    }
}

type WriteFn =
    unsafe extern "C" fn(*mut ffi::sqlite3_file, *const c_void, c_int, ffi::sqlite3_int64) -> c_int;

/// The wrapped file object of `f` in a wrapper compiled for one layout (`HEAP`): no test.
#[inline(always)]
fn sub_object_for<const HEAP: bool>(
    t: &FileTable,
    f: *mut ffi::sqlite3_file,
) -> *mut ffi::sqlite3_file {
    if HEAP {
        t.heap
    } else {
        f
    }
}

/// Carries out a write gate: `SQLITE_OK` to go ahead, else the code to return. The common
/// verdicts — already checked in this transaction, or the directory watch vouches — are decided
/// by panic-free code (the gates are atomics; `check_fast` is atomics and one `epoll_wait`), so
/// they need no `catch_unwind`; only a full check or a refusal (`stat`, logging, allocation, a
/// capture) runs inside `ffi_guard`.
#[inline(always)]
fn verdict(state: &ConnectionState, gate: Gate, on_panic: c_int) -> c_int {
    if gate == Gate::Go {
        ffi::SQLITE_OK
    } else {
        verdict_past_go(state, gate, on_panic)
    }
}

/// `verdict` past `Go`: out of line, so the pass-through path of the callers stays short.
#[inline(never)]
fn verdict_past_go(state: &ConnectionState, gate: Gate, on_panic: c_int) -> c_int {
    match gate {
        Gate::Check(site) if state.check_fast(site) => ffi::SQLITE_OK,
        _ => verdict_slow(state, gate, on_panic),
    }
}

#[cold]
#[inline(never)]
fn verdict_slow(state: &ConnectionState, gate: Gate, on_panic: c_int) -> c_int {
    ffi_guard(on_panic, || {
        let verdict = match gate {
            Gate::Go => Ok(()),
            Gate::Check(site) => state.check(site),
            Gate::Refuse => Err(state.refuse()),
        };
        verdict.err().unwrap_or(ffi::SQLITE_OK)
    })
}

/// Runs a shield transition (mutexes, logging) inside `ffi_guard`; a panic there costs the
/// shield, never the call.
#[cold]
#[inline(never)]
fn shield_slow(f: impl FnOnce()) {
    ffi_guard((), f)
}
