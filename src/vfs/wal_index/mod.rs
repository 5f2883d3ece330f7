//! The guard's own mapping of the wal-index: one node per `-shm` file in this process, where
//! SQLite's unix VFS keeps one per **main** file. A connection opened after a loss therefore maps
//! the `-shm` now at the path and writes at once, while the lost generation's connections keep the
//! file they opened until they close.
//!
//! The node speaks SQLite's on-disk protocol (`os_unix.c`: `unixOpenSharedMemory`,
//! `unixLockSharedMemory`, `unixShmMap`, `unixShmLock`, `unixShmUnmap`) byte for byte: the lock
//! slots at bytes 120-127, the dead-man switch at 128 (the first process truncates the file to
//! 3 bytes), growth by one-byte writes at the end of each 4 KiB page, one `mmap` per group of
//! regions, a read-only `-shm` answering `SQLITE_READONLY`. One difference: every lock is an
//! **open-file-description** lock (`F_OFD_SETLK`) on the node's own descriptor, never a POSIX
//! one. OFD locks conflict with POSIX locks, those of this process included, so a stock
//! connection of this process (SQLite's node, POSIX locks) and a guarded one (this node) exclude
//! each other exactly as two processes do; and a stray `close()` of the `-shm` elsewhere in the
//! process drops none of them.
//!
//! - `node.rs`: the node, its registry, the lock accounting, the descriptors kept open past their
//!   node (a close would drop this process's POSIX locks on the file);
//! - `sys.rs`: the system calls, every `unsafe` of the module.

use std::ffi::{c_int, CString};

use parking_lot::Mutex;
use rusqlite::ffi;

use crate::identity::FileId;

mod node;
pub(in crate::vfs) mod sys;
#[cfg(test)]
mod tests;

use node::{Attached, Node, Opened};

/// Whether this build can have its own node: OFD locks with a 64-bit `struct flock`.
pub(crate) const SUPPORTED: bool = cfg!(all(target_os = "linux", target_pointer_width = "64"));

/// A connection's shared memory: unmapped, the guard's node, or SQLite's own (where the guard
/// cannot name the `-shm` SQLite would use, or the wrapped file is not the unix VFS's).
#[derive(Default)]
pub(crate) struct ShmSlot(Mutex<Mode>);

#[derive(Default)]
enum Mode {
    #[default]
    Unmapped,
    Own(Attached),
    Sqlite,
}

/// The main file's mode and owner, asked for when a new `-shm` node opens its file.
pub(crate) type ModeAndOwner = Box<dyn FnOnce() -> Result<(u32, (u32, u32)), c_int>>;

/// What a map asks to open, when the connection has no node yet.
pub(crate) struct ShmFile {
    /// The `-shm` at the path, when another connection here knows it without a `stat`.
    pub(crate) known: Option<FileId>,
    /// `<db>-shm`, bytes as SQLite has them.
    pub(crate) path: CString,
    /// The main file's mode and owner (an `fstat`, made only when the `-shm` is opened).
    pub(crate) mode_and_owner: ModeAndOwner,
    /// The URI's `readonly_shm`.
    pub(crate) readonly_shm: bool,
}

impl ShmSlot {
    /// The connection maps through SQLite's own node from now until its unmap.
    pub(crate) fn use_sqlite(&self) {
        *self.0.lock() = Mode::Sqlite;
    }

    /// Whether the connection uses SQLite's node (or has not mapped yet and must decide).
    pub(crate) fn is_sqlite(&self) -> bool {
        matches!(*self.0.lock(), Mode::Sqlite)
    }

    pub(crate) fn is_unmapped(&self) -> bool {
        matches!(*self.0.lock(), Mode::Unmapped)
    }

