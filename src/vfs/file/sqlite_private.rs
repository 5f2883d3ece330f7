//! Every read of a SQLite-private structure: the leading fields of `unixFile`, `unixShm` and
//! `unixShmNode` (os_unix.c); the wal-index header in the `-shm` (wal.c) is an on-disk format,
//! read in `vfs/main_reads.rs`. Each is checked at
//! run time before it is trusted (the fields that can be known independently, an `fstat` of a
//! descriptor), and keyed to the SQLite versions it was verified against ([`VERIFIED`]).
//!
//! What is read, and why (the wal-index itself is the guard's own mapping, `vfs/wal_index/`):
//! `unixFile`'s `h` (the shield's main-file lock, the frame rule's `pwritev`, the `-shm`'s mode
//! and owner), `lastErrno` (set as `unixWrite` sets it), `pInode`'s `fileId` (the main pin
//! without a `stat`) and `zPath` (a held main file's name); `unixShm` and `unixShmNode`'s
//! `zFilename` and `hShm` only where SQLite's own node maps the wal-index: the process's one
//! check of how SQLite names the `-shm`, and the pin of a build that names it otherwise
//! (`SQLITE_SHM_DIRECTORY`).

/// The SQLite versions the mirrors below were verified against, field by field, in os_unix.c and
/// wal.c: 3.32.0 to 3.54.1 (with every Linux compile option that moves a struct). A running SQLite
/// outside the range is said once at registration ([`check_running_version`]); the mirrors are
/// still checked at every open against what can be known independently ([`unix_prefix`],
/// [`shm_node`]), so a layout that differs turns off what relies on it (the shield, the move of a
/// held main file) rather than being misread.
pub(super) const VERIFIED: std::ops::RangeInclusive<c_int> = 3_032_000..=3_054_001;

/// The self-check keyed to [`VERIFIED`], run once when the guard is registered.
pub(super) fn check_running_version() {
    // SAFETY: returns a constant of the running library.
    let running = unsafe { ffi::sqlite3_libversion_number() };
    if !VERIFIED.contains(&running) {
        log::warn!(
            "hermes-guard: SQLite {} runs here; the guard's mirrors of its private structures \
             were verified against 3.32.0 to 3.54.1: they are checked at every open, and what \
             does not check out is turned off (the lock shield, moving a held main file)",
            crate::vfs::boundary::running_sqlite_version()
        );
    }
}

use std::ffi::{c_char, c_int, c_void};
use std::io;
use std::mem::size_of;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::ffi;

use super::Io;
use crate::capture::ImageSource;
use crate::identity::{identity_of_fd, FileId};
use crate::vfs::boundary::cstr_text;
use crate::vfs::shield;
use crate::vfs::state::ConnectionState;

/// The leading fields of the unix VFS's `unixFile` (sqlite3.c, `struct unixFile`), as far as the
/// lock shield reads them: `h`, the descriptor, and `pShm`. The fields before them are checked
/// against what is known independently (`pMethod`, `pVfs`, `zPath`) before `h` is trusted, and `h`
/// is `fstat`ed against the pinned main file: an extension loaded into a host SQLite whose layout
/// differs turns the shield off instead of locking a wrong descriptor.
#[repr(C)]
pub(super) struct UnixFilePrefix {
    pub(super) p_method: *const ffi::sqlite3_io_methods,
    pub(super) p_vfs: *mut ffi::sqlite3_vfs,
    pub(super) p_inode: *mut c_void,
    pub(super) h: c_int,
    pub(super) e_file_lock: u8,
    pub(super) ctrl_flags: u16,
    pub(super) last_errno: c_int,
    pub(super) locking_context: *mut c_void,
    pub(super) p_preallocated_unused: *mut c_void,
    pub(super) z_path: *const c_char,
    pub(super) p_shm: *const UnixShmPrefix,
}

/// `struct unixShm`: a connection's handle on the process's shared-memory node.
#[repr(C)]
pub(super) struct UnixShmPrefix {
    pub(super) p_shm_node: *const UnixShmNodePrefix,
}

