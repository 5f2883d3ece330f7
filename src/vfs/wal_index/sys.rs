//! The system calls of the guard's wal-index node: open-file-description locks, the mapping,
//! the one-byte writes that grow the `-shm`, its truncation at the dead-man switch. Every
//! `unsafe` of the node is here; the rest of the module is safe code over these. Every byte-range
//! lock of the shim is taken or asked about here too (the lock shield's, `in_use.rs`'s probe).

use std::ffi::{c_int, CStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The lock kinds of `struct flock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::vfs) enum Kind {
    Read,
    Write,
    Unlock,
}

impl Kind {
    fn raw(self) -> libc::c_short {
        (match self {
            Kind::Read => libc::F_RDLCK,
            Kind::Write => libc::F_WRLCK,
            Kind::Unlock => libc::F_UNLCK,
        }) as libc::c_short
    }
}

/// Who holds a lock in the way, as `F_OFD_GETLK` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::vfs) enum Holder {
    /// Nobody: the lock asked about could be taken.
    Nobody,
    /// A read lock is in the way; `pid` is the owner's for a POSIX lock, -1 for an OFD lock.
    Reader { pid: i32 },
    /// A write lock is in the way.
    Writer { pid: i32 },
}

fn flock(kind: Kind, start: i64, len: i64) -> libc::flock {
    // SAFETY: `flock` is plain old data; every field the calls read is set below (`l_pid` must be
    // 0 for OFD locks: zeroed).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind.raw();
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = start as _;
    fl.l_len = len as _;
    fl
}

/// The byte-range lock commands of `fcntl`, each of which takes a `struct flock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::vfs) enum LockCmd {
    /// `F_OFD_SETLK`: a non-blocking lock change of the open file description.
    OfdSet,
    /// `F_OFD_GETLK`: the lock in the way, written into the `flock`.
    OfdGet,
    /// `F_SETLK`: a non-blocking POSIX lock change (owned by the process), as a stock SQLite
    /// connection takes its locks: for tests that play one.
    #[cfg(test)]
    PosixSet,
}

/// `fcntl(fd, cmd, fl)`: the one call of the shim that takes or asks about a byte-range lock.
pub(in crate::vfs) fn fcntl_flock(fd: RawFd, cmd: LockCmd, fl: &mut libc::flock) -> io::Result<()> {
    let cmd = match cmd {
        LockCmd::OfdSet => libc::F_OFD_SETLK,
        LockCmd::OfdGet => libc::F_OFD_GETLK,
        #[cfg(test)]
        LockCmd::PosixSet => libc::F_SETLK,
    };
    // SAFETY: each of these commands takes a pointer to a `struct flock`, which `fl` is and which
    // outlives the call (F_OFD_GETLK writes into it); a descriptor that is not open fails with
    // EBADF and touches no memory.
    let rc = unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A non-blocking OFD lock change of `len` bytes at `start` on `fd`'s open file description.
/// `Err` with `EAGAIN`/`EACCES` when another holder is in the way.
pub(in crate::vfs) fn set_lock(fd: RawFd, kind: Kind, start: i64, len: i64) -> io::Result<()> {
    fcntl_flock(fd, LockCmd::OfdSet, &mut flock(kind, start, len))
}

/// Who holds a lock that would keep `kind` over `len` bytes at `start` from `fd`'s description
/// (its own locks never count).
pub(in crate::vfs) fn holder(fd: RawFd, kind: Kind, start: i64, len: i64) -> io::Result<Holder> {
    let mut fl = flock(kind, start, len);
    fcntl_flock(fd, LockCmd::OfdGet, &mut fl)?;
    let pid = fl.l_pid;
    Ok(match fl.l_type as c_int {
        libc::F_UNLCK => Holder::Nobody,
        libc::F_RDLCK => Holder::Reader { pid },
        _ => Holder::Writer { pid },
    })
}

/// Opens `path` as SQLite's `robust_open` does for a `-shm`: `O_NOFOLLOW | O_CLOEXEC`, created
/// with `mode` where `create`, retried on `EINTR`, never as descriptor 0, 1 or 2 (a stray write
/// to standard output must not land in the wal-index).
pub(super) fn open(path: &CStr, write: bool, mode: u32) -> io::Result<OwnedFd> {
    let flags = libc::O_NOFOLLOW
        | libc::O_CLOEXEC
        | if write {
            libc::O_RDWR | libc::O_CREAT
        } else {
            libc::O_RDONLY
        };
    loop {
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: a descriptor just opened, owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        if fd > 2 {
            return Ok(owned);
        }
        // Moved above 2, and `/dev/null` put in the low descriptor's place, as `robust_open`
        // does.
        // SAFETY: duplicating a descriptor we own.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a NUL-terminated literal; `dup2` over the low descriptor we own (its
        // description stays referenced by `high`).
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            if null >= 0 {
                libc::dup2(null, fd);
                libc::close(null);
            }
        }
        std::mem::forget(owned);
        // SAFETY: a descriptor just made by F_DUPFD_CLOEXEC, owned by nobody else.
        return Ok(unsafe { OwnedFd::from_raw_fd(high) });
    }
}

