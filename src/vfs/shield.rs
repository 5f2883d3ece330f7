//! The lock shield: open-file-description locks beside SQLite's own POSIX locks, so that a stray
//! `close()` of the database file elsewhere in the process — which drops every POSIX lock the
//! process holds on that inode — cannot make this connection look absent to other processes.
//!
//! One read lock taken with `F_OFD_SETLK` on SQLite's **own** descriptor (never on one of ours,
//! whose close would itself drop the process's POSIX locks): the main file's SHARED range
//! (`SHARED_FIRST`, `SHARED_SIZE` bytes), on the connection's `unixFile.h`, while the connection
//! is in WAL mode (its `-shm` mapped) and holds SHARED, RESERVED or PENDING. Another process's
//! EXCLUSIVE (a write lock on that range: the close-time checkpoint that deletes the WAL, a
//! journal-mode switch, VACUUM in rollback mode) is then refused as long as this connection
//! lives, as SQLite's own SHARED lock would. (The `-shm`'s locks, the dead-man switch among them,
//! are OFD locks of the guard's own wal-index node: `wal_index/`.)
//!
//! OFD locks conflict with the process's own POSIX locks, so the shield steps aside exactly where
//! SQLite asks for a conflicting one: before this connection's `xLock(EXCLUSIVE)` (a write lock on
//! the SHARED range) the lock is released, and it is taken back when the connection returns to
//! SHARED or the attempt fails. It goes at the unmap and at the close.
//!
//! Safe code: the `fcntl` itself is the wal-index's (`wal_index/sys.rs`).

use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

use parking_lot::Mutex;

use super::fork::Origin;
use super::locked_fds;

/// `PENDING_BYTE` of the unix VFS (sqlite3.c): 0x40000000, the byte after the first GiB.
const PENDING_BYTE: i64 = 0x4000_0000;
/// `SHARED_FIRST = PENDING_BYTE + 2` (after the PENDING and RESERVED bytes).
pub(super) const SHARED_FIRST: i64 = PENDING_BYTE + 2;
/// `SHARED_SIZE`: the range readers lock for reading and EXCLUSIVE locks for writing.
pub(super) const SHARED_SIZE: i64 = 510;
/// `UNIX_SHM_DMS`: the `-shm`'s dead-man switch (`UNIX_SHM_BASE` 120 + `SQLITE_SHM_NLOCK` 8).
pub(super) const UNIX_SHM_DMS: i64 = 128;

/// SQLite's lock levels (`SQLITE_LOCK_*`).
const LOCK_NONE: u8 = 0;
const LOCK_SHARED: u8 = 1;
const LOCK_PENDING: u8 = 3;

/// 64-bit Linux only: on a 32-bit target the `F_OFD_*` commands want a `struct flock64` through
/// `fcntl64`, which the `libc` crate's `fcntl` with a `struct flock` does not give on every libc;
/// the shield stays off there (as docs/architecture.md says) rather than lock the wrong range.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::ffi::c_int;
    use std::io;

    use crate::vfs::wal_index::sys::{set_lock, Kind};

    pub(super) const SUPPORTED: bool = true;

    /// A non-blocking OFD read lock (`lock`) or unlock of `len` bytes at `start` on `fd`'s open
    /// file description.
    pub(super) fn ofd_read_lock(fd: c_int, lock: bool, start: i64, len: i64) -> io::Result<()> {
        let kind = if lock { Kind::Read } else { Kind::Unlock };
        set_lock(fd, kind, start, len)
    }
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
mod sys {
    use std::ffi::c_int;
    use std::io;

    pub(super) const SUPPORTED: bool = false;

