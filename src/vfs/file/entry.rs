//! The C side of the guard's io methods: [`Live`], SQLite's pointer to one of the guard's files
//! made safe to use once per call; [`Io`], the wrapped file's methods called safely; the
//! methods' C entry points, which make those (and safe wrappers of SQLite's other arguments,
//! `boundary.rs`) and call the safe code of the other rooms; the WAL's write gate slot, the main
//! image read through the wrapped object, and the test that a file is one of the guard's.

use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::marker::PhantomData;
use std::sync::Arc;

use rusqlite::ffi;

use super::*;
use crate::capture::ImageSource;
use crate::vfs::boundary::{ffi_guard, Fcntl, ReadBuf, ShmOut, WriteBuf};
use crate::vfs::state::{ConnectionState, WalGate};

/// A guarded file SQLite is closing: its table, taken back from SQLite (freed at the end of the
/// close), its wrapped object, and that object's heap memory if it has any.
pub(super) struct Closing<'a> {
    f: *mut ffi::sqlite3_file,
    pub(super) io: Io<'a>,
    heap: Option<HeapFile>,
}

impl Closing<'_> {
    /// Closes the wrapped file object (on the heap: freed too).
    pub(super) fn close_sub(self) -> c_int {
        match self.heap {
            Some(h) => h.close(),
            None => self.io.close(),
        }
    }

    /// The wrapped main file moved out of SQLite's reach ([`FileTable::hold`]); `Err` (nothing
    /// moved, nothing freed) when it cannot be held.
    pub(super) fn hold(self) -> Result<HeapFile, &'static str> {
        // SAFETY: `f` is the open file SQLite is closing, whose table this is; `heap` its heap
        // object.
        unsafe { self.io.t.hold(self.f, self.heap) }
    }
}

/// `xClose`: the table taken back from SQLite, then `close::close`.
pub(super) unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_CLOSE, || {
        // SAFETY: SQLite closes each file it opened exactly once: the table is ours again (it
        // clears pMethods after this call and never reads the table afterwards).
        let t = unsafe { Box::from_raw((*f).pMethods as *mut FileTable) };
        let heap = (!t.heap.is_null()).then_some(HeapFile {
            ptr: t.heap,
            layout: t.sub_layout,
            path: None,
            leak_at_close: false,
        });
        let io = Io {
            t: &t,
            sub: t.sub_object(f),
        };
        close::close(Closing { f, io, heap })
    })
}

/// One of the guard's open files as SQLite passes it to a method of the guard's table: known to
/// be one of the guard's (its `pMethods` is its [`FileTable`]) and open for `'a` (the call). Made
/// once per call, unsafely, in the method's C entry point (below); every use after is safe.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(super) struct Live<'a> {
    f: *mut ffi::sqlite3_file,
    table: PhantomData<&'a FileTable>,
}

impl<'a> Live<'a> {
    /// # Safety
    /// `f` is one of the guard's files, open (its `pMethods` its `FileTable`, not freed) for
    /// `'a`.
    #[inline(always)]
    pub(super) unsafe fn new(f: *mut ffi::sqlite3_file) -> Live<'a> {
        Live {
            f,
            table: PhantomData,
        }
    }

    /// Its table: one load.
    #[inline(always)]
    pub(super) fn table(self) -> &'a FileTable {
        // SAFETY: `f` is one of ours, open for `'a` (`new`'s contract): its pMethods is its
        // FileTable, freed only by its close.
        unsafe { &*((*self.f).pMethods as *const FileTable) }
    }

    /// Its table and wrapped file object.
    #[inline(always)]
    pub(super) fn io(self) -> Io<'a> {
        let t = self.table();
        Io {
            t,
            sub: t.sub_object(self.f),
        }
    }

    /// [`Live::io`] in a wrapper compiled for one layout (`HEAP`): no test.
    #[inline(always)]
    pub(super) fn io_for<const HEAP: bool>(self) -> Io<'a> {
        let t = self.table();
        Io {
            t,
            sub: sub_object_for::<HEAP>(t, self.f),
        }
    }
}