/// Creates `path`, which must not exist (`O_EXCL`), read-write with `mode`.
pub(super) fn open_new(path: &CStr, mode: u32) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    loop {
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let fd = unsafe { libc::open(path.as_ptr(), flags, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: a descriptor just opened, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Writes one zero byte at `offset` (SQLite grows a `-shm` this way: no `ftruncate`, so that the
/// pages are allocated and a mapping of them cannot fault).
pub(super) fn write_zero_byte(fd: &OwnedFd, offset: i64) -> io::Result<()> {
    let byte = [0u8; 1];
    loop {
        // SAFETY: one byte from a live buffer, written to a descriptor we own.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), byte.as_ptr().cast(), 1, offset as _) };
        match n {
            1 => return Ok(()),
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            n if n < 0 => return Err(io::Error::last_os_error()),
            _ => return Err(io::Error::other("a one-byte write wrote nothing")),
        }
    }
}

/// `ftruncate(fd, len)`, retried on `EINTR`.
pub(super) fn truncate(fd: &OwnedFd, len: u64) -> io::Result<()> {
    loop {
        match rustix::fs::ftruncate(fd, len) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// A shared mapping of a `-shm`, made by [`map`] and unmapped by [`Mapping::unmap`] only. Its
/// address is handed out as a number (to SQLite, to the state's reads of region 0): whoever
/// reads or writes through it does so in `unsafe` code of its own that relies on the mapping
/// being alive, which its owner (the node) guarantees until its last connection unmaps it.
pub(super) struct Mapping {
    addr: usize,
    len: usize,
    /// Mapped read-only: never written through (the tests' writes check it).
    #[cfg_attr(not(test), allow(dead_code))]
    readonly: bool,
}

impl Mapping {
    /// Its first byte's address.
    pub(super) fn addr(&self) -> usize {
        self.addr
    }

    /// Unmaps it.
    pub(super) fn unmap(self) {
        // SAFETY: a mapping `map` made, unmapped once (this consumes it); no Rust reference
        // points into it (its address is only ever a number here).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }

    /// Whether the 4 bytes at `addr` lie inside it, aligned for a `u32`.
    #[cfg(test)]
    fn holds_word(&self, addr: usize) -> bool {
        addr >= self.addr && addr + 4 <= self.addr + self.len && addr.is_multiple_of(4)
    }

    /// The `u32` at `addr` (in it: else `None`), read as SQLite reads the wal-index.
    #[cfg(test)]
    pub(super) fn read_u32(&self, addr: usize) -> Option<u32> {
        if !self.holds_word(addr) {
            return None;
        }
        // SAFETY: inside this live, readable mapping and aligned (checked).
        Some(unsafe { std::ptr::read_volatile(addr as *const u32) })
    }

    /// Writes `value` at `addr` (in it, and writable: else `false`).
    #[cfg(test)]
    pub(super) fn write_u32(&self, addr: usize, value: u32) -> bool {
        if self.readonly || !self.holds_word(addr) {
            return false;
        }
        // SAFETY: inside this live, writable mapping and aligned (checked).
        unsafe { std::ptr::write_volatile(addr as *mut u32, value) };
        true
    }
}

/// A shared mapping of `len` bytes of `fd` from `offset`, writable unless `readonly`.
pub(super) fn map(fd: &OwnedFd, len: usize, offset: i64, readonly: bool) -> io::Result<Mapping> {
    let prot = if readonly {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_WRITE
    };
    // SAFETY: a fresh shared mapping chosen by the kernel; nothing else refers to it yet.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(Mapping {
            addr: addr as usize,
            len,
            readonly,
        })
    }
}

/// The system's page size.
pub(in crate::vfs) fn page_size() -> usize {
    super::super::locked_fds::page_size()
}