    pub(super) fn ofd_read_lock(_: c_int, _: bool, _: i64, _: i64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// An OFD read lock or unlock (see `sys::ofd_read_lock`), only in the process that armed the
/// shield (`origin`, one `getpid` beside the `fcntl`): a child's lock change would be made on
/// the description it shares with its parent. A descriptor is listed for the atfork handler
/// before its lock is taken and unlisted once it is released ([`locked_fds`]).
fn ofd_read_lock(origin: &Origin, fd: c_int, lock: bool, start: i64, len: i64) -> io::Result<()> {
    if !origin.current() {
        return Err(io::Error::other(
            "this process is a fork of the one that armed the shield: the locks are the parent's",
        ));
    }
    if lock && !locked_fds::register(fd) {
        return Err(io::Error::other(
            "too many descriptors under the shield in this process to track across fork",
        ));
    }
    let result = sys::ofd_read_lock(fd, lock, start, len);
    if !lock && result.is_ok() {
        locked_fds::unregister(fd);
    }
    result
}

/// Whether this build can take OFD locks at all; the reason when not.
pub(super) fn platform_off_reason() -> Option<&'static str> {
    (!sys::SUPPORTED).then_some(
        "the lock shield needs 64-bit Linux (open-file-description locks with a 64-bit struct \
         flock)",
    )
}

/// The shield of one connection (one main file object).
pub(crate) struct Shield {
    /// The process that opened the connection: in a forked child the shield does nothing (its
    /// locks are the parent's; see `locked_fds.rs`) and reports itself off.
    origin: Origin,
    /// `None` while the shield may be used; the reason when it is off for this connection.
    off: Mutex<Option<String>>,
    /// The main file's descriptor (SQLite's `unixFile.h`, verified), or -1.
    main_fd: AtomicI32,
    /// The connection's lock level on the main file, as SQLite last set it (`SQLITE_LOCK_*`).
    level: AtomicU8,
    /// Inside `xLock(EXCLUSIVE)`: stepping aside.
    attempting: AtomicBool,
    /// The OFD read lock on the main file's SHARED range is held.
    main_held: AtomicBool,
    /// The connection maps the shared memory (WAL mode).
    joined: AtomicBool,
}

impl Shield {
    /// A shield that is off until [`Shield::arm`] says otherwise.
    pub(crate) fn new() -> Shield {
        Shield {
            origin: Origin::here(),
            off: Mutex::new(Some(
                "the main file's descriptor is not verified yet".into(),
            )),
            main_fd: AtomicI32::new(-1),
            level: AtomicU8::new(LOCK_NONE),
            attempting: AtomicBool::new(false),
            main_held: AtomicBool::new(false),
            joined: AtomicBool::new(false),
        }
    }