    /// `xShmMap` on the guard's node: attached first if need be (`file` names it: asked for by
    /// the caller before this slot's lock is taken, since naming it may read other connections'
    /// slots, which may be asking for this one's at the same moment).
    pub(crate) fn map(
        &self,
        file: Option<Result<ShmFile, c_int>>,
        region: c_int,
        size: c_int,
        extend: bool,
    ) -> (usize, c_int) {
        let (Ok(region), Ok(size)) = (usize::try_from(region), usize::try_from(size)) else {
            return (0, ffi::SQLITE_IOERR_SHMMAP);
        };
        let mut mode = self.0.lock();
        if let Mode::Unmapped = *mode {
            let file = match file {
                Some(Ok(file)) => file,
                Some(Err(rc)) => return (0, rc),
                None => return (0, ffi::SQLITE_IOERR_SHMMAP),
            };
            match node::attach(
                file.known,
                file.path,
                file.mode_and_owner,
                file.readonly_shm,
            ) {
                Ok(Opened::Ready(attached)) => *mode = Mode::Own(attached),
                Ok(Opened::CannotInit(attached)) => {
                    *mode = Mode::Own(attached);
                    return (0, ffi::SQLITE_READONLY_CANTINIT);
                }
                Err(rc) => return (0, rc),
            }
        }
        match &*mode {
            Mode::Own(me) => me.node.map(region, size, extend),
            _ => (0, ffi::SQLITE_IOERR_SHMMAP),
        }
    }

    /// The connection's `-shm` describes another WAL
    /// (`ConnectionState::wal_index_describes_another_wal`): a fresh `-shm` is put at the path in
    /// place of the node's file (unless another guarded connection did so first), the connection
    /// lets go of the old node and maps the file now at the path, region `region` of it, as
    /// [`ShmSlot::map`] does.
    pub(crate) fn map_fresh(
        &self,
        file: ShmFile,
        region: c_int,
        size: c_int,
        extend: bool,
    ) -> (usize, c_int) {
        let (mode, owner) = match (file.mode_and_owner)() {
            Ok(found) => found,
            Err(rc) => return (0, rc),
        };
        {
            let mut slot = self.0.lock();
            let Mode::Own(me) = std::mem::take(&mut *slot) else {
                return (0, ffi::SQLITE_IOERR_SHMMAP);
            };
            if let Err(rc) = node::replace_file(&me.node, mode, owner) {
                *slot = Mode::Own(me);
                return (0, rc);
            }
            Node::detach(me, false);
        }
        let fresh = ShmFile {
            known: None,
            mode_and_owner: Box::new(move || Ok((mode, owner))),
            ..file
        };
        self.map(Some(Ok(fresh)), region, size, extend)
    }

    /// `xShmLock` on the guard's node; `None` when the connection uses SQLite's.
    #[inline]
    pub(crate) fn lock(&self, ofst: c_int, n: c_int, flags: c_int) -> Option<c_int> {
        let mut mode = self.0.lock();
        match &mut *mode {
            Mode::Own(Attached { node, held }) => Some(node.lock(held, ofst, n, flags)),
            Mode::Unmapped | Mode::Sqlite => None,
        }
    }

    /// `xShmUnmap`: `true` when the connection used the guard's node (now let go).
    pub(crate) fn unmap(&self, delete: bool) -> bool {
        let mode = std::mem::take(&mut *self.0.lock());
        match mode {
            Mode::Own(me) => {
                Node::detach(me, delete);
                true
            }
            Mode::Sqlite | Mode::Unmapped => false,
        }
    }

    /// The `-shm` the connection's node maps: its identity and path.
    pub(crate) fn file(&self) -> Option<(FileId, CString)> {
        match &*self.0.lock() {
            Mode::Own(me) => Some((me.node.id, me.node.path.clone())),
            _ => None,
        }
    }

    /// `SQLITE_FCNTL_EXTERNAL_READER` from the guard's node; `None` when it has none.
    pub(crate) fn external_reader(&self) -> Option<Result<bool, c_int>> {
        match &*self.0.lock() {
            Mode::Own(me) => Some(me.node.external_reader()),
            _ => None,
        }
    }

    /// What `unixIsSharingShmNode` tells SQLite's `xLock(EXCLUSIVE)` in WAL mode: another
    /// connection (of this process, or a process of its own) maps the `-shm`. Only a robustness
    /// aid in SQLite (a false "no" operates to spec); kept so that the close of the last
    /// connection here does not delete a WAL another process uses after a rogue lock drop.
    pub(crate) fn shared_with_others(&self) -> bool {
        match &*self.0.lock() {
            Mode::Own(me) => me.node.shared_beyond_node(),
            _ => false,
        }
    }

    /// The node holds the dead-man switch (the status).
    pub(crate) fn dead_man_switch_held(&self) -> bool {
        match &*self.0.lock() {
            Mode::Own(me) => me.node.dead_man_switch_held(),
            _ => false,
        }
    }
}
