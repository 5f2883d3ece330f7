//! The pins of a database's files and their lifecycle: the WAL pinned at its open and let go at
//! its close, the WAL's write gate, the `-shm` pinned at its first mapping and let go at its
//! unmap, and the main file's close (`ConnectionState`'s own, split from `state.rs`).

use std::fs::File;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::super::in_use;
use super::super::watch::DirWatch;
use super::base_pages::BaseStore;
use super::{healing, ConnectionState, Inner, WalGate, WalIndex, JUST_CLOSED_WAL};
use crate::identity::{identity_of_path, FileId, FileStamp, PinnedWal};
use crate::vfs::watch::Creations;

/// The identities this connection pinned, and what it saw of them at its checks.
#[derive(Default)]
pub(super) struct Pins {
    pub(super) main_id: Option<FileId>,
    pub(super) wal: Option<PinnedWal>,
    pub(super) shm_id: Option<FileId>,
    /// The `-shm`'s pathname when it is not `<db>-shm` ([`ConnectionState::pin_shm`]).
    pub(super) shm_check_path: Option<PathBuf>,
    /// What `<db>-wal` named just before SQLite opened it
    /// ([`ConnectionState::wal_seen_before_open`]).
    pub(super) wal_before_open: Option<FileId>,
    /// The `-shm` this connection maps, on the process's list while held (`in_use.rs`).
    pub(super) shm_here: Option<in_use::ShmHere>,
    /// The (main file, WAL) pair this connection has open, on the process's list while held.
    pub(super) wal_here: Option<in_use::WalHere>,
    /// The directory watch's creation counts of this database's names when its `-shm` was
    /// pinned (`state/base.rs`).
    pub(super) creations_at_pin: Option<Creations>,
    /// The most names (hard links) the main file had at any full check: a file that ever had a
    /// second name is never judged the capture's own base (`state/base.rs`).
    pub(super) most_links: u64,
    /// The main file's stamp at the last full check that passed (`state/healing.rs`).
    pub(super) main_stamp: Option<FileStamp>,
}

impl Pins {
    /// The pinned WAL's identity.
    pub(super) fn wal_id(&self) -> Option<FileId> {
        self.wal.as_ref().map(PinnedWal::id)
    }

    /// The pathname the pinned `-shm` is checked by: its own, else `sidecar` (`<db>-shm`).
    pub(super) fn shm_check_path<'a>(&'a self, sidecar: &'a Path) -> &'a Path {
        self.shm_check_path.as_deref().unwrap_or(sidecar)
    }
}

impl ConnectionState {
    /// What `<db>-wal` named just before SQLite opened it (the stale-WAL gate's look), for
    /// [`ConnectionState::pin_wal`].
    pub(crate) fn wal_seen_before_open(&self, id: Option<FileId>) {
        self.inner.lock().pins.wal_before_open = id;
    }

    /// Called when SQLite has opened `<db>-wal` for this database, with SQLite's own descriptor
    /// of it when the shim can see into the wrapped file (the unix VFS): the pin then borrows it,
    /// and the guard holds no descriptor of its own while the generation is live. Otherwise (a
    /// VFS the shim cannot see into, or a descriptor that is not the file at the path) a
    /// read-only descriptor of the guard's own. A WAL the guard cannot pin is one whose loss it
    /// could neither see nor capture: the caller fails the open.
    pub(crate) fn pin_wal(
        &self,
        wal_path: &Path,
        sqlite: Option<ManuallyDrop<File>>,
    ) -> std::io::Result<()> {
        let seen = self.inner.lock().pins.wal_before_open.take();
        let borrowed = match sqlite {
            Some(fd) => PinnedWal::borrowed(fd, wal_path, seen).unwrap_or_else(|e| {
                log::debug!(
                    "hermes-guard: SQLite's descriptor of {} cannot be pinned ({e}); pinning by \
                     path",
                    wal_path.display()
                );
                None
            }),
            None => None,
        };
        let wal = match borrowed {
            Some(wal) => wal,
            None => PinnedWal::open(wal_path).inspect_err(|e| {
                log::error!(
                    "hermes-guard: cannot open {} to pin the WAL generation: {e}; refusing the \
                     open",
                    wal_path.display()
                )
            })?,
        };
        let mut inner = self.inner.lock();
        inner.pins.wal_here = None;
        inner.pins.wal_here = inner
            .pins
            .main_id
            .map(|main| in_use::WalHere::new(main, wal.id()));
        *self.base.store.lock() = Some(BaseStore::join(inner.pins.main_id, wal.id()));
        inner.pins.wal = Some(wal);
        drop(inner);
        self.checks
            .last_wal_offset
            .store(i64::MAX, Ordering::Release);
        self.checks.wal_pinned.store(true, Ordering::Release);
        Ok(())
    }