/// A guarded file's table and its wrapped file object (SQLite's pointer, or the heap object),
/// inside one of SQLite's calls on the file or its close: the wrapped file's methods, each
/// callable with arguments that cannot break it. A slot the wrapped table lacks is a stub
/// returning what a missing method means (see [`SubMethods`]). Panic-free: a field read and a
/// call into C (which cannot unwind into Rust) or into a stub that returns a constant.
#[derive(Clone, Copy)]
pub(super) struct Io<'a> {
    pub(super) t: &'a FileTable,
    sub: *mut ffi::sqlite3_file,
}

/// Calls the wrapped file's method `slot` on `io`'s wrapped object. Usable in this file only:
/// it reads `Io`'s private field, so no other room can expand it.
macro_rules! call {
    ($io:expr, $slot:ident $(, $arg:expr)*) => {{
        let io: Io<'_> = $io;
        // SAFETY: the wrapped object is open for the call (`Io` is only made from a live file or
        // one being closed, before its own close), and the slot is its table's method or a stub;
        // each pointer argument is valid for the call (see each caller).
        unsafe { (io.t.sub.$slot)(io.sub $(, $arg)*) }
    }};
}

impl<'a> Io<'a> {
    /// The wrapped object, for what only compares or keeps its address.
    #[inline(always)]
    pub(super) fn sub_ptr(self) -> *mut ffi::sqlite3_file {
        self.sub
    }

    /// The wrapped object, as the main image reads it (the state drops the image before the
    /// file is closed).
    #[inline(always)]
    pub(super) fn main_image(self) -> MainImage {
        MainImage(self.sub)
    }

    #[inline(always)]
    pub(super) fn close(self) -> c_int {
        call!(self, xClose)
    }

    /// `xRead` into our own buffer.
    #[inline(always)]
    pub(super) fn read(self, buf: &mut [u8], ofst: i64) -> c_int {
        let Ok(amt) = c_int::try_from(buf.len()) else {
            return ffi::SQLITE_IOERR_READ;
        };
        // `buf` holds `amt` writable bytes.
        call!(self, xRead, buf.as_mut_ptr().cast(), amt, ofst)
    }

    /// `xRead` into SQLite's buffer.
    #[inline(always)]
    pub(super) fn read_sqlite(self, buf: ReadBuf<'_>, ofst: i64) -> c_int {
        let (buf, amt) = buf.raw();
        call!(self, xRead, buf, amt, ofst)
    }

