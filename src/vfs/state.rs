//! The guard's state of one connection (one open main file object: two connections of a database
//! have one each): the pinned generation, the retirement verdict and the capture. Shared (by
//! `Arc`) between the main file object and its WAL's file object. Safe code: the shim hands it
//! plain values. Its fields are parts that own their fields and the methods that touch only them
//! (`state/checks.rs`, `watches.rs`, `pins.rs`, `loss.rs`, ...).

use std::cell::RefCell;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::retry;
use super::shield::Shield;
use super::stale_wal::StaleWalSlot;
use super::watch::DirWatch;
use crate::capture::{sidecar, ImageSource};
use crate::filesystem::Filesystem;
use crate::identity::{identity_of_path, FileId, PinnedWal};
use crate::status::{Backfill, GuardStatus};

mod base;
mod base_pages;
mod base_slot;
mod capturing;
mod checks;
mod dir;
mod foreign_index;
mod frames;
mod freed_pages;
mod gates;
mod generation;
mod heal_error;
mod heal_staging;
mod healing;
mod left;
mod loss;
mod open_here;
pub(in crate::vfs) mod overwrite;
mod pins;
mod prefix;
#[cfg(test)]
mod tests;
mod tripwire;
mod wal_gate;
mod watches;

pub(crate) use crate::wal_reset::slot::WalResetSlot;
use checks::{LOCK_CHECKED, MAIN_CHECKED, WAL_CHECKED};
pub(crate) use frames::FRAME_HEADER;
pub(crate) use healing::MainFile;
pub(crate) use left::LeftWal;
pub(crate) use wal_gate::WalGate;

/// `verified_changes` of a state the fast path must never vouch for: not checked yet, or
/// retired. The watcher's change count starts at 0 and only counts up; it never gets here.
const NEVER_VOUCHED: u64 = u64::MAX;

/// The extended code of every refusal.
pub(crate) const REFUSED: i32 = rusqlite::ffi::SQLITE_READONLY_DBMOVED;

/// Where a retirement check runs; decides which "already checked" flag it sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Site {
    /// The WAL write lock, or the WAL's first write of a transaction.
    WalWrite,
    /// The checkpoint lock: every checkpoint, which writes the main file.
    CheckpointLock,
    /// A main-file write, truncate, size hint or EXCLUSIVE lock outside a checked checkpoint.
    MainWrite,
}

/// What a write's fast path decided ([`ConnectionState::wal_write_gate`],
/// [`ConnectionState::main_write_gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Already checked for this transaction or checkpoint: go ahead.
    Go,
    /// A transaction or checkpoint starts here: check ([`ConnectionState::check_fast`], else
    /// [`ConnectionState::check`]).
    Check(Site),
    /// The generation is retired: refuse ([`ConnectionState::refuse`], which may capture).
    Refuse,
}

/// One connection's state (see the module's doc).
pub(crate) struct ConnectionState {
    paths: Paths,
    /// What this transaction or checkpoint checked, and the retirement, lock-free
    /// (`state/checks.rs`).
    checks: checks::Checks,
    /// The directory watches and what they vouched for (`state/watches.rs`).
    watches: watches::Watches,
    /// The current write transaction's frames: which WAL write is checked before it and which
    /// after it (`state/frames.rs`).
    frames: frames::Frames,
    /// The base pages' store and their reader (`state/base_slot.rs`).
    base: base_slot::BaseSlot,
    /// The database's directory: its identity and filesystem at the open, and where it is
    /// (`state/dir.rs`).
    directory: dir::Directory,
    /// The lock shield of this connection (`shield.rs`).
    shield: Shield,
    /// The connection's mapping of the wal-index: the guard's own node, or SQLite's.
    wal_index: crate::vfs::wal_index::ShmSlot,
    /// The WAL-base record this connection writes, and what it did with a stale WAL.
    stale_wal: StaleWalSlot,
    /// The WAL-reset rule's state for this connection (`crate::wal_reset::slot`).
    wal_reset: WalResetSlot,
    /// The connection's close, as its siblings see it (`state/open_here.rs`).
    closing: open_here::Closing,
    inner: Mutex<Inner>,
}

/// The database's pathnames.
struct Paths {
    db: PathBuf,
    wal: PathBuf,
    /// `<db>-shm`, where SQLite's unix VFS names the shared memory.
    shm: PathBuf,
}