/// The leading fields of `struct unixShmNode`: `pInode` (checked against the file's) and
/// `hShm`, the node's descriptor of the `-shm`, open until the node is purged.
#[repr(C)]
pub(super) struct UnixShmNodePrefix {
    pub(super) p_inode: *mut c_void,
    pub(super) p_shm_mutex: *mut c_void,
    pub(super) z_filename: *mut c_char,
    pub(super) h_shm: c_int,
}

/// The wrapped file object `sub` as a `unixFile`'s leading fields, if it has them: the wrapped
/// VFS's objects are at least that large and the fields that can be checked hold what is known
/// independently (`pMethod` = the table its xOpen installed, `pVfs` = the VFS, `zPath` = the
/// filename SQLite passed).
///
/// # Safety
/// `sub` is a file object just opened by `sub_vfs` from `z_name`, still with the table
/// `sub_table` its xOpen installed.
pub(super) unsafe fn unix_prefix<'a>(
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

/// `struct unixFileId`, the first field of the unix VFS's `struct unixInodeInfo` (what
/// `unixFile.pInode` points at): the `st_dev` and `st_ino` of SQLite's own `fstat` of the
/// descriptor at the open.
#[repr(C)]
struct UnixFileId {
    dev: libc::dev_t,
    ino: u64,
}

/// A main file's `h` and `pInode->fileId` were seen to agree with an `fstat` of `h` in this process
/// ([`main_descriptor`]): the layout holds for this build of SQLite, so later opens take both from
/// SQLite's structures without a syscall.
static INODE_LAYOUT_SEEN: AtomicBool = AtomicBool::new(false);

/// The main file's identity from SQLite's own `fstat` at the open (`pInode->fileId`), once
/// [`INODE_LAYOUT_SEEN`]: what the guard pins the main file to, from the descriptor, without a
/// `stat` of its own. `None` before the layout was seen to hold, or without an inode.
pub(super) fn inode_file_id(prefix: Option<&UnixFilePrefix>) -> Option<FileId> {
    if !INODE_LAYOUT_SEEN.load(Ordering::Acquire) {
        return None;
    }
    read_inode_file_id(prefix?)
}

fn read_inode_file_id(p: &UnixFilePrefix) -> Option<FileId> {
    if p.p_inode.is_null() {
        return None;
    }
    // SAFETY: `pInode` of a checked `unixFile` prefix ([`unix_prefix`]) points at the inode's
    // `unixInodeInfo`, alive while the file is open; `fileId` is its first field, set once when
    // the inode is found and never written again.
    let id = unsafe { ptr::read(p.p_inode as *const UnixFileId) };
    Some(FileId {
        dev: id.dev as u64,
        ino: id.ino,
    })
}

/// The unix VFS's descriptor of a freshly opened main file, verified, for the lock shield; the
/// reason the shield cannot be used otherwise.
///
/// # Safety
/// `sub_vfs` is the wrapped VFS; `prefix` is [`unix_prefix`] of the file object it just opened,
/// whose descriptor is still open.
pub(super) unsafe fn main_descriptor(
    sub_vfs: *mut ffi::sqlite3_vfs,
    prefix: Option<&UnixFilePrefix>,
    state: &ConnectionState,
) -> Result<c_int, ShieldOff> {
    if let Some(reason) = shield::platform_off_reason() {
        return Err(ShieldOff::Platform(reason));
    }
    // SAFETY: the wrapped VFS is registered for the life of the process; its name is a C string.
    let name = unsafe { cstr_text((*sub_vfs).zName) };
    if name.as_deref() != Some("unix") {
        return Err(ShieldOff::NotUnix(name.unwrap_or_else(|| "unnamed".into())));
    }
    let Some(p) = prefix else {
        return Err(ShieldOff::Layout {
            version: crate::vfs::boundary::running_sqlite_version(),
        });
    };
    let Some(pinned) = state.main_id() else {
        return Err(ShieldOff::NotPinned);
    };
    let inode = read_inode_file_id(p);
    let now = if let Some(id) = inode.filter(|_| INODE_LAYOUT_SEEN.load(Ordering::Acquire)) {
        // The layout was seen to hold in this process; `h` is the descriptor whose `fstat` SQLite
        // keeps in `pInode`.
        id
    } else {
        // SAFETY: `h` is the descriptor the unix VFS just opened; it stays open while this call
        // runs.
        let now = identity_of_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(p.h) })
            .map_err(|source| ShieldOff::Fstat { fd: p.h, source })?;
        if inode == Some(now) {
            INODE_LAYOUT_SEEN.store(true, Ordering::Release);
        }
        now
    };
    if now != pinned {
        return Err(ShieldOff::OtherFile {
            fd: p.h,
            now,
            pinned,
        });
    }
    if !state.on_local_filesystem() {
        return Err(ShieldOff::NotLocal);
    }
    Ok(p.h)
}

