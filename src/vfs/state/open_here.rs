//! The guarded main files open in this process, by main inode (issue 30): how many connections
//! of a retired generation are still open here. The unix VFS shares one `-shm` mapping per inode
//! in a process, so while any of them is open a new connection to the same file attaches to the
//! retired generation's wal-index, and the guard refuses it (`shm-lost`); once they have all
//! closed, a new connection maps the `-shm` at the path afresh and works.
//!
//! Issue 36: the same list tells a closing connection whether another connection of this process
//! still holds its generation ([`DbState::generation_held_by_sibling`]); its close then owes no
//! check of its own (see there).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::DbState;
use crate::identity::{FileId, PinnedWal};

static OPEN: Mutex<Option<HashMap<FileId, Vec<Weak<DbState>>>>> = Mutex::new(None);

impl DbState {
    /// The main file of `state` was opened (one entry per connection).
    pub(crate) fn opened_here(state: &Arc<DbState>) {
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
        let states: Vec<Arc<DbState>> = OPEN
            .lock()
            .as_ref()
            .and_then(|map| map.get(&id))
            .map(|c| c.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        states.iter().filter(|s| s.is_retired()).count()
    }

    /// The `-shm` behind `fd` when another connection of this process on the same main file maps
    /// the shared-memory node whose descriptor it is (the unix VFS shares one node per inode):
    /// that node, and its descriptor, live while that connection maps it, so the identity taken
    /// at its join still holds and no `fstat` is needed (issue 36).
    pub(crate) fn shm_joined_by_sibling(&self, fd: std::ffi::c_int) -> Option<FileId> {
        self.siblings()
            .iter()
            .find_map(|s| s.shield.joined_node().filter(|(at, _)| *at == fd))
            .map(|(_, id)| id)
    }

    /// The other connections open in this process on this connection's main file.
    fn siblings(&self) -> Vec<Arc<DbState>> {
        let Some(main) = self.main_id() else {
            return Vec::new();
        };
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
    /// now on it holds its generation for nobody ([`DbState::generation_held_by_sibling`]).
    pub(crate) fn close_starts(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Issue 36: whether another connection of this process, not closing, holds this
    /// connection's generation: the same main file and the same WAL open, neither retired, and
    /// SHARED (or more) on the main file. Then this connection's close owes no check and no
    /// step-aside of its own:
    ///
    /// - SQLite's unix VFS refuses the close's `EXCLUSIVE` without a syscall while another
    ///   connection of the process holds SHARED on the inode (`pInode->nShared > 1` in
    ///   `unixLock`): no checkpoint and no WAL delete can follow this close;
    /// - everything the close's checks would find (a file taken away or overwritten) the
    ///   other connection finds at its next write or its own close, with the same descriptors
    ///   of the same generation, and captures.
    ///
    /// Two connections closing at once each mark themselves closing ([`DbState::close_starts`],
    /// sequentially consistent) before they look: at least one of them sees the other closing
    /// and does the full checks. A sibling inherited from a parent process (a forked child's
    /// copy) holds nothing here and is never counted.
    pub(crate) fn generation_held_by_sibling(&self) -> bool {
        if self.is_retired() {
            return false;
        }
        let Some(wal) = self.inner.lock().wal.as_ref().map(PinnedWal::id) else {
            return false;
        };
        self.siblings().iter().any(|s| {
            !s.closing.load(Ordering::SeqCst)
                && !s.is_retired()
                && s.shield.holds_shared_here()
                && s.inner.lock().wal.as_ref().map(PinnedWal::id) == Some(wal)
        })
    }
}