    /// Arms the shield on SQLite's verified main descriptor, or turns it off for this connection
    /// (logged at WARN with the reason; detection goes on as before).
    pub(crate) fn arm(
        &self,
        main: Result<c_int, impl std::fmt::Display>,
        database: &std::path::Path,
    ) {
        let failures = locked_fds::take_detach_failures();
        if failures > 0 {
            log::warn!(
                "hermes-guard: lock shield: this process was forked while its parent held shield \
                 locks on {failures} descriptor(s) that could not be opened again for the child: \
                 those locks stay shared with the parent until both have closed the file"
            );
        }
        match main {
            Ok(fd) => {
                self.main_fd.store(fd, Ordering::Release);
                *self.off.lock() = None;
            }
            Err(reason) => {
                log::warn!(
                    "hermes-guard: lock shield off for {}: {reason}; a stray close of the file \
                     elsewhere in this process can drop this connection's locks",
                    database.display()
                );
                *self.off.lock() = Some(reason.to_string());
            }
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.main_fd.load(Ordering::Acquire) >= 0 && !self.inherited()
    }

    /// This shield was armed by the parent of this process (a forked child holds a copy of the
    /// connection): it does nothing here. One load (see [`Origin::current_cheap`]); the pid is
    /// compared too before any lock is changed ([`ofd_read_lock`]).
    #[inline]
    fn inherited(&self) -> bool {
        !self.origin.current_cheap()
    }

    /// Whether the shield has anything to do at a lock change: the connection maps the shared
    /// memory or holds a shield lock. Atomics only (panic-free): rollback-mode transactions,
    /// which lock and unlock the main file each time, pay two loads.
    #[inline]
    pub(crate) fn engaged(&self) -> bool {
        self.joined.load(Ordering::Acquire) || self.main_held.load(Ordering::Acquire)
    }

    /// SQLite's lock level changed to `level` (a granted `xLock`, or an `xUnlock`). Panic-free.
    #[inline]
    pub(crate) fn set_level(&self, level: c_int) {
        self.level.store(level.clamp(0, 4) as u8, Ordering::Release);
    }

    /// The connection holds SHARED or more on the main file, in this process (not a forked
    /// child's copy of its parent's connection).
    pub(crate) fn holds_shared_here(&self) -> bool {
        !self.inherited() && self.level.load(Ordering::Acquire) >= LOCK_SHARED
    }

    /// Before `xLock(EXCLUSIVE)`: step aside (release both locks of this connection).
    pub(crate) fn before_exclusive(&self) {
        self.attempting.store(true, Ordering::Release);
        self.reconcile();
    }

    /// After `xLock(EXCLUSIVE)` (granted or not): take back what the new level allows.
    pub(crate) fn after_exclusive(&self) {
        self.attempting.store(false, Ordering::Release);
        self.reconcile();
    }

    /// The connection mapped its shared memory (WAL mode): the main lock may be held.
    pub(crate) fn shm_mapped(&self) {
        if !self.enabled() {
            return;
        }
        self.joined.store(true, Ordering::Release);
        self.reconcile();
    }

    /// The connection is about to unmap its shared memory (a close, or a switch out of WAL
    /// mode): the main lock goes.
    pub(crate) fn shm_unmapping(&self) {
        if self.inherited() {
            return;
        }
        self.joined.store(false, Ordering::Release);
        self.reconcile();
    }

    /// The main file is closing: nothing of the shield may outlive SQLite's descriptor (the unix
    /// VFS may keep it open, deferred, and hand it to a later connection).
    pub(crate) fn close(&self) {
        self.level.store(LOCK_NONE, Ordering::Release);
        self.release_all();
    }

    fn release_all(&self) {
        self.shm_unmapping();
    }

    /// Brings the held locks in line with the connection's state.
    pub(crate) fn reconcile(&self) {
        if self.inherited() {
            return;
        }
        let level = self.level.load(Ordering::Acquire);
        let attempting = self.attempting.load(Ordering::Acquire);
        let fd = self.main_fd.load(Ordering::Acquire);
        let want_main = fd >= 0
            && self.joined.load(Ordering::Acquire)
            && (LOCK_SHARED..=LOCK_PENDING).contains(&level)
            && !attempting;
        let held = self.main_held.load(Ordering::Acquire);
        if want_main != held {
            // A release uses the descriptor the lock was taken on: main_fd is only cleared by
            // `disable`, after which nothing is wanted and the descriptor is still SQLite's.
            match ofd_read_lock(&self.origin, fd, want_main, SHARED_FIRST, SHARED_SIZE) {
                Ok(()) => self.main_held.store(want_main, Ordering::Release),
                Err(e) if want_main && e.raw_os_error() == Some(22) => {
                    // EINVAL: a kernel without F_OFD_SETLK (before Linux 3.15).
                    self.off_for_good(format!("the kernel refused F_OFD_SETLK: {e}"));
                }
                Err(e) => log::warn!(
                    "hermes-guard: lock shield: cannot {} the read lock on the main file's \
                     SHARED range: {e}; retried at the next lock change",
                    if want_main { "take" } else { "release" }
                ),
            }
        }
    }

    fn off_for_good(&self, reason: String) {
        log::warn!("hermes-guard: lock shield off: {reason}");
        *self.off.lock() = Some(reason);
        self.main_fd.store(-1, Ordering::Release);
    }

    /// `(main lock held, reason the shield is off)`, for the status.
    pub(crate) fn status(&self) -> (bool, Option<String>) {
        if self.inherited() {
            return (
                false,
                Some(
                    "this connection was inherited across fork: the shield's locks are the \
                     parent's, and this process holds none"
                        .into(),
                ),
            );
        }
        (
            self.main_held.load(Ordering::Acquire),
            self.off.lock().clone(),
        )
    }
}
