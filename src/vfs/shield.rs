//! The lock shield (issue #12): open-file-description locks beside SQLite's own POSIX locks, so
//! that a stray `close()` of the database file elsewhere in the process — which drops every POSIX
//! lock the process holds on that inode — cannot make this connection look absent to other
//! processes.
//!
//! Two locks, both read locks taken with `F_OFD_SETLK` on SQLite's **own** descriptors (never on
//! one of ours, whose close would itself drop the process's POSIX locks):
//!
//! - the main file's SHARED range (`SHARED_FIRST`, `SHARED_SIZE` bytes), on the connection's
//!   `unixFile.h`, while the connection is in WAL mode (its `-shm` mapped) and holds SHARED,
//!   RESERVED or PENDING. Another process's EXCLUSIVE (a write lock on that range: the
//!   close-time checkpoint that deletes the WAL, a journal-mode switch, VACUUM in rollback mode)
//!   is then refused as long as this connection lives, as SQLite's own SHARED lock would.
//! - the `-shm` dead-man-switch byte (`UNIX_SHM_DMS`), on the shared-memory node's `hShm`, while
//!   the node is mapped by a guarded connection of the process (counted across connections: the
//!   node and its descriptor are shared). Another process then sees the shared memory in use and
//!   neither truncates it at its open nor treats its own close as the last.
//!
//! OFD locks conflict with the process's own POSIX locks, so the shield steps aside exactly where
//! SQLite asks for a conflicting one: before this connection's `xLock(EXCLUSIVE)` (a write lock on
//! the SHARED range, after `unixIsSharingShmNode` asks with `F_GETLK` whether anybody else holds
//! the DMS byte) both are released, and they are taken back when the connection returns to SHARED
//! or the attempt fails. The DMS lock goes before the last guarded connection of the node unmaps
//! it (which may unlink the `-shm`), the main lock at the unmap and at the close.
//!
//! Safe API; the one `unsafe` is the `fcntl` call itself (through the `libc` crate).

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

use parking_lot::Mutex;

use super::fork::Origin;
use super::locked_fds;
use crate::identity::FileId;

/// `PENDING_BYTE` of the unix VFS (sqlite3.c): 0x40000000, the byte after the first GiB.
const PENDING_BYTE: i64 = 0x4000_0000;
/// `SHARED_FIRST = PENDING_BYTE + 2` (after the PENDING and RESERVED bytes).
pub(super) const SHARED_FIRST: i64 = PENDING_BYTE + 2;
/// `SHARED_SIZE`: the range readers lock for reading and EXCLUSIVE locks for writing.
pub(super) const SHARED_SIZE: i64 = 510;
/// `SQLITE_SHM_NLOCK`: the shared-memory lock slots.
const SHM_NLOCK: i64 = 8;
/// `UNIX_SHM_BASE = (22 + SQLITE_SHM_NLOCK) * 4` = 120: the first shared-memory lock byte.
const UNIX_SHM_BASE: i64 = (22 + SHM_NLOCK) * 4;
/// `UNIX_SHM_DMS = UNIX_SHM_BASE + SQLITE_SHM_NLOCK` = 128: the dead-man switch.
pub(super) const UNIX_SHM_DMS: i64 = UNIX_SHM_BASE + SHM_NLOCK;

/// SQLite's lock levels (`SQLITE_LOCK_*`).
const LOCK_NONE: u8 = 0;
const LOCK_SHARED: u8 = 1;
const LOCK_PENDING: u8 = 3;
const LOCK_EXCLUSIVE: u8 = 4;

/// 64-bit Linux only: on a 32-bit target the `F_OFD_*` commands want a `struct flock64` through
/// `fcntl64`, which the `libc` crate's `fcntl` with a `struct flock` does not give on every libc;
/// the shield stays off there (as docs/architecture.md says) rather than lock the wrong range.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod sys {
    use std::ffi::c_int;
    use std::io;

    pub(super) const SUPPORTED: bool = true;

    /// A non-blocking OFD read lock (`lock`) or unlock of `len` bytes at `start` on `fd`'s open
    /// file description.
    pub(super) fn ofd_read_lock(fd: c_int, lock: bool, start: i64, len: i64) -> io::Result<()> {
        // SAFETY: `flock` is plain old data; every field the call reads is set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = if lock { libc::F_RDLCK } else { libc::F_UNLCK } as _;
        fl.l_whence = libc::SEEK_SET as _;
        fl.l_start = start as _;
        fl.l_len = len as _;
        // Must be 0 for OFD locks (zeroed above).
        fl.l_pid = 0;
        // SAFETY: F_OFD_SETLK takes a pointer to a `struct flock`, which `fl` is and which
        // outlives the call. A descriptor that is not open makes the call fail with EBADF; it
        // cannot touch memory.
        let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut fl as *mut libc::flock) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
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

