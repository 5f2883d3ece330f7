//! The directory watches of a connection and what they last vouched for: while the watched
//! directories show the generation (and the watcher the change count) read at the start of the
//! last full check that passed, nothing on the path changed, and a check needs no `stat`.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::NEVER_VOUCHED;
use crate::vfs::watch::{DirWatch, FastWatch};

pub(super) struct Watches {
    /// The database directory's watch, and its generation at the last full check that passed:
    /// while they match, no name in the directory has changed, no directory above it moved and
    /// the mount table is the same, so a transaction start needs no `stat`.
    pub(super) dir: Option<DirWatch>,
    /// The watch of the directory that holds the `-shm`, when that is not the database's (an
    /// `SQLITE_SHM_DIRECTORY` build, see [`super::ConnectionState::pin_shm`]): its changes count
    /// too. `Some(None)`: the `-shm` is elsewhere and unwatched, so no watch vouches for this path.
    pub(super) shm: Mutex<Option<Option<DirWatch>>>,
    /// `dir`'s lock-free half (NONE without a watch): what the fast check uses.
    pub(super) fast: FastWatch,
    /// The watched generation at the last full check that passed (`u64::MAX`: none yet).
    pub(super) verified_generation: AtomicU64,
    /// The watcher-wide change count read at the start of the last full check that passed:
    /// while it stands, the fast path vouches with one `epoll_wait`. [`NEVER_VOUCHED`] before
    /// the first full check and from the retirement on (see
    /// [`super::ConnectionState::check_fast`]).
    pub(super) verified_changes: AtomicU64,
}

impl Watches {
    /// The watches of a database whose directory is watched by `dir` (if at all).
    pub(super) fn new(dir: Option<DirWatch>) -> Watches {
        let fast = dir.as_ref().map_or(FastWatch::NONE, DirWatch::fast);
        Watches {
            dir,
            shm: Mutex::new(None),
            fast,
            verified_generation: AtomicU64::new(u64::MAX),
            verified_changes: AtomicU64::new(NEVER_VOUCHED),
        }
    }

    /// Whether the watch vouches, with one `epoll_wait`, that nothing changed since the last
    /// full check that passed. Panic-free: atomics and one `epoll_wait`.
    #[inline(always)]
    pub(super) fn vouched_fast(&self) -> bool {
        self.fast.current_fast(&self.verified_changes)
    }

    /// [`Watches::vouched_fast`] as of the watch's last drain, with no system call (see
    /// `FastWatch::current_as_of_last_drain`).
    pub(super) fn vouched_as_of_last_drain(&self) -> bool {
        self.fast.current_as_of_last_drain(&self.verified_changes)
    }

    /// The watches' figures, read before a check: any change from here on (including one the
    /// drain below takes in) moves them, so recording them after the check vouches for nothing
    /// that happened after this read. `(generation, changes)`.
    pub(super) fn figures(&self) -> (Option<u64>, Option<u64>) {
        let changes = self.dir.as_ref().map(DirWatch::changes);
        let generation = self.dir.as_ref().and_then(DirWatch::current);
        let generation = match (&*self.shm.lock(), generation) {
            (None, g) => g,
            // Both figures only grow: their sum moves when either does.
            (Some(Some(shm)), Some(g)) => shm.current().map(|s| g.wrapping_add(s)),
            _ => None,
        };
        (generation, changes)
    }

    /// Whether the `-shm` is checked in a directory of its own (watched or not).
    pub(super) fn shm_elsewhere(&self) -> bool {
        self.shm.lock().is_some()
    }

    /// The fast check no longer vouches (a retirement).
    pub(super) fn stop_vouching(&self) {
        self.verified_changes.store(NEVER_VOUCHED, Ordering::SeqCst);
    }
}