/// The `-shm` the connection just mapped, from SQLite's own shared-memory node: its descriptor
/// (`hShm`), that descriptor's identity (`fstat`: the same device numbering as every `stat` the
/// guard compares it with, where `/proc/self/maps` numbers a btrfs file by its superblock; none
/// when `known` has it: another guarded connection here maps the node), and
/// the name SQLite opened it by (`zFilename`, bytes as SQLite has them: `<db>-shm`, or a file in
/// the `SQLITE_SHM_DIRECTORY` of such a build). The reason when the node has no `-shm` file
/// (heap memory) or does not have the expected layout.
///
/// # Safety
/// `sub` is the wrapped file object of a live main file checked at its open to have the
/// `unixFile` layout ([`unix_prefix`]), whose `xShmMap` just succeeded.
pub(super) unsafe fn shm_node(
    sub: *mut ffi::sqlite3_file,
    known: impl FnOnce(c_int) -> Option<FileId>,
) -> Result<(c_int, FileId, PathBuf), ShmNodeError> {
    // SAFETY: as the caller promises: `pShm`, its node and the node's `pInode`, `zFilename` and
    // `hShm` are set by xShmMap and stay until xShmUnmap.
    let (node_inode, fd, file_inode, name) = unsafe {
        let p = &*(sub as *const UnixFilePrefix);
        if p.p_shm.is_null() || (*p.p_shm).p_shm_node.is_null() {
            return Err(ShmNodeError::NoNode);
        }
        let node = &*(*p.p_shm).p_shm_node;
        (node.p_inode, node.h_shm, p.p_inode, node.z_filename)
    };
    if node_inode != file_inode || name.is_null() {
        return Err(ShmNodeError::Layout);
    }
    if fd < 0 {
        return Err(ShmNodeError::HeapMemory);
    }
    let id = match known(fd) {
        Some(id) => id,
        // SAFETY: `hShm` is open while the node lives, which it does while this connection maps
        // it.
        None => identity_of_fd(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
            .map_err(|source| ShmNodeError::Fstat { fd, source })?,
    };
    // SAFETY: `zFilename` is the node's NUL-terminated name, alive with the node.
    let bytes = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
    Ok((fd, id, PathBuf::from(std::ffi::OsStr::from_bytes(bytes))))
}

/// Why the lock shield cannot use the unix VFS's descriptor of a main file ([`main_descriptor`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShieldOff {
    /// This build cannot take OFD locks.
    #[error("{0}")]
    Platform(&'static str),
    /// The wrapped VFS is another (its name, or "unnamed").
    #[error("the VFS below the guard is {0}, not the unix VFS")]
    NotUnix(String),
    /// The file object does not have the `unixFile` layout of the running SQLite.
    #[error(
        "the unix VFS's file object does not have the layout of SQLite {version} (its size, \
         pMethod, pVfs or zPath differ)"
    )]
    Layout { version: String },
    #[error("the main file is not pinned")]
    NotPinned,
    #[error("fstat of SQLite's descriptor {fd} failed: {source}")]
    Fstat { fd: c_int, source: io::Error },
    /// SQLite's descriptor is another file than the one pinned.
    #[error("SQLite's descriptor {fd} is {now}, not the pinned main file {pinned}")]
    OtherFile {
        fd: c_int,
        now: FileId,
        pinned: FileId,
    },
    #[error("the database is not on a local filesystem")]
    NotLocal,
}