#[derive(Default)]
struct Inner {
    /// The identities pinned and what was seen of them (`state/pins.rs`).
    pins: pins::Pins,
    /// The retirement and the capture (`state/loss.rs`).
    loss: loss::Loss,
    /// The WAL file object's write gate (`state/wal_gate.rs`).
    wal_gate: wal_gate::WalGateSlot,
    /// The connection's mapping of the wal-index, while region 0 is mapped.
    wal_index: Option<Box<dyn WalIndex>>,
    /// What the close did with the generation.
    close: Close,
}

/// What the close did with the generation.
#[derive(Default)]
struct Close {
    /// The retired generation was healed back into the main file at close.
    healed: bool,
    /// A WAL left for an opener (`state/left.rs`): the close's checkpoint could not run and left
    /// committed frames past `nBackfill` (set as the `-shm` is unmapped).
    frames_left: bool,
    /// This close left its WAL, pinned, for the opener of this process inside its open.
    left: bool,
}

/// The shared memory as a connection maps it: read at the loss for how far the retired WAL had
/// been checkpointed.
pub(crate) trait WalIndex: Send {
    /// The checkpoint progress now, `None` when the wal-index is not initialised.
    fn backfill(&self) -> Option<Backfill>;
    /// The salts of the generation the wal-index describes now (as the WAL header gives them),
    /// `None` when it is not initialised. A WAL reset writes them here before it writes a byte
    /// of the WAL file (its header comes with the generation's first frame), so the WAL file's
    /// header can lag behind them, never run ahead (`state/overwrite.rs`).
    fn salts(&self) -> Option<[u32; 2]>;
}

thread_local! {
    /// The WAL this thread's connection just closed: `sqlite3WalClose` closes the WAL and then,
    /// on the same thread, calls `xDelete(<db>-wal)`, which must only remove the inode that
    /// connection pinned. Per thread, so two connections closing on two threads never mix.
    static JUST_CLOSED_WAL: RefCell<Option<(PathBuf, FileId)>> = const { RefCell::new(None) };
}

impl ConnectionState {
    /// `main_fd`: SQLite's descriptor of the main file, when the shim can see into the wrapped
    /// file (the directory is then found when needed, see `state/dir.rs`).
    #[cfg(test)]
    pub(crate) fn new(db_path: PathBuf, main_fd: Option<RawFd>) -> Arc<ConnectionState> {
        ConnectionState::new_pinned(db_path, main_fd, None)
    }

    /// [`ConnectionState::new`], the main file pinned to `main_id` when SQLite's own `fstat` of its
    /// descriptor gave it (no `stat` of the path; the first full check compares the path with
    /// it), else to what the path names now.
    pub(crate) fn new_pinned(
        db_path: PathBuf,
        main_fd: Option<RawFd>,
        main_id: Option<FileId>,
    ) -> Arc<ConnectionState> {
        let parent = db_path.parent().filter(|p| !p.as_os_str().is_empty());
        let (dir_id, filesystem, watch) = match parent
            .and_then(|p| ConnectionState::directory_from_sibling(main_id, &db_path, p))
        {
            Some((id, fs, watch)) => (Some(id), Some(fs), Some(watch)),
            None => {
                // The directory's identity (one `stat`) gives the filesystem (remembered per
                // device) and the slot to find the directory by later.
                let dir_id = parent.and_then(|p| identity_of_path(p).ok().flatten());
                let filesystem = parent
                    .zip(dir_id)
                    .and_then(|(p, id)| crate::filesystem::at_open(&db_path, p, id.dev));
                // Watch first, pin second: a change after the pin is then always seen. (A pin
                // from SQLite's descriptor, taken before the watch, is only vouched for after
                // a full check that compares the path with it.)
                let watch = match (parent, &filesystem) {
                    (Some(p), Some(fs)) if fs.local => DirWatch::new_local(p),
                    _ => None,
                };
                (dir_id, filesystem, watch)
            }
        };
        if let (Some(watch), Some(name)) = (&watch, db_path.file_name()) {
            watch.track(name);
        }
        let directory = dir::Directory::at_open(&db_path, main_fd, dir_id, filesystem);
        let main_id = match main_id.map_or_else(|| identity_of_path(&db_path), |id| Ok(Some(id))) {
            Ok(id) => id,
            Err(e) => {
                log::error!(
                    "hermes-guard: cannot stat {} to pin it: {e}; its replacement will go unseen",
                    db_path.display()
                );
                None
            }
        };
        Arc::new(ConnectionState {
            directory,
            closing: open_here::Closing::default(),
            paths: Paths {
                wal: sidecar(&db_path, "-wal"),
                shm: sidecar(&db_path, "-shm"),
                db: db_path,
            },
            checks: checks::Checks::new(),
            frames: frames::Frames::default(),
            base: base_slot::BaseSlot::default(),
            watches: watches::Watches::new(watch),
            shield: Shield::new(),
            wal_index: Default::default(),
            stale_wal: StaleWalSlot::default(),
            wal_reset: WalResetSlot::new(),
            inner: Mutex::new(Inner {
                pins: pins::Pins {
                    main_id,
                    ..pins::Pins::default()
                },
                ..Inner::default()
            }),
        })
    }