    /// `xRead` into SQLite's buffer, and the bytes read when it succeeded.
    #[inline(always)]
    pub(super) fn read_sqlite_seen<'b>(
        self,
        buf: ReadBuf<'b>,
        ofst: i64,
    ) -> (c_int, Option<&'b [u8]>) {
        let (buf, amt) = buf.raw();
        let rc = call!(self, xRead, buf, amt, ofst);
        let Ok(len) = usize::try_from(amt) else {
            return (rc, None);
        };
        if rc != ffi::SQLITE_OK {
            return (rc, None);
        }
        // SAFETY: the read succeeded: SQLite's buffer holds `amt` bytes read from the file, its
        // own for the call (`ReadBuf`'s contract).
        let read = unsafe { std::slice::from_raw_parts(buf as *const u8, len) };
        (rc, Some(read))
    }

    /// `xWrite` of our own bytes.
    #[inline(always)]
    pub(super) fn write(self, bytes: &[u8], ofst: i64) -> c_int {
        let Ok(amt) = c_int::try_from(bytes.len()) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        // `bytes` holds `amt` readable bytes.
        call!(self, xWrite, bytes.as_ptr().cast(), amt, ofst)
    }

    /// `xWrite` of SQLite's buffer.
    #[inline(always)]
    pub(super) fn write_sqlite(self, buf: WriteBuf<'_>, ofst: i64) -> c_int {
        let (buf, amt) = buf.raw();
        call!(self, xWrite, buf, amt, ofst)
    }

    #[inline(always)]
    pub(super) fn truncate(self, size: i64) -> c_int {
        call!(self, xTruncate, size)
    }

    #[inline(always)]
    pub(super) fn sync(self, flags: c_int) -> c_int {
        call!(self, xSync, flags)
    }

    #[inline(always)]
    pub(super) fn lock(self, level: c_int) -> c_int {
        call!(self, xLock, level)
    }

    #[inline(always)]
    pub(super) fn unlock(self, level: c_int) -> c_int {
        call!(self, xUnlock, level)
    }

    #[inline(always)]
    pub(super) fn device_characteristics(self) -> c_int {
        call!(self, xDeviceCharacteristics)
    }

    /// `xFileControl` with SQLite's own arguments.
    #[inline(always)]
    pub(super) fn file_control(self, fc: &Fcntl<'_>) -> c_int {
        call!(self, xFileControl, fc.op(), fc.raw())
    }

    /// `SQLITE_FCNTL_LOCK_TIMEOUT`: sets the timeout to `*ms`, and puts the former one there.
    #[inline(always)]
    pub(super) fn lock_timeout(self, ms: &mut c_int) -> c_int {
        // The control's argument is an `int *`: `ms`.
        call!(
            self,
            xFileControl,
            ffi::SQLITE_FCNTL_LOCK_TIMEOUT,
            (ms as *mut c_int).cast()
        )
    }

    /// `xShmMap` into our own out-pointer.
    #[inline(always)]
    pub(super) fn shm_map(
        self,
        region: c_int,
        size: c_int,
        extend: c_int,
        out: &mut *mut c_void,
    ) -> c_int {
        call!(self, xShmMap, region, size, extend, out)
    }

    /// `xShmMap` into SQLite's out-pointer.
    #[inline(always)]
    pub(super) fn shm_map_sqlite(
        self,
        region: c_int,
        size: c_int,
        extend: c_int,
        out: ShmOut<'_>,
    ) -> c_int {
        call!(self, xShmMap, region, size, extend, out.raw())
    }

    #[inline(always)]
    pub(super) fn shm_lock(self, ofst: c_int, n: c_int, flags: c_int) -> c_int {
        call!(self, xShmLock, ofst, n, flags)
    }

    #[inline(always)]
    pub(super) fn shm_unmap(self, delete: c_int) -> c_int {
        call!(self, xShmUnmap, delete)
    }
}

/// Declares the C entry points of io methods whose arguments besides the file are plain values:
/// each makes the [`Live`] file of SQLite's pointer and calls its safe body with the rest.
macro_rules! io_entry {
    ($($(#[$m:meta])* $name:ident $(<$(const $g:ident: $gt:ty),*>)? => $body:path, ($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            $(#[$m])*
            pub(super) unsafe extern "C" fn $name $(<$(const $g: $gt),*>)? (
                f: *mut ffi::sqlite3_file $(, $arg: $ty)*
            ) -> $ret {
                // SAFETY: SQLite calls a guarded file's methods only on that file, open.
                $body(unsafe { Live::new(f) } $(, $arg)*)
            }
        )*
    };
}

/// Declares the pass-through methods: the wrapped file's method called with SQLite's arguments
/// on the wrapped object, nothing else (so no `catch_unwind`: see [`Io`]). Installed where
/// SQLite's pointer is not the wrapped object (the heap layout); in SQLite's buffer these slots
/// are the wrapped VFS's own functions. `x_write` is also a WAL's open gate on the heap.
macro_rules! io_pass_through {
    ($($name:ident => $slot:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            pub(super) unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file $(, $arg: $ty)*) -> $ret {
                // SAFETY: SQLite calls our methods only on our live files.
                let io = unsafe { Live::new(f) }.io();
                call!(io, $slot $(, $arg)*)
            }
        )*
    };
}

io_pass_through! {
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

/// The `xRead` of a guarded main file (`hot::read_main`).
pub(super) unsafe extern "C" fn x_read_main<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files, with `amt` writable bytes at
    // `buf`.
    let (file, buf) = unsafe { (Live::new(f), ReadBuf::new(buf, amt)) };
    hot::read_main::<HEAP>(file, buf, ofst)
}

/// A guarded file's `xWrite` behind its write gate (`hot::gated_write`).
pub(super) unsafe extern "C" fn write_gated(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files, with `amt` readable bytes at
    // `buf`.
    let (file, buf) = unsafe { (Live::new(f), WriteBuf::new(buf, amt)) };
    hot::gated_write(file, buf, ofst)
}

