//! Where the wrapped file object lives: in SQLite's buffer (the unix family) or on the heap
//! (any other VFS), and moving a held main file out of SQLite's buffer at its close.

use std::alloc::{self, Layout};
use std::ffi::{c_int, CStr, CString};
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::ffi;

use super::*;

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

/// Closes the wrapped file object `sub` (on the heap when `heap` is given: freed too).
pub(super) fn close_sub(
    t: &FileTable,
    sub: *mut ffi::sqlite3_file,
    heap: Option<HeapFile>,
) -> c_int {
    match heap {
        Some(h) => h.close(),
        None => sub_call!(t, sub, xClose),
    }
}