    /// `<db>-shm`, where SQLite's unix VFS names the shared memory.
    pub(crate) fn shm_path(&self) -> &Path {
        &self.paths.shm
    }

    pub(crate) fn db_path(&self) -> &Path {
        &self.paths.db
    }

    /// The stale-WAL slot (`vfs/stale_wal/`).
    pub(crate) fn stale_wal(&self) -> &StaleWalSlot {
        &self.stale_wal
    }

    /// Runs `f` on the pinned WAL (its WAL-base record is written through it).
    pub(crate) fn with_pinned_wal<R>(&self, f: impl FnOnce(&PinnedWal) -> R) -> Option<R> {
        self.inner.lock().pins.wal.as_ref().map(f)
    }

    pub(crate) fn wal_index(&self) -> &crate::vfs::wal_index::ShmSlot {
        &self.wal_index
    }

    pub(crate) fn shield(&self) -> &Shield {
        &self.shield
    }

    /// The pinned main file, if its `stat` at the open succeeded.
    pub(crate) fn main_id(&self) -> Option<FileId> {
        self.inner.lock().pins.main_id
    }

    /// The current write transaction's frames (`state/frames.rs`).
    pub(crate) fn frames(&self) -> &frames::Frames {
        &self.frames
    }

    pub(crate) fn is_retired(&self) -> bool {
        self.checks.retired.load(Ordering::Acquire)
    }

    /// Whether the pinned WAL's descriptor is still held (for the status's count).
    pub(crate) fn holds_wal(&self) -> bool {
        self.inner.lock().pins.wal.is_some()
    }

    pub(crate) fn wal_pinned(&self) -> bool {
        self.checks.wal_pinned.load(Ordering::Acquire)
    }

    /// Closes (`true`) the WAL's write gate until a WAL-base record's header is written, or
    /// opens it again as the rest of the state allows (`vfs/stale_wal/`).
    pub(crate) fn hold_wal_gate_for_header(&self, hold: bool) {
        let mut inner = self.inner.lock();
        inner.wal_gate.header_record = hold;
        inner.sync_wal_gate(self.checks.main_above_shared.load(Ordering::Acquire));
    }

    pub(crate) fn set_main_image(&self, image: Option<Box<dyn ImageSource + Send>>) {
        self.inner.lock().loss.main_image = image;
    }

    /// How the base pages are read from the main file (`state/base_pages.rs`).
    pub(crate) fn set_base_reader(&self, reader: Box<dyn ImageSource + Send>) {
        *self.base.reader.lock() = Some(reader);
    }

    /// Whether the database is on a local filesystem (inotify sees every change there).
    pub(crate) fn on_local_filesystem(&self) -> bool {
        self.directory.on_local_filesystem()
    }

    /// The filesystem the database is on, when WAL mode is not safe there and the policy
    /// (`HERMES_GUARD_UNSAFE_FS=refuse`) refuses it.
    pub(crate) fn wal_refused_on(&self) -> Option<&Filesystem> {
        self.directory.filesystem.as_ref().filter(|f| {
            !f.wal_safe
                && crate::filesystem::unsafe_fs_policy()
                    == crate::filesystem::UnsafeFsPolicy::Refuse
        })
    }

