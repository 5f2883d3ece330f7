//! The guarded main files open in this process, by main inode: how many connections
//! of a retired generation are still open here. The unix VFS shares one `-shm` mapping per inode
//! in a process, so while any of them is open a new connection to the same file attaches to the
//! retired generation's wal-index, and the guard refuses it (`shm-lost`); once they have all
//! closed, a new connection maps the `-shm` at the path afresh and works.
//!
//! The same list tells a closing connection whether another connection of this process
//! still holds its generation ([`ConnectionState::generation_held_by_sibling`]); its close then
//! owes no check of its own (see there).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::super::watch::DirWatch;
use super::ConnectionState;
use crate::filesystem::Filesystem;
use crate::identity::FileId;

/// A connection's close, as the other connections of the process see it.
#[derive(Default)]
pub(super) struct Closing {
    /// The connection has started to close.
    pub(super) started: AtomicBool,
    /// This close leaves its checks to another connection of the generation, decided once per
    /// close.
    pub(super) left_to_sibling: AtomicBool,
}

static OPEN: Mutex<Option<HashMap<FileId, Vec<Weak<ConnectionState>>>>> = Mutex::new(None);

impl ConnectionState {
    /// The main file of `state` was opened (one entry per connection).
    pub(crate) fn opened_here(state: &Arc<ConnectionState>) {
        let Some(id) = state.main_id() else {
            return;
        };
        let mut open = OPEN.lock();
        let connections = open.get_or_insert_with(HashMap::new).entry(id).or_default();
        connections.retain(|s| s.strong_count() > 0);
        connections.push(Arc::downgrade(state));
    }

    /// The main file of this connection is closing.
    pub(crate) fn closing_here(&self) {
        let Some(id) = self.main_id() else {
            return;
        };
        let mut open = OPEN.lock();
        let Some(map) = open.as_mut() else {
            return;
        };
        if let Some(connections) = map.get_mut(&id) {
            connections.retain(|s| s.strong_count() > 0 && !std::ptr::eq(s.as_ptr(), self));
            if connections.is_empty() {
                map.remove(&id);
            }
        }
    }