/// The `xWrite` of a WAL while its write gate is open (`hot::wal_write`).
pub(super) unsafe extern "C" fn write_wal(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    ofst: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: as in `write_gated`.
    let (file, buf) = unsafe { (Live::new(f), WriteBuf::new(buf, amt)) };
    hot::wal_write(file, buf, ofst)
}

/// `xShmMap` of a guarded main file (`shm::map`).
pub(super) unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    ffi_guard(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: SQLite calls our methods only on our live files; `pp` is its slot for the
        // region's address.
        let (file, out) = unsafe { (Live::new(f), ShmOut::new(pp)) };
        shm::map(file, region, size, extend, out)
    })
}

/// `xFileControl` of a guarded main file (`controls::file_control_main`).
pub(super) unsafe extern "C" fn x_file_control_main<const HEAP: bool>(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: SQLite calls our methods only on our live files, with the argument `op` takes.
    let (file, fc) = unsafe { (Live::new(f), Fcntl::new(op, arg)) };
    controls::file_control_main::<HEAP>(file, fc)
}

/// `xFileControl` of every other file (`controls::file_control`).
pub(super) unsafe extern "C" fn x_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: as in `x_file_control_main`.
    let (file, fc) = unsafe { (Live::new(f), Fcntl::new(op, arg)) };
    controls::file_control(file, fc)
}

/// A WAL file object's write gate: its table's `xWrite` slot, which SQLite reads at every call.
pub(super) struct WalGateSlot {
    table: *const FileTable,
    open: WriteFn,
}

// SAFETY: the slot is written under the state's mutex from inside the connection's calls, which
// SQLite serialises with its reads of it (see `WalGate`); the table outlives the handle (the
// WAL's `x_close` detaches it before freeing the table).
unsafe impl Send for WalGateSlot {}

impl WalGateSlot {
    /// # Safety
    /// `table` is a WAL's live table, alive until its `x_close`, which detaches the gate first.
    pub(super) unsafe fn new(table: *const FileTable, open: WriteFn) -> WalGateSlot {
        WalGateSlot { table, open }
    }
}

impl WalGate for WalGateSlot {
    fn set_open(&self, open: bool) {
        let slot: WriteFn = if open { self.open } else { write_gated };
        // SAFETY: the table is alive (see Send above) and the slot is only ever written here,
        // one writer at a time, never while SQLite reads it.
        unsafe { (*(*self.table).methods.get()).xWrite = Some(slot) };
    }
}

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

/// The state of a main file object if it is one of ours.
///
/// # Safety
/// `f` is NULL or a live `sqlite3_file`.
pub(super) unsafe fn guard_state(f: *mut ffi::sqlite3_file) -> Option<Arc<ConnectionState>> {
    // SAFETY: as the caller promises.
    unsafe { guarded(f) }.map(|file| file.table().state.clone())?
}

/// `f` as one of the guard's files, if it is one.
///
/// # Safety
/// `f` is NULL or a live `sqlite3_file`, open for `'a`.
pub(super) unsafe fn guarded<'a>(f: *mut ffi::sqlite3_file) -> Option<Live<'a>> {
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
    // SAFETY: `x_close` is only ever installed in FileTables: `f` is one of ours, open for `'a`.
    Some(unsafe { Live::new(f) })
}

impl FileTable {
    /// The state of a guarded main file; `None` for any other file.
    #[inline(always)]
    pub(super) fn main_state(&self) -> Option<&ConnectionState> {
        // SAFETY: `main_state` is NULL or points into `state`'s allocation, which lives as long
        // as this table holds the `Arc` (set once, at the open).
        unsafe { self.main_state.as_ref() }
    }

    /// `sqlite3_uri_boolean` of the filename SQLite opened the file by.
    pub(super) fn uri_boolean(&self, key: &CStr) -> bool {
        // SAFETY: `z_name` is the filename SQLite passed to xOpen, valid until the close, which
        // frees this table; `key` is NUL-terminated.
        unsafe { ffi::sqlite3_uri_boolean(self.z_name, key.as_ptr(), 0) != 0 }
    }
}