    pub(crate) fn status(&self) -> GuardStatus {
        self.check_pins();
        let (shield_active, shield_off_reason) = self.shield.status();
        let shield_shm_active = self.wal_index.dead_man_switch_held();
        // Before this state's lock: the held list locks the held states.
        let (held_generations, held_descriptors) = super::held::counts();
        // Before this state's lock too: it reads this state's main identity.
        let retired_connections_here = self.retired_open_here();
        let inner = self.inner.lock();
        GuardStatus {
            database: self.paths.db.clone(),
            retired: inner.loss.reason.is_some(),
            reason: inner.loss.reason,
            main: inner.pins.main_id,
            wal: inner.pins.wal_id(),
            shm: inner.pins.shm_id,
            capture: inner.loss.capture.as_deref().map(|at| self.capture_now(at)),
            capture_error: inner.loss.capture_error.clone(),
            refusals: self.checks.refusals.load(Ordering::Relaxed),
            backfill_at_loss: inner.loss.backfill_at_loss,
            main_torn: inner.loss.backfill_at_loss.is_some_and(|b| b.tears_main()),
            shield_active,
            shield_shm_active,
            shield_off_reason,
            capture_attempts: inner.loss.backoff.failures(),
            let_go: inner.loss.let_go.clone(),
            held_generations,
            held_descriptors,
            generations_let_go: retry::let_go_total(),
            log_lines_suppressed: retry::suppressed_lines(),
            stale_wal: self.stale_wal.report(),
            retired_connections_here,
            wal_reset_guard: self.wal_reset.is_on(),
            wal_resets_deferred: self.wal_reset.deferred(),
            wal_resets_guarded: self.wal_reset.guarded(),
            wal_index_alarms: self.wal_reset.alarms(),
            filesystem: self.directory.filesystem.as_ref().map(|f| f.name.clone()),
            wal_safe: self.directory.filesystem.as_ref().map(|f| f.wal_safe),
        }
    }

    /// Whether `<db>-shm` may be unlinked by this connection's close: only while it still
    /// resolves to the mapping this connection pinned.
    pub(crate) fn may_delete_shm(&self) -> bool {
        if self.is_retired() {
            return false;
        }
        let inner = self.inner.lock();
        let pinned = inner.pins.shm_id;
        pinned.is_none() || identity_of_path(self.shm_check_path(&inner)).ok().flatten() == pinned
    }
}

/// Whether the VFS may delete `path`: a WAL this thread's connection just closed may be deleted
/// only while the pathname still resolves to the inode that connection pinned.
pub(crate) fn may_delete(path: &Path) -> bool {
    let pinned = JUST_CLOSED_WAL.with(|j| {
        let mut j = j.borrow_mut();
        match j.as_ref() {
            Some((closed, _)) if closed == path => j.take().map(|(_, id)| id),
            _ => None,
        }
    });
    match pinned {
        None => true,
        Some(id) => {
            let now = identity_of_path(path).ok().flatten();
            if now == Some(id) {
                true
            } else {
                log::warn!(
                    "hermes-guard: not deleting {}: it is no longer the WAL ({id}) this connection \
                     wrote (it now resolves to {now:?})",
                    path.display()
                );
                false
            }
        }
    }
}

impl super::stale_wal::Holder for ConnectionState {
    fn db_path(&self) -> &Path {
        ConnectionState::db_path(self)
    }

    fn main_id(&self) -> Option<FileId> {
        ConnectionState::main_id(self)
    }

    fn is_retired(&self) -> bool {
        ConnectionState::is_retired(self)
    }

    fn hold_wal_gate_for_header(&self, hold: bool) {
        ConnectionState::hold_wal_gate_for_header(self, hold)
    }

    fn overwritten_under_cache(&self, detail: &str) {
        ConnectionState::overwritten_under_cache(self, detail)
    }

    fn with_pinned_wal<R>(&self, f: impl FnOnce(&PinnedWal) -> R) -> Option<R> {
        ConnectionState::with_pinned_wal(self, f)
    }

    fn slot(&self) -> &StaleWalSlot {
        ConnectionState::stale_wal(self)
    }

    fn wal_seen_before_open(&self, id: Option<FileId>) {
        ConnectionState::wal_seen_before_open(self, id)
    }
}