    /// Connections open in this process on this connection's main file whose generation is
    /// retired (this one included).
    pub(crate) fn retired_open_here(&self) -> usize {
        let Some(id) = self.main_id() else {
            return usize::from(self.is_retired());
        };
        let states: Vec<Arc<ConnectionState>> = OPEN
            .lock()
            .as_ref()
            .and_then(|map| map.get(&id))
            .map(|c| c.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        states.iter().filter(|s| s.is_retired()).count()
    }

    /// The database's directory (its identity, its filesystem and a watch of it) as another
    /// connection of this process on the same main file, by the same name, found it, when that is
    /// still true: the watch just made (and drained) shows the generation that connection's last
    /// full check saw, so nothing in the directory or above it changed since that check found the
    /// main file there. Spares the open its `stat` of the directory.
    pub(super) fn directory_from_sibling(
        main_id: Option<FileId>,
        db_path: &Path,
        parent: &Path,
    ) -> Option<(FileId, Filesystem, DirWatch)> {
        let main = main_id?;
        let states: Vec<Arc<ConnectionState>> = OPEN
            .lock()
            .as_ref()
            .and_then(|map| map.get(&main))
            .map(|c| c.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        let sibling = states.into_iter().find(|s| {
            s.paths.db == db_path
                && !s.is_retired()
                && s.directory.id.is_some()
                && s.directory.on_local_filesystem()
                && !s.watches.shm_elsewhere()
        })?;
        let verified = sibling.watches.verified_generation.load(Ordering::Acquire);
        let watch = DirWatch::new_local(parent)?;
        if watch.generation_as_drained() != Some(verified) {
            return None;
        }
        Some((
            sibling.directory.id?,
            sibling.directory.filesystem.clone()?,
            watch,
        ))
    }

    /// A full check of this connection passed, from the watch's figures read before it: it is one
    /// of every connection here with the same name and the same pins (main file, WAL, `-shm` at the
    /// same path), which vouch from it too. A connection opened beside a long-lived one that has
    /// not written since something else changed in the directory then finds it vouched for at its
    /// open and its close, from the second such connection on.
    pub(super) fn share_vouch(&self, generation: Option<u64>, changes: Option<u64>) {
        let Some(g) = generation else {
            return;
        };
        if changes.is_none() || self.watches.shm_elsewhere() {
            return;
        }
        let pins = |s: &ConnectionState| {
            let inner = s.inner.lock();
            (
                inner.pins.main_id,
                inner.pins.wal_id(),
                inner.pins.shm_id,
                inner.pins.shm_check_path.clone(),
            )
        };
        let ours = pins(self);
        for s in self.siblings() {
            if s.paths.db == self.paths.db
                && !s.is_retired()
                && !s.watches.shm_elsewhere()
                && pins(&s) == ours
            {
                s.watches.verified_generation.store(g, Ordering::Release);
                s.record_vouch(generation, changes);
            }
        }
    }

    /// The `-shm` a connection of this process on the same database maps through the guard's
    /// wal-index node, where the directory watch vouches (as of its last drain: this connection's
    /// open drained it) that nothing changed on the path since that connection's last full check:
    /// the file at `<db>-shm` is still that one, and a new connection joins its node with no
    /// system call. A replacement the watch has not drained yet leaves an event pending, so this
    /// connection's first check is a full one, and retires it.
    pub(crate) fn sibling_shm_vouched(&self) -> Option<FileId> {
        self.siblings().iter().find_map(|s| {
            if s.paths.db != self.paths.db || s.is_retired() || !s.vouched_as_of_last_drain() {
                return None;
            }
            let (id, _) = s.wal_index().file()?;
            (s.inner.lock().pins.shm_id == Some(id)).then_some(id)
        })
    }

    /// The other connections open in this process on this connection's main file.
    pub(super) fn siblings(&self) -> Vec<Arc<ConnectionState>> {
        match self.main_id() {
            Some(main) => self.siblings_on(main),
            None => Vec::new(),
        }
    }

    /// The connections open in this process on the main file `main`, this one excepted (for a
    /// caller that holds this connection's `inner`).
    pub(super) fn siblings_on(&self, main: FileId) -> Vec<Arc<ConnectionState>> {
        OPEN.lock()
            .as_ref()
            .and_then(|map| map.get(&main))
            .map(|c| {
                c.iter()
                    .filter(|s| !std::ptr::eq(s.as_ptr(), self))
                    .filter_map(Weak::upgrade)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// This connection starts to close (`SQLITE_FCNTL_HAS_MOVED`, else its WAL's close): from
    /// now on it holds its generation for nobody ([`ConnectionState::generation_held_by_sibling`]).
    pub(crate) fn close_starts(&self) {
        self.closing.started.store(true, Ordering::SeqCst);
    }

    /// Whether this closing connection leaves its close-time checks to another connection of the
    /// process that holds its generation ([`ConnectionState::generation_held_by_sibling`]) and
    /// whose last full check the directory watch still vouches for (one `epoll_wait`: nothing on
    /// the paths of the generation's files, nor the mount table, changed since that check, so
    /// nothing was taken away since — a loss after this connection's last write and before its
    /// close is found here, not left to a connection that may never write or close again). Decided
    /// once per close: the checks at `HAS_MOVED`, `xShmUnmap` and the WAL's `xClose` follow the
    /// first one's answer.
    pub(crate) fn close_left_to_sibling(&self) -> bool {
        self.close_starts();
        if self.closing.left_to_sibling.load(Ordering::Acquire) {
            return true;
        }
        let left = self
            .sibling_holding_generation()
            .is_some_and(|s| s.vouched_fast());
        if left {
            self.closing.left_to_sibling.store(true, Ordering::Release);
        }
        left
    }

    /// Whether another connection of this process, not closing, holds this connection's generation:
    /// the same main file and the same WAL open, neither retired, and SHARED (or more) on the main
    /// file. Then this connection's close owes no check and no step-aside of its own:
    ///
    /// - SQLite's unix VFS refuses the close's `EXCLUSIVE` without a syscall while another
    ///   connection of the process holds SHARED on the inode (`pInode->nShared > 1` in
    ///   `unixLock`): no checkpoint and no WAL delete can follow this close;
    /// - everything the close's checks would find (a file taken away or overwritten) the
    ///   other connection finds at its next write or its own close, with the same descriptors
    ///   of the same generation, and captures.
    ///
    /// Two connections closing at once each mark themselves closing
    /// ([`ConnectionState::close_starts`], sequentially consistent) before they look: at least one
    /// of them sees the other closing and does the full checks. A sibling inherited from a parent
    /// process (a forked child's copy) holds nothing here and is never counted.
    pub(crate) fn generation_held_by_sibling(&self) -> bool {
        self.sibling_holding_generation().is_some()
    }

    fn sibling_holding_generation(&self) -> Option<Arc<ConnectionState>> {
        if self.is_retired() {
            return None;
        }
        let wal = self.inner.lock().pins.wal_id()?;
        self.siblings().into_iter().find(|s| {
            !s.closing.started.load(Ordering::SeqCst)
                && !s.is_retired()
                && s.shield.holds_shared_here()
                && s.inner.lock().pins.wal_id() == Some(wal)
        })
    }
}