/// One shared-memory node of the unix VFS in this process, as the shield counts it: keyed by its
/// descriptor and the `-shm` inode behind it (a descriptor number is reused only after the node
/// closed it, and every guarded connection leaves its node before that).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct NodeKey {
    fd: c_int,
    id: FileId,
}

#[derive(Default)]
struct Node {
    /// Guarded connections that mapped the node.
    refs: u32,
    /// Of those, the ones stepping aside (an EXCLUSIVE attempt, or EXCLUSIVE held).
    suspended: u32,
    /// The OFD read lock on the DMS byte is held.
    locked: bool,
}

static NODES: Mutex<Option<HashMap<NodeKey, Node>>> = Mutex::new(None);

/// Takes or releases a node's DMS lock so that it is held exactly while some guarded connection
/// maps the node and none is stepping aside. Drops the entry once nobody maps it.
fn sync_node(map: &mut HashMap<NodeKey, Node>, key: NodeKey, origin: &Origin) {
    let Some(node) = map.get_mut(&key) else {
        return;
    };
    let want = node.refs > 0 && node.suspended == 0;
    if want != node.locked {
        match ofd_read_lock(origin, key.fd, want, UNIX_SHM_DMS, 1) {
            Ok(()) => node.locked = want,
            Err(e) if want => log::warn!(
                "hermes-guard: lock shield: cannot take the read lock on the -shm ({}) dead-man \
                 switch: {e}; retried at the next lock change",
                key.id
            ),
            Err(e) => {
                log::warn!(
                    "hermes-guard: lock shield: cannot release the read lock on the -shm ({}) \
                     dead-man switch: {e}",
                    key.id
                );
            }
        }
    }
    if node.refs == 0 {
        // Nobody guarded maps it: its mappings may go with the next unmap.
        locked_fds::forget_regions(key.fd);
        if !node.locked {
            map.remove(&key);
        }
    }
}