    /// The WAL file object's write gate, installed once its file object is complete: opened or
    /// closed at once as the state requires.
    pub(crate) fn attach_wal_gate(&self, gate: Box<dyn WalGate>) {
        let mut inner = self.inner.lock();
        inner.wal_gate.gate = Some(gate);
        inner.sync_wal_gate(self.checks.main_above_shared.load(Ordering::Acquire));
    }

    /// The WAL file object is about to be closed and freed: its gate goes first.
    pub(crate) fn detach_wal_gate(&self) {
        self.inner.lock().wal_gate.gate = None;
    }

    /// The main file is locked above SHARED by this connection: how a WAL opened under
    /// `locking_mode=EXCLUSIVE` (allowed where WAL mode is refused) is told.
    pub(crate) fn main_locked_above_shared(&self) -> bool {
        self.checks.main_above_shared.load(Ordering::Acquire)
    }

    /// The main file's lock level changed: above SHARED (`true`) or not. The WAL's gate follows
    /// (see [`WalGate`]); nothing to do while the level stays on the same side of SHARED, nor
    /// without a WAL (rollback mode's every write transaction moves it).
    pub(crate) fn main_lock_level(&self, above_shared: bool) {
        if self
            .checks
            .main_above_shared
            .swap(above_shared, Ordering::AcqRel)
            != above_shared
            && self.wal_pinned()
        {
            self.inner.lock().sync_wal_gate(above_shared);
        }
    }

    /// Called when SQLite is about to close the WAL file object (before the wrapped close: a
    /// pin that borrows SQLite's descriptor must let go of it, or own a `dup` of it, first).
    /// A retired generation that is still to be captured, or may be healed at the main file's
    /// close, keeps its WAL through a descriptor of the guard's own; every other pin is dropped.
    pub(crate) fn wal_closing(&self) {
        let mut inner = self.inner.lock();
        let Some(id) = inner.pins.wal_id() else {
            return;
        };
        JUST_CLOSED_WAL.with(|j| *j.borrow_mut() = Some((self.paths.wal.clone(), id)));
        let keep = (inner.loss.reason.is_some() && inner.loss.capture.is_none() && inner.worth_capturing())
            // Until the main file's close, which may check the frames back in (`healing.rs`).
            || healing::may_heal(&inner);
        if !keep && inner.close.frames_left && self.leaves_wal_to_opener(&mut inner, id) {
            return;
        }
        if keep {
            // The descriptor is the only way left to the retired frames: keep it for the retry
            // or the heal. Normally owned since the retirement (`check_pins`).
            match inner.pins.wal.as_mut().map(PinnedWal::own) {
                Some(Err(e)) => log::error!(
                    "hermes-guard: cannot keep a descriptor of the retired WAL {} ({id}) past its \
                     close: {e}; its frames that no capture holds are lost with SQLite's close",
                    self.paths.wal.display()
                ),
                _ => return,
            }
        }
        inner.pins.wal_here = None;
        inner.pins.wal = None;
        inner.loss.generation = None;
        *self.base.store.lock() = None;
        self.checks.wal_pinned.store(false, Ordering::Release);
    }

