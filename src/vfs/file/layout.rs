//! Where the wrapped file object lives: in SQLite's buffer (the unix family) or on the heap (any
//! other VFS); its open into that place and the guard's table installed over it (`xOpen`'s C
//! side: the decisions are `open.rs`'s); moving a held main file out of SQLite's buffer at its
//! close; a connection's retired flag from its handle.

use std::alloc::{self, Layout};
use std::cell::UnsafeCell;
use std::ffi::{c_int, CStr, CString};
use std::fs::File;
use std::mem::{size_of, ManuallyDrop};
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::ffi;

use super::*;
use crate::vfs::boundary::cstr_path;
use crate::vfs::held::{retry_pending_captures, Caller};
use crate::vfs::state::ConnectionState;

/// Whether the wrapped VFS's file objects live in SQLite's buffer: SQLite's own unix family
/// (`unix`, `unix-excl`, `unix-dotfile`, `unix-none`, ...: the name, and the `xOpen` of the VFS
/// registered as `unix`, which they all share), or on the heap (anything else, a host's VFS that
/// took a unix name included).
pub(super) fn unix_family(sub_vfs: &ffi::sqlite3_vfs) -> bool {
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
pub(super) static INLINE_LAYOUT: AtomicBool = AtomicBool::new(false);

/// Whether files are opened into SQLite's buffer (see [`unix_family`]), as decided when the
/// guard was registered.
pub(super) fn inline_layout() -> bool {
    INLINE_LAYOUT.load(Ordering::Acquire)
}

/// The `szOsFile` of the guard's VFS over `sub_vfs`: the wrapped file object's when it lives in
/// SQLite's buffer, else only the `sqlite3_file` header (everything of the guard's is in the
/// [`FileTable`]). Called once, at the registration (under its mutex): it decides the layout
/// every `open` uses.
pub(crate) fn os_file_size(sub_vfs: &ffi::sqlite3_vfs) -> c_int {
    check_running_version();
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

/// A wrapped file object on the heap, ours to close and free: a wrapped VFS outside the unix
/// family, or a retired main file held past SQLite's close.
pub(super) struct HeapFile {
    pub(super) ptr: *mut ffi::sqlite3_file,
    pub(super) layout: Layout,
    /// A held file's filename, which its `zPath` points at once SQLite's is gone.
    pub(super) path: Option<CString>,
    /// A held file of a VFS the guard cannot see into: its filename pointer is SQLite's, freed
    /// with the connection, so its `xClose` (which may read it) is never called; the object and
    /// its descriptor are left open instead.
    pub(super) leak_at_close: bool,
}

// SAFETY: the wrapped file object is used by one thread at a time (SQLite's connection mutex, or
// the pending-capture list's mutex once SQLite has let go of it).
unsafe impl Send for HeapFile {}

impl HeapFile {
    pub(super) fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size.max(size_of::<ffi::sqlite3_file>()), 8).ok()
    }

    /// Zeroed memory for a wrapped file object (`layout`, from [`HeapFile::layout`]).
    pub(super) fn alloc(layout: Layout) -> Option<HeapFile> {
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
    pub(super) unsafe fn relocate(
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
    pub(super) fn close(self) -> c_int {
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
    pub(super) unsafe fn hold(
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

/// What the wrapped open gave, for the guard's decisions (`open::kind_and_state`).
pub(super) struct Opened<'a> {
    pub(super) flags: c_int,
    /// The filename, bytes as SQLite passed it (`None`: a temporary file).
    pub(super) path: Option<PathBuf>,
    /// The wrapped object: read as the main image.
    pub(super) sub: *mut ffi::sqlite3_file,
    /// The wrapped object as a `unixFile`, when it has that layout.
    pub(super) prefix: Option<&'a UnixFilePrefix>,
    /// For a WAL: its main file's state, when the main file is one of the guard's.
    pub(super) wal_main: Option<Arc<ConnectionState>>,
    /// For a WAL of a `unixFile`: SQLite's descriptor of it, never closed by the guard.
    pub(super) wal_fd: Option<ManuallyDrop<File>>,
    /// The unix VFS's descriptor of a main file, verified, for the lock shield
    /// ([`main_descriptor`]); the reason the shield cannot be used otherwise.
    pub(super) main_descriptor: &'a dyn Fn(&ConnectionState) -> Result<c_int, ShieldOff>,
}

/// Opens `z_name` through the wrapped VFS and wraps it.
///
/// # Safety
/// Arguments as SQLite passes them to `xOpen`: `f` points at `szOsFile` writable bytes (the size
/// [`os_file_size`] gave for `sub_vfs`).
pub(crate) unsafe fn open(
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
    // SAFETY: as the caller promises.
    let (sub_size, sub_layout, heap) = match unsafe { place_object(f, svfs) } {
        Ok(placed) => placed,
        Err(rc) => return rc,
    };
    let sub = heap.as_ref().map_or(f, |h| h.ptr);
    // SAFETY: a non-NULL filename from SQLite is NUL-terminated and outlives the file.
    let path = unsafe { cstr_path(z_name) };
    // An existing WAL is judged before SQLite opens (and replays) it, so that a WAL that belongs
    // to another main file is not replayed onto this one; on a filesystem where WAL is not safe,
    // when the policy refuses it, it is not opened at all.
    // SAFETY: for a WAL, `z_name` is the name SQLite derived from its main file's.
    let wal_main = (flags & ffi::SQLITE_OPEN_WAL != 0).then(|| unsafe { wal_main(z_name) });
    if let Some(main) = &wal_main {
        let main = main.as_ref().map(|(file, state)| (*file, state));
        let rc = open::stale_wal_gate(main, path.as_deref());
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
    // SAFETY: `sub` was just opened by the wrapped VFS from `z_name`, with this table.
    let prefix = unsafe { unix_prefix(sub_vfs, sub, sub_table, z_name) };
    // SAFETY: `prefix` is that of `sub`, just opened by the wrapped VFS, its descriptor open.
    let main_descriptor =
        |state: &ConnectionState| unsafe { main_descriptor(sub_vfs, prefix, state) };
    let wal_main = wal_main.flatten().map(|(_, state)| state);
    let wal_fd = wal_main.as_ref().and(prefix).filter(|p| p.h >= 0).map(|p| {
        // SAFETY: `prefix` was checked to be the `unixFile` the wrapped xOpen just filled in;
        // `h` is its descriptor of the WAL, open until the WAL's x_close closes it — and x_close
        // has the state let go of it, or own a dup of it, first (`ConnectionState::wal_closing`).
        // `ManuallyDrop`: the guard never closes it.
        ManuallyDrop::new(unsafe { File::from_raw_fd(p.h) })
    });
    let opened = Opened {
        flags,
        path,
        sub,
        prefix,
        wal_main,
        wal_fd,
        main_descriptor: &main_descriptor,
    };
    let (kind, state) = match open::kind_and_state(opened) {
        Ok(decided) => decided,
        Err(rc) => return rc,
    };
    let heap = unfinished.finish();
    // SAFETY: a non-NULL table installed by the wrapped VFS outlives the file.
    let sub_methods = unsafe { &*sub_table };
    let table = FileTable {
        methods: UnsafeCell::new(FileTable::methods_for(kind, heap.is_some(), sub_methods)),
        sub: SubMethods::of(sub_methods),
        // Owned by the table from here on: closed and freed in `x_close`.
        heap: heap.map_or(ptr::null_mut(), |h| h.ptr),
        sub_table,
        sub_size,
        sub_layout,
        z_name,
        unix_prefix: prefix.is_some(),
        kind,
        main_state: match (kind, &state) {
            (Kind::Main, Some(state)) => Arc::as_ptr(state),
            _ => ptr::null(),
        },
        state,
    };
    // SAFETY: `f` is SQLite's writable file object, now opened.
    unsafe { install(f, table) };
    ffi::SQLITE_OK
}

/// Where the wrapped object of `svfs` goes, zeroed: in SQLite's buffer `f` (the unix family) or
/// on the heap; its size and a heap copy's layout.
///
/// # Safety
/// `f` points at `szOsFile` writable bytes (the size [`os_file_size`] gave for `svfs`).
unsafe fn place_object(
    f: *mut ffi::sqlite3_file,
    svfs: &ffi::sqlite3_vfs,
) -> Result<(usize, Layout, Option<HeapFile>), c_int> {
    let sub_size = (svfs.szOsFile.max(0) as usize).max(size_of::<ffi::sqlite3_file>());
    let sub_layout = HeapFile::layout(sub_size).ok_or(ffi::SQLITE_CANTOPEN)?;
    let heap = if inline_layout() {
        // SAFETY: `f` is szOsFile writable bytes, at least `sub_size` in this layout (see
        // `os_file_size`); zeroed as the heap layout's memory is.
        unsafe { ptr::write_bytes(f as *mut u8, 0, sub_size) };
        None
    } else {
        Some(HeapFile::alloc(sub_layout).ok_or(ffi::SQLITE_NOMEM)?)
    };
    Ok((sub_size, sub_layout, heap))
}

/// Puts `table` in `f`'s `pMethods`: from here on SQLite calls the guard's table (freed in
/// `x_close`); a WAL's write gate attached to it.
///
/// # Safety
/// `f` is SQLite's writable file object, whose wrapped object `table` describes, opened.
unsafe fn install(f: *mut ffi::sqlite3_file, table: FileTable) {
    let open_write = table.open_write();
    let wal = table.kind == Kind::Wal;
    let table = Box::into_raw(Box::new(table));
    // SAFETY: as the caller promises.
    unsafe { (*f).pMethods = table as *const ffi::sqlite3_io_methods };
    if wal {
        // SAFETY: just made; alive until x_close, which detaches the gate first.
        if let Some(state) = unsafe { &(*table).state } {
            // SAFETY: as above.
            let slot = unsafe { WalGateSlot::new(table, open_write) };
            state.attach_wal_gate(Box::new(slot));
        }
    }
}

/// For a WAL named `z_name`: its main file, if it is one of the guard's, and its state.
///
/// # Safety
/// `z_name` is the name SQLite passes to `xOpen` for a WAL (derived from its main file's, as
/// `sqlite3_database_file_object` expects), during that `xOpen`.
unsafe fn wal_main<'a>(z_name: ffi::sqlite3_filename) -> Option<(Live<'a>, Arc<ConnectionState>)> {
    // SAFETY: as the caller promises.
    let main = unsafe { ffi::sqlite3_database_file_object(z_name) };
    // SAFETY: `main` is NULL or the main database's file object, open while its WAL opens.
    let file = unsafe { guarded(main) }?;
    let state = file.table().state.clone()?;
    Some((file, state))
}

/// A wrapped open the guard has not finished: dropped before [`UnfinishedOpen::finish`], it closes
/// the wrapped file (if its xOpen opened it), frees a heap object and leaves a NULL `pMethods`
/// in SQLite's file, so that SQLite calls nothing on it.
pub(super) struct UnfinishedOpen {
    pub(super) f: *mut ffi::sqlite3_file,
    pub(super) sub_table: *const ffi::sqlite3_io_methods,
    pub(super) heap: Option<HeapFile>,
}

impl UnfinishedOpen {
    /// The open is complete: the heap object (if any) goes to the guard's table.
    pub(super) fn finish(&mut self) -> Option<HeapFile> {
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

/// Whether the main database of the connection `db` is a file of the guard's, and if
/// so whether its generation is retired — the flag the write path refuses by
/// ([`ConnectionState::is_retired`]), read as it stands: no check, no lock of the guard's, no
/// system call, no SQL. `None`: not a guarded file (another VFS, a temporary or in-memory
/// database).
///
/// # Safety
/// `db` is an open connection that no other thread uses during the call.
pub(crate) unsafe fn retired_flag(db: *mut ffi::sqlite3) -> Option<bool> {
    let mut f: *mut ffi::sqlite3_file = ptr::null_mut();
    // SAFETY: `db` is open. SQLite answers FILE_POINTER itself (the VFS never sees it): it stores
    // the main database's file object, open as long as the connection is, into `f`.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            db,
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut f as *mut *mut ffi::sqlite3_file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return None;
    }
    // SAFETY: `f` is NULL or the connection's live main file object.
    unsafe { guard_state(f) }.map(|state| state.is_retired())
}
