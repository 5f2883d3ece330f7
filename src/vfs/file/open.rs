//! `xOpen`: the wrapped open, the file's kind and state, its table.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::fs::File;
use std::io;
use std::mem::size_of;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::ptr;
use std::sync::Arc;

use rusqlite::ffi;

use super::*;
use crate::capture::ImageSource;
use crate::vfs::boundary::cstr_path;
use crate::vfs::held::{retry_pending_captures, Caller};
use crate::vfs::state::DbState;

/// Reads the main image through the wrapped file object, never through a descriptor of our own.
pub(super) struct MainImage(pub(super) *mut ffi::sqlite3_file);

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

/// Reads the main file through SQLite's own descriptor of it (the unix VFS's `h`), not through
/// its file object: the base pages' reads (`state/base_pages.rs`) run inside a WAL write, and a
/// VFS stacked above the guard may have installed its own methods in the main file object (the
/// connection explorer's yield at every read). No descriptor of the guard's own.
pub(super) struct MainByDescriptor(pub(super) std::os::fd::RawFd);

impl MainByDescriptor {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: SQLite's descriptor of the main file, open while its file object is; the state
        // drops this reader before the file is closed (`DbState::main_released`, and the WAL's
        // writes that use it happen only while the connection has the main file open).
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.0) }
    }
}

impl ImageSource for MainByDescriptor {
    fn size(&self) -> io::Result<u64> {
        Ok(rustix::fs::fstat(self.fd())?.st_size as u64)
    }

    fn read_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match rustix::io::pread(self.fd(), &mut *buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
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
        // An existing WAL is judged before SQLite opens (and replays) it, so that a WAL that
        // belongs to another main file is not replayed onto this one; on a filesystem where WAL
        // is not safe, when the policy refuses it, it is not opened at all.
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
            let state = DbState::new_pinned(
                path,
                prefix.map(|p| p.h).filter(|&h| h >= 0),
                inode_file_id(prefix),
            );
            DbState::opened_here(&state);
            state.set_main_image(Some(Box::new(MainImage(sub))));
            state.set_base_reader(match prefix.map(|p| p.h).filter(|&h| h >= 0) {
                Some(h) => Box::new(MainByDescriptor(h)),
                None => Box::new(MainImage(sub)),
            });
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
                    let sqlite_fd = prefix.filter(|p| p.h >= 0).map(|p| {
                        // SAFETY: `prefix` was checked to be the `unixFile` the wrapped xOpen just
                        // filled in; `h` is its descriptor of the WAL, open until the WAL's
                        // x_close closes it — and x_close has the state let go of it, or own a
                        // dup of it, first (`DbState::wal_closing`). `ManuallyDrop`: the guard
                        // never closes it.
                        ManuallyDrop::new(unsafe { File::from_raw_fd(p.h) })
                    });
                    if state.pin_wal(&path, sqlite_fd).is_err() {
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

/// The state of a main file object if it is one of ours.
///
/// # Safety
/// `f` is NULL or a live `sqlite3_file`.
pub(super) unsafe fn guard_state(f: *mut ffi::sqlite3_file) -> Option<Arc<DbState>> {
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

/// Whether the main database of the connection `db` is a file of the guard's, and if
/// so whether its generation is retired — the flag the write path refuses by
/// ([`DbState::is_retired`]), read as it stands: no check, no lock of the guard's, no system
/// call, no SQL. `None`: not a guarded file (another VFS, a temporary or in-memory database).
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

/// The stale-WAL judgement of an existing WAL, before SQLite opens it (`vfs/stale_wal/gate.rs`).
///
/// # Safety
/// `z_name` is the name SQLite passes to `xOpen` for a WAL.
pub(super) unsafe fn stale_wal_gate(z_name: ffi::sqlite3_filename) -> c_int {
    // SAFETY: a WAL's name is derived from its main file's, as sqlite3_database_file_object
    // expects.
    let main = unsafe { ffi::sqlite3_database_file_object(z_name) };
    // SAFETY: `main` is NULL or the main database's file object, open while its WAL opens.
    let Some(state) = (unsafe { guard_state(main) }) else {
        return ffi::SQLITE_OK;
    };
    if let Some(fs) = state.wal_refused_on() {
        // Under `PRAGMA locking_mode=EXCLUSIVE` SQLite holds the main file EXCLUSIVE
        // before it opens the WAL and keeps its index in heap memory: one connection of one
        // process, no shared memory, safe on any filesystem. That is how such a database is
        // read, and taken out of WAL mode, where WAL is refused.
        if !state.main_locked_above_shared() {
            log::error!(
                "hermes-guard: refusing to open the WAL of {}: it is on {}, where SQLite's WAL \
                 mode is not safe; {}=refuse is set. To read it here, or take it out of WAL mode, \
                 open it alone with `PRAGMA locking_mode=EXCLUSIVE` first (no shared memory: safe \
                 there), then `PRAGMA journal_mode=DELETE`; or open it from a local filesystem",
                state.db_path().display(),
                fs.name,
                crate::filesystem::UNSAFE_FS_ENV
            );
            return ffi::SQLITE_CANTOPEN;
        }
        log::info!(
            "hermes-guard: the WAL of {} on {} is opened under locking_mode=EXCLUSIVE (heap \
             memory, one connection): allowed where {}=refuse refuses shared WAL mode",
            state.db_path().display(),
            fs.name,
            crate::filesystem::UNSAFE_FS_ENV
        );
    }
    // SAFETY: a main file of ours (it has a state), open.
    let sub = unsafe { table(main) }.sub_object(main);
    // SAFETY: a non-NULL filename from SQLite is NUL-terminated and outlives the call.
    let Some(path) = (unsafe { cstr_path(z_name) }) else {
        return ffi::SQLITE_OK;
    };
    crate::vfs::stale_wal::before_wal_open(&*state, &MainImage(sub), &OwnLocks(main), &path)
}

/// The main file's locks through the guard's own table, as SQLite calls them (the shield and
/// the state follow the level, as for SQLite's own calls).
struct OwnLocks(*mut ffi::sqlite3_file);

impl crate::vfs::stale_wal::MainLocks for OwnLocks {
    fn lock(&self, level: c_int) -> c_int {
        // SAFETY: the pointer is SQLite's open main file object, one of ours (it has a state),
        // whose table is the guard's; SQLite holds SHARED on it while its WAL opens.
        unsafe { x_lock(self.0, level) }
    }

    fn unlock(&self, level: c_int) -> c_int {
        // SAFETY: as in `lock`.
        unsafe { x_unlock(self.0, level) }
    }
}