/// Why SQLite's own shared-memory node of a file cannot be read ([`shm_node`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum ShmNodeError {
    #[error("the file does not have the layout of SQLite's unix VFS")]
    NotUnix,
    #[error("the unix VFS's file has no shared-memory node after xShmMap")]
    NoNode,
    #[error("the unix VFS's shared-memory node does not have the expected layout")]
    Layout,
    #[error("the shared memory has no -shm file (heap memory)")]
    HeapMemory,
    #[error("fstat of SQLite's -shm descriptor {fd} failed: {source}")]
    Fstat { fd: c_int, source: io::Error },
}

/// A `unixFile`'s descriptor (`h`).
///
/// # Safety
/// `sub` is a live file object that starts as a `unixFile` (checked at its open:
/// [`unix_prefix`]).
pub(super) unsafe fn unix_descriptor(sub: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as the caller promises.
    unsafe { (*(sub as *const UnixFilePrefix)).h }
}

/// Sets a `unixFile`'s `lastErrno`, as the unix VFS's `unixWrite` does after a write.
///
/// # Safety
/// As for [`unix_descriptor`]; SQLite is inside a call on this file (it serialises them).
pub(super) unsafe fn set_last_errno(sub: *mut ffi::sqlite3_file, errno: c_int) {
    // SAFETY: as the caller promises.
    unsafe { (*(sub as *mut UnixFilePrefix)).last_errno = errno };
}

impl<'a> Io<'a> {
    /// SQLite's descriptor of the wrapped file (`unixFile.h`) when it has the `unixFile` layout
    /// (checked at its open).
    #[inline(always)]
    pub(super) fn unix_descriptor(self) -> Option<c_int> {
        if !self.t.unix_prefix {
            return None;
        }
        // SAFETY: the wrapped object is live for the call and starts as a `unixFile` (checked at
        // its open: `unix_prefix`).
        Some(unsafe { unix_descriptor(self.sub_ptr()) })
    }

    /// [`Io::unix_descriptor`], borrowed: SQLite keeps it open while the file is.
    #[inline(always)]
    pub(super) fn unix_fd(self) -> Option<BorrowedFd<'a>> {
        let fd = self.unix_descriptor()?;
        // SAFETY: the unix VFS's descriptor of the file, open until the file's close, which
        // cannot come while SQLite is inside a call on it (`'a`).
        Some(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Sets the wrapped `unixFile`'s `lastErrno`, as the unix VFS's `unixWrite` does after a
    /// write; nothing for a file of another layout.
    #[inline(always)]
    pub(super) fn set_last_errno(self, errno: c_int) {
        if self.t.unix_prefix {
            // SAFETY: as in `unix_descriptor`; SQLite is inside a call on this file (it
            // serialises them).
            unsafe { set_last_errno(self.sub_ptr(), errno) };
        }
    }

    /// [`shm_node`] of the wrapped file, which must have the `unixFile` layout.
    pub(super) fn shm_node(
        self,
        known: impl FnOnce(c_int) -> Option<FileId>,
    ) -> Result<(c_int, FileId, PathBuf), ShmNodeError> {
        if !self.t.unix_prefix {
            return Err(ShmNodeError::NotUnix);
        }
        // SAFETY: a live `unixFile` (checked at its open); its `pShm` is NULL or its node, set by
        // its xShmMap and cleared by its xShmUnmap.
        unsafe { shm_node(self.sub_ptr(), known) }
    }

    /// The main file's mode and owner, read with an `fstat` of SQLite's descriptor when the
    /// closure is called (inside the `xShmMap` that asks for it, while SQLite holds the file
    /// open); `None` for a file without the `unixFile` layout.
    pub(super) fn mode_and_owner(self) -> Option<crate::vfs::wal_index::ModeAndOwner> {
        let fd = self.unix_descriptor()?;
        Some(Box::new(move || {
            // SAFETY: borrowed for the one `fstat`, made inside this `xShmMap`, while SQLite
            // holds the main file open.
            let main = unsafe { BorrowedFd::borrow_raw(fd) };
            let st = rustix::fs::fstat(main).map_err(|_| ffi::SQLITE_IOERR_FSTAT)?;
            Ok((st.st_mode & 0o777, (st.st_uid, st.st_gid)))
        }))
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
        // drops this reader before the file is closed (`ConnectionState::main_released`, and the
        // WAL's writes that use it happen only while the connection has the main file open).
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