    /// Called when the shared-memory region 0 is mapped: pins the inode behind the mapping
    /// (`mapped` runs only while nothing is pinned: its identity, and the pathname the kernel
    /// gives for it), or what the pathname names if that fails, and keeps `index` to read the
    /// checkpoint progress from at a loss.
    ///
    /// The pin is checked later by a pathname: `<db>-shm` when that is the mapped file (the
    /// common case) or when the mapped file has no other live name (a `-shm` unlinked before
    /// this connection attached to it: retired at the first check, as it must be); else the
    /// mapped file's own name (an `SQLITE_SHM_DIRECTORY` build keeps the `-shm` in that
    /// directory, under a name of its own).
    pub(crate) fn pin_shm(
        &self,
        mapped: impl FnOnce() -> Option<(FileId, Option<PathBuf>)>,
        index: Box<dyn WalIndex>,
    ) {
        let node = mapped();
        // Before the lock: the watch's drain takes the watcher's. A sibling that pinned the same
        // `-shm` took the count for this generation already (an earlier one, so at most more
        // cautious) with the same counters: no drain (one `epoll_wait` less per open beside it).
        let creations = node
            .as_ref()
            .and_then(|(id, _)| self.sibling_creations_at_pin(*id))
            .or_else(|| self.creations_now());
        let mut inner = self.inner.lock();
        if inner.pins.shm_id.is_none() {
            inner.pins.creations_at_pin = creations;
            let at_sidecar = || identity_of_path(&self.paths.shm).ok().flatten();
            let (id, check_path) = match node {
                // The node's own name is `<db>-shm` in the common case: no `stat` to compare.
                Some((id, Some(name))) if name != self.paths.shm && at_sidecar() != Some(id) => {
                    let live = identity_of_path(&name).ok().flatten() == Some(id);
                    (Some(id), live.then_some(name))
                }
                Some((id, _)) => (Some(id), None),
                None => (at_sidecar(), None),
            };
            if let Some(name) = &check_path {
                let dir = name.parent().filter(|d| Some(*d) != self.paths.db.parent());
                // A change there must stop the fast path vouching as one beside the database
                // does (the watcher's change count is shared by every watched directory); no
                // watch there, no vouching at all (see `check`).
                *self.watches.shm.lock() = dir.map(DirWatch::new);
                log::info!(
                    "hermes-guard: the shared memory of {} is {} (not {}): checked there",
                    self.paths.db.display(),
                    name.display(),
                    self.paths.shm.display()
                );
            }
            inner.pins.shm_id = id;
            inner.pins.shm_check_path = check_path;
        }
        if inner.pins.shm_here.is_none() {
            inner.pins.shm_here = inner.pins.shm_id.map(in_use::ShmHere::new);
        }
        inner.wal_index = Some(index);
    }

    /// The pathname the pinned `-shm` is checked by (see [`ConnectionState::pin_shm`]).
    pub(super) fn shm_check_path<'a>(&'a self, inner: &'a Inner) -> &'a Path {
        inner.pins.shm_check_path(&self.paths.shm)
    }

    /// The shared memory is about to be unmapped (`delete`: SQLite's close checkpointed the WAL
    /// and deletes it): its address must not be read from now on. A WAL kept with committed
    /// frames no checkpoint copied is noted for the WAL's close (`state/left.rs`).
    pub(crate) fn shm_unmapping(&self, delete: bool) {
        let mut inner = self.inner.lock();
        inner.close.frames_left = !delete
            && inner.loss.reason.is_none()
            && inner
                .wal_index
                .as_ref()
                .and_then(|i| i.backfill())
                .is_some_and(|b| b.frames > b.backfilled);
        inner.wal_index = None;
    }

    /// The shared memory was unmapped (its WAL closed: a close, or a switch out of WAL mode).
    /// The next mapping is a new generation, pinned afresh; a retired one keeps its pin.
    pub(crate) fn shm_unmapped(&self) {
        let mut inner = self.inner.lock();
        inner.pins.shm_here = None;
        if inner.loss.reason.is_none() {
            inner.pins.shm_id = None;
            inner.pins.shm_check_path = None;
            *self.watches.shm.lock() = None;
        }
    }

    /// Called when the main file object is finally closed by SQLite's own close, on SQLite's
    /// thread: [`ConnectionState::main_released`], and this thread's just-closed WAL forgotten.
    pub(crate) fn main_closed(&self) {
        self.main_released();
        JUST_CLOSED_WAL.with(|j| {
            let mut j = j.borrow_mut();
            if j.as_ref().is_some_and(|(path, _)| *path == self.paths.wal) {
                *j = None;
            }
        });
    }

    /// The main file object is let go (a held one after its capture, on any thread, even at the
    /// process's exit): what it pinned goes. No thread-local storage.
    pub(crate) fn main_released(&self) {
        let mut inner = self.inner.lock();
        inner.pins.shm_here = None;
        inner.pins.wal_here = None;
        inner.loss.main_image = None;
        inner.pins.wal = None;
        inner.loss.generation = None;
        *self.base.store.lock() = None;
        *self.base.reader.lock() = None;
        inner.wal_index = None;
        self.checks.wal_pinned.store(false, Ordering::Release);
    }
}