/// This connection's place in a node.
struct Joined {
    key: NodeKey,
    /// This connection counts in the node's `suspended`.
    suspending: bool,
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
    /// The connection maps the shared memory (WAL mode) and counts in its node.
    joined: AtomicBool,
    node: Mutex<Option<Joined>>,
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
            node: Mutex::new(None),
        }
    }

    /// Arms the shield on SQLite's verified main descriptor, or turns it off for this connection
    /// (logged at WARN with the reason; detection goes on as before).
    pub(crate) fn arm(&self, main: Result<c_int, String>, database: &std::path::Path) {
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
                *self.off.lock() = Some(reason);
            }
        }
    }

    /// Turns the shield off for this connection from now on (releasing what it holds).
    pub(crate) fn disable(&self, reason: String, database: &std::path::Path) {
        log::warn!(
            "hermes-guard: lock shield off for {}: {reason}; a stray close of the file elsewhere \
             in this process can drop this connection's locks",
            database.display()
        );
        self.release_all();
        *self.off.lock() = Some(reason);
        self.main_fd.store(-1, Ordering::Release);
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

    /// The node this connection maps, as joined: its descriptor and the `-shm` behind it.
    pub(crate) fn joined_node(&self) -> Option<(c_int, FileId)> {
        self.node.lock().as_ref().map(|j| (j.key.fd, j.key.id))
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

    /// The connection mapped its shared memory, whose node's descriptor (SQLite's `hShm`,
    /// verified against the pinned `-shm`) is `fd`.
    pub(crate) fn join_shm(&self, fd: c_int, id: FileId, region0: Option<(usize, usize)>) {
        if !self.enabled() {
            return;
        }
        // Listed before the node's lock can be taken (see `locked_fds.rs`).
        if let Some((addr, len)) = region0 {
            if !locked_fds::map_region(fd, addr, len, 0) {
                self.off_for_good(
                    "too many shared-memory regions under the shield in this process to track \
                     across fork"
                        .into(),
                );
                return;
            }
        }
        {
            let mut node = self.node.lock();
            if node.is_none() {
                let key = NodeKey { fd, id };
                let mut map = NODES.lock();
                let map = map.get_or_insert_with(HashMap::new);
                map.entry(key).or_default().refs += 1;
                *node = Some(Joined {
                    key,
                    suspending: false,
                });
                sync_node(map, key, &self.origin);
            }
        }
        self.joined.store(true, Ordering::Release);
        self.reconcile();
    }

    /// The connection mapped region `region` (`size` bytes) of its shared memory at `addr`: listed
    /// so that a forked child maps it from a description of its own (see `locked_fds.rs`). Where
    /// the list is full, the shield is off for this connection.
    pub(crate) fn mapped_region(
        &self,
        region: c_int,
        size: c_int,
        addr: usize,
        database: &std::path::Path,
    ) {
        if self.inherited() {
            return;
        }
        let fd = match self.node.lock().as_ref() {
            Some(joined) => joined.key.fd,
            None => return,
        };
        let offset = region.max(0) as usize * size.max(0) as usize;
        if !locked_fds::map_region(fd, addr, size.max(0) as usize, offset) {
            self.disable(
                "too many shared-memory regions under the shield in this process to track \
                 across fork"
                    .into(),
                database,
            );
        }
    }

    /// The connection is about to unmap its shared memory (a close, or a switch out of WAL
    /// mode): the main lock goes, and the node's DMS lock with its last guarded connection.
    /// Returns the node left, for [`Shield::rejoin_shm`] should the unmap fail.
    pub(crate) fn leave_shm(&self) -> Option<(c_int, FileId)> {
        if self.inherited() {
            return None;
        }
        self.joined.store(false, Ordering::Release);
        self.reconcile();
        let joined = self.node.lock().take()?;
        let left = (joined.key.fd, joined.key.id);
        {
            let mut map = NODES.lock();
            let map = map.get_or_insert_with(HashMap::new);
            if let Some(node) = map.get_mut(&joined.key) {
                node.refs = node.refs.saturating_sub(1);
                if joined.suspending {
                    node.suspended = node.suspended.saturating_sub(1);
                }
            }
            sync_node(map, joined.key, &self.origin);
        }
        Some(left)
    }

    /// The unmap after [`Shield::leave_shm`] failed: the connection still maps the node, so it
    /// counts in it again and takes its locks back.
    pub(crate) fn rejoin_shm(&self, left: Option<(c_int, FileId)>) {
        if let Some((fd, id)) = left {
            self.join_shm(fd, id, None);
        }
    }

    /// The main file is closing: nothing of the shield may outlive SQLite's descriptor (the unix
    /// VFS may keep it open, deferred, and hand it to a later connection).
    pub(crate) fn close(&self) {
        self.level.store(LOCK_NONE, Ordering::Release);
        self.release_all();
    }

    fn release_all(&self) {
        self.leave_shm();
        self.reconcile();
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
        let want_suspend = attempting || level == LOCK_EXCLUSIVE;
        let mut node = self.node.lock();
        if let Some(joined) = node.as_mut() {
            if joined.suspending != want_suspend {
                let mut map = NODES.lock();
                let map = map.get_or_insert_with(HashMap::new);
                if let Some(n) = map.get_mut(&joined.key) {
                    if want_suspend {
                        n.suspended += 1;
                    } else {
                        n.suspended = n.suspended.saturating_sub(1);
                    }
                }
                joined.suspending = want_suspend;
                sync_node(map, joined.key, &self.origin);
            }
        }
    }

    fn off_for_good(&self, reason: String) {
        log::warn!("hermes-guard: lock shield off: {reason}");
        *self.off.lock() = Some(reason);
        self.main_fd.store(-1, Ordering::Release);
    }

    /// `(main lock held, DMS lock held, reason the shield is off)`, for the status.
    pub(crate) fn status(&self) -> (bool, bool, Option<String>) {
        if self.inherited() {
            return (
                false,
                false,
                Some(
                    "this connection was inherited across fork: the shield's locks are the \
                     parent's, and this process holds none"
                        .into(),
                ),
            );
        }
        let shm = self.node.lock().as_ref().is_some_and(|j| {
            NODES
                .lock()
                .as_ref()
                .and_then(|m| m.get(&j.key))
                .is_some_and(|n| n.locked)
        });
        (
            self.main_held.load(Ordering::Acquire),
            shm,
            self.off.lock().clone(),
        )
    }
}
