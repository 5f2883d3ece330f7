//! The guard's state for one open database file: the pinned generation, the retirement verdict and
//! the capture. Shared (by `Arc`) between the main file object and its WAL's file object. Safe
//! code: the shim hands it plain values.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::in_use;
use super::retry::{self, Backoff};
use super::shield::Shield;
use super::stale_wal::StaleWalSlot;
use super::watch::{DirWatch, FastWatch};
use crate::capture::{generation_size, sidecar, Captured, FailedCommit, ImageSource};
use crate::filesystem::Filesystem;
use crate::identity::{identity_of_path, FileId, FileStamp, PinnedWal};
use crate::status::{Backfill, GuardStatus, RetireReason};
use crate::walfile::SMALLEST_WAL_WITH_A_FRAME;

mod base;
mod base_pages;
mod capturing;
mod dir;
mod foreign_index;
mod frames;
mod freed_pages;
mod gates;
mod healing;
mod left;
mod open_here;
pub(in crate::vfs) mod overwrite;
mod pins;
#[cfg(test)]
mod tests;
mod tripwire;

pub(crate) use crate::wal_reset::slot::WalResetSlot;
use dir::DirSlot;
pub(crate) use frames::FRAME_HEADER;
pub(crate) use healing::MainFile;
pub(crate) use left::LeftWal;

const LOCK_CHECKED: u8 = 1;
const WAL_CHECKED: u8 = 2;
const MAIN_CHECKED: u8 = 4;

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

/// What a write's fast path decided ([`DbState::wal_write_gate`], [`DbState::main_write_gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Already checked for this transaction or checkpoint: go ahead.
    Go,
    /// A transaction or checkpoint starts here: check ([`DbState::check_fast`], else
    /// [`DbState::check`]).
    Check(Site),
    /// The generation is retired: refuse ([`DbState::refuse`], which may capture).
    Refuse,
}

pub(crate) struct DbState {
    db_path: PathBuf,
    wal_path: PathBuf,
    shm_path: PathBuf,
    /// Mirrors `inner.reason.is_some()` so the write path can refuse without the mutex.
    retired: AtomicBool,
    /// Mirrors `inner.wal.is_some()`.
    wal_pinned: AtomicBool,
    /// The main file is locked above SHARED: in WAL mode, `locking_mode=EXCLUSIVE` (SQLite
    /// then writes the WAL without its write lock), a journal-mode change or the close. The
    /// WAL's write gate is closed meanwhile (see [`WalGate`]).
    main_above_shared: AtomicBool,
    /// What was checked in the current transaction or checkpoint, as bits, in one word so that
    /// its end is one store:
    ///
    /// - [`LOCK_CHECKED`]: the WAL write lock is held, its check passed and the generation is
    ///   not retired: every WAL write until its release follows the frame rule, checked again
    ///   before each frame and after each commit (`state/frames.rs`). Cleared at the release, at the
    ///   commit and at the retirement (see [`DbState::write_lock`]).
    /// - [`WAL_CHECKED`]: without the write lock (`locking_mode=EXCLUSIVE` takes no shm locks),
    ///   a check passed for the WAL writes of the current transaction.
    /// - [`MAIN_CHECKED`]: a check passed for the current checkpoint (main-file writes).
    ///
    /// Only this connection's calls set bits; a retirement clears [`LOCK_CHECKED`] with an
    /// atomic read-modify-write, so no bit another writer cleared comes back.
    tx: AtomicU8,
    /// Offset of the last WAL write. A transaction writes forwards; a write at or below an
    /// earlier one is a new transaction after a rollback (or a rewrite within one, which only
    /// costs an extra check).
    last_wal_offset: AtomicI64,
    /// The current write transaction's frames: which WAL write is checked before it and which
    /// after it (`state/frames.rs`).
    frames: frames::Frames,
    /// The process's base-page store of this connection's WAL generation, while it is pinned
    /// (`state/base_pages.rs`).
    base_store: Mutex<Option<Arc<base_pages::BaseStore>>>,
    /// How the base pages are read from the main file: SQLite's descriptor of it where the shim
    /// sees into the unix VFS (`vfs/file/open.rs`), else the file object. Apart from `inner`, so
    /// that no read is made under the state's lock.
    base_reader: Mutex<Option<Box<dyn ImageSource + Send>>>,
    refusals: AtomicU64,
    /// This connection may have written the main file since `main_stamp` was taken (set at the
    /// gate of every checkpoint and main-file write, cleared by a full check that passes).
    main_written: AtomicBool,
    /// A checkpoint took its lock; its first main-file write judges the main file first, for an
    /// overwrite in place (`state/overwrite.rs`).
    main_judge_due: AtomicBool,
    /// The database directory's watch, and its generation at the last full check that passed:
    /// while they match, no name in the directory has changed, no directory above it moved and
    /// the mount table is the same, so a transaction start needs no `stat`.
    watch: Option<DirWatch>,
    /// The watch of the directory that holds the `-shm`, when that is not the database's (an
    /// `SQLITE_SHM_DIRECTORY` build, see [`DbState::pin_shm`]): its changes count too.
    /// `Some(None)`: the `-shm` is elsewhere and unwatched, so no watch vouches for this path.
    shm_watch: Mutex<Option<Option<DirWatch>>>,
    verified_generation: AtomicU64,
    /// The watcher-wide change count read at the start of the last full check that passed:
    /// while it stands, the fast path vouches with one `epoll_wait`. [`NEVER_VOUCHED`] before
    /// the first full check and from the retirement on (see [`DbState::check_fast`]).
    verified_changes: AtomicU64,
    /// `watch`'s lock-free half (NONE without a watch): what the fast check uses.
    fast_watch: FastWatch,
    /// The database's directory (`state/dir.rs`): found and held when a capture or a heal needs
    /// it, so it lands beside the database even if the directory was moved away.
    dir: Mutex<DirSlot>,
    /// The lock shield of this connection (`shield.rs`).
    shield: Shield,
    /// The connection's mapping of the wal-index: the guard's own node, or SQLite's.
    wal_index: crate::vfs::wal_index::ShmSlot,
    /// The WAL-base record this connection writes, and what it did with a stale WAL.
    stale_wal: StaleWalSlot,
    /// The WAL-reset rule's state for this connection (`crate::wal_reset::slot`).
    wal_reset: WalResetSlot,
    inner: Mutex<Inner>,
    /// The filesystem the database is on (found once per mount).
    filesystem: Option<Filesystem>,
    /// The database directory's identity at the open (shared with the connections opened beside
    /// this one, `state/open_here.rs`).
    dir_id: Option<FileId>,
    /// The connection has started to close (`state/open_here.rs`).
    closing: AtomicBool,
    /// This close leaves its checks to another connection of the generation, decided once per
    /// close (`state/open_here.rs`).
    left_to_sibling: AtomicBool,
}

#[derive(Default)]
struct Inner {
    main_id: Option<FileId>,
    wal: Option<PinnedWal>,
    shm_id: Option<FileId>,
    /// The `-shm`'s pathname when it is not `<db>-shm` ([`DbState::pin_shm`]).
    shm_check_path: Option<PathBuf>,
    /// What `<db>-wal` named just before SQLite opened it ([`DbState::wal_seen_before_open`]).
    wal_before_open: Option<FileId>,
    /// The `-shm` this connection maps, on the process's list while held (`in_use.rs`).
    shm_here: Option<in_use::ShmHere>,
    /// The (main file, WAL) pair this connection has open, on the process's list while held.
    wal_here: Option<in_use::WalHere>,
    reason: Option<RetireReason>,
    capture: Option<PathBuf>,
    capture_error: Option<String>,
    main_image: Option<Box<dyn ImageSource + Send>>,
    /// The connection's mapping of the wal-index, while region 0 is mapped.
    wal_index: Option<Box<dyn WalIndex>>,
    /// The checkpoint progress the wal-index showed when the generation was retired.
    backfill_at_loss: Option<Backfill>,
    /// This generation's capture, shared by every connection of the process that retired it;
    /// joined at the first capture attempt, left with the pinned WAL.
    generation: Option<Arc<GenerationCapture>>,
    /// The open WAL file object's write gate, while SQLite has it open.
    wal_gate: Option<Box<dyn WalGate>>,
    /// The capture's failed attempts and when the next automatic one may run (`retry.rs`).
    backoff: Backoff,
    /// The directory (as last known) whose deletion let this generation go uncaptured.
    let_go: Option<PathBuf>,
    /// The main file's stamp at the last full check that passed (`state/healing.rs`).
    main_stamp: Option<FileStamp>,
    /// The most names (hard links) the main file had at any full check: a file that ever had a
    /// second name is never judged the capture's own base (`state/base.rs`).
    most_links: u64,
    /// The retired generation was healed back into the main file at close.
    healed: bool,
    /// A capture beside the database failed for want of permission or space (`EACCES`,
    /// `EROFS`, `ENOSPC`, ...): if the fallback directory fails too, the heal at close does not
    /// wait for a capture (`state/healing.rs`).
    unwritable_beside: bool,
    /// A WAL-base record waits for the WAL header this transaction writes (`vfs/stale_wal/`):
    /// the WAL's gate stays closed until then.
    header_record: bool,
    /// A WAL left for an opener (`state/left.rs`): the close's checkpoint could not run and left committed
    /// frames past `nBackfill` (set as the `-shm` is unmapped).
    frames_left: bool,
    /// This close left its WAL, pinned, for the opener of this process inside its open.
    left: bool,
    /// The directory watch's creation counts of this database's names when its `-shm` was
    /// pinned (`state/base.rs`).
    creations_at_pin: Option<crate::vfs::watch::Creations>,
}

/// The write gate of the WAL file object, which the shim installs and the state opens and
/// closes. Open, SQLite's WAL writes go straight to the wrapped file with nothing of the
/// guard's in between: SQLite writes the WAL only under the WAL write lock (its sole writer),
/// and every acquisition of that lock ran the guard's check first, in the same transaction.
/// Closed, each WAL write goes through the guard's gate ([`DbState::wal_write_gate`]). It is
/// closed from the retirement on (every write refused) and while the main file is locked above
/// SHARED: `locking_mode=EXCLUSIVE` writes the WAL without taking the write lock.
///
/// The gate is only moved under the state's mutex and from inside the connection's own calls
/// (a retirement, a lock of the main file), which SQLite serialises with the WAL writes it
/// makes; the shim detaches it before it frees the WAL file object.
pub(crate) trait WalGate: Send {
    /// Opens (`true`) or closes the gate.
    fn set_open(&self, open: bool);
}

impl Inner {
    /// Opens or closes the WAL's gate as the generation and the main file's lock now require.
    fn sync_wal_gate(&self, main_above_shared: bool) {
        if let Some(gate) = &self.wal_gate {
            gate.set_open(self.reason.is_none() && !main_above_shared && !self.header_record);
        }
    }
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

/// One retired generation, as far as captures go: the process's connections that retired it
/// take one capture between them. Keyed by the pinned main file and WAL inodes; an inode number
/// cannot be reused while a pinned descriptor holds it, and the map holds only weak references,
/// so a key never outlives the descriptors that make it unique.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct GenerationKey {
    main: Option<FileId>,
    wal: FileId,
}

#[derive(Default)]
pub(crate) struct GenerationCapture {
    /// The capture and the WAL bytes it holds. Held across the capture, so connections that
    /// retire the same generation at once wait for the first one's capture instead of writing
    /// their own.
    done: Mutex<Option<Captured>>,
    /// A commit of the generation failed to the application after its frames were written: what
    /// reads the generation from its WAL leaves them out (`capture/unacknowledged.rs`).
    failed_commit: Mutex<Option<FailedCommit>>,
}

static GENERATIONS: Mutex<Option<HashMap<GenerationKey, Weak<GenerationCapture>>>> =
    Mutex::new(None);

impl GenerationCapture {
    /// The process's capture slot for `key`, made if none is alive.
    fn join(key: GenerationKey) -> Arc<GenerationCapture> {
        let mut map = GENERATIONS.lock();
        let map = map.get_or_insert_with(HashMap::new);
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        map.retain(|_, slot| slot.strong_count() > 0);
        let slot = Arc::new(GenerationCapture::default());
        map.insert(key, Arc::downgrade(&slot));
        slot
    }
}

impl Inner {
    /// The process's capture slot of this connection's generation, joined now if it was not;
    /// `None` without a pinned WAL.
    fn generation_slot(&mut self) -> Option<Arc<GenerationCapture>> {
        let key = GenerationKey {
            main: self.main_id,
            wal: self.wal.as_ref()?.id(),
        };
        Some(
            self.generation
                .get_or_insert_with(|| GenerationCapture::join(key))
                .clone(),
        )
    }

    /// The commit of this generation failed to the application, if any: its frames are no part
    /// of the generation.
    fn failed_commit(&self) -> Option<FailedCommit> {
        *self.generation.as_ref()?.failed_commit.lock()
    }

    /// Where the generation's bytes end in the pinned WAL: `None`, the whole file.
    fn generation_end(&self) -> Option<u64> {
        let failed = self.failed_commit()?;
        failed.end_in(self.wal.as_ref()?)
    }

    /// Whether the retired generation holds anything a capture would save. A replaced main file
    /// always does: its image is the retired data. After a lost `-wal`/`-shm` the main file is
    /// the live one, so only frames in the pinned WAL are at stake; a WAL without a whole frame
    /// (say, the fresh WAL of a connection born attached to an unlinked `-shm`) has none, and
    /// capturing it would only write a copy of the live database. No pinned WAL: nothing to
    /// capture from (rollback mode).
    fn worth_capturing(&self) -> bool {
        let Some(wal) = &self.wal else {
            return false;
        };
        if self.let_go.is_some() {
            // Its directory was deleted on purpose: nothing is held for it (`retry.rs`).
            return false;
        }
        match self.reason {
            Some(RetireReason::MainReplaced | RetireReason::MainOverwritten) => true,
            // Unknown size: capture rather than risk losing frames.
            _ => generation_size(wal, self.failed_commit().as_ref())
                .map_or(true, |n| n >= SMALLEST_WAL_WITH_A_FRAME),
        }
    }
}

thread_local! {
    /// The WAL this thread's connection just closed: `sqlite3WalClose` closes the WAL and then,
    /// on the same thread, calls `xDelete(<db>-wal)`, which must only remove the inode that
    /// connection pinned. Per thread, so two connections closing on two threads never mix.
    static JUST_CLOSED_WAL: RefCell<Option<(PathBuf, FileId)>> = const { RefCell::new(None) };
}

impl DbState {
    /// `main_fd`: SQLite's descriptor of the main file, when the shim can see into the wrapped
    /// file (the directory is then found when needed, see `state/dir.rs`).
    #[cfg(test)]
    pub(crate) fn new(db_path: PathBuf, main_fd: Option<RawFd>) -> Arc<DbState> {
        DbState::new_pinned(db_path, main_fd, None)
    }

    /// [`DbState::new`], the main file pinned to `main_id` when SQLite's own `fstat` of its
    /// descriptor gave it (no `stat` of the path; the first full check compares the path with
    /// it), else to what the path names now.
    pub(crate) fn new_pinned(
        db_path: PathBuf,
        main_fd: Option<RawFd>,
        main_id: Option<FileId>,
    ) -> Arc<DbState> {
        let parent = db_path.parent().filter(|p| !p.as_os_str().is_empty());
        let (dir_id, filesystem, watch) =
            match parent.and_then(|p| DbState::directory_from_sibling(main_id, &db_path, p)) {
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
        let dir = Mutex::new(DirSlot::at_open(&db_path, main_fd, dir_id));
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
        let fast_watch = watch.as_ref().map_or(FastWatch::NONE, DirWatch::fast);
        Arc::new(DbState {
            filesystem,
            dir_id,
            closing: AtomicBool::new(false),
            left_to_sibling: AtomicBool::new(false),
            wal_path: sidecar(&db_path, "-wal"),
            shm_path: sidecar(&db_path, "-shm"),
            db_path,
            retired: AtomicBool::new(false),
            wal_pinned: AtomicBool::new(false),
            main_above_shared: AtomicBool::new(false),
            tx: AtomicU8::new(0),
            last_wal_offset: AtomicI64::new(i64::MAX),
            frames: frames::Frames::default(),
            base_store: Mutex::new(None),
            base_reader: Mutex::new(None),
            refusals: AtomicU64::new(0),
            main_judge_due: AtomicBool::new(false),
            main_written: AtomicBool::new(true),
            watch,
            shm_watch: Mutex::new(None),
            verified_generation: AtomicU64::new(u64::MAX),
            verified_changes: AtomicU64::new(NEVER_VOUCHED),
            fast_watch,
            dir,
            shield: Shield::new(),
            wal_index: Default::default(),
            stale_wal: StaleWalSlot::default(),
            wal_reset: WalResetSlot::new(),
            inner: Mutex::new(Inner {
                main_id,
                ..Inner::default()
            }),
        })
    }

    /// `<db>-shm`, where SQLite's unix VFS names the shared memory.
    pub(crate) fn shm_path(&self) -> &Path {
        &self.shm_path
    }

    pub(crate) fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// The stale-WAL slot (`vfs/stale_wal/`).
    pub(crate) fn stale_wal(&self) -> &StaleWalSlot {
        &self.stale_wal
    }

    /// Runs `f` on the pinned WAL (its WAL-base record is written through it).
    pub(crate) fn with_pinned_wal<R>(&self, f: impl FnOnce(&PinnedWal) -> R) -> Option<R> {
        self.inner.lock().wal.as_ref().map(f)
    }

    pub(crate) fn wal_index(&self) -> &crate::vfs::wal_index::ShmSlot {
        &self.wal_index
    }

    pub(crate) fn shield(&self) -> &Shield {
        &self.shield
    }

    /// The pinned main file, if its `stat` at the open succeeded.
    pub(crate) fn main_id(&self) -> Option<FileId> {
        self.inner.lock().main_id
    }

    /// The current write transaction's frames (`state/frames.rs`).
    pub(crate) fn frames(&self) -> &frames::Frames {
        &self.frames
    }

    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Whether the pinned WAL's descriptor is still held (for the status's count).
    pub(crate) fn holds_wal(&self) -> bool {
        self.inner.lock().wal.is_some()
    }

    pub(crate) fn wal_pinned(&self) -> bool {
        self.wal_pinned.load(Ordering::Acquire)
    }

    /// Closes (`true`) the WAL's write gate until a WAL-base record's header is written, or
    /// opens it again as the rest of the state allows (`vfs/stale_wal/`).
    pub(crate) fn hold_wal_gate_for_header(&self, hold: bool) {
        let mut inner = self.inner.lock();
        inner.header_record = hold;
        inner.sync_wal_gate(self.main_above_shared.load(Ordering::Acquire));
    }

    pub(crate) fn set_main_image(&self, image: Option<Box<dyn ImageSource + Send>>) {
        self.inner.lock().main_image = image;
    }

    /// How the base pages are read from the main file (`state/base_pages.rs`).
    pub(crate) fn set_base_reader(&self, reader: Box<dyn ImageSource + Send>) {
        *self.base_reader.lock() = Some(reader);
    }

    /// Whether the database is on a local filesystem (inotify sees every change there).
    pub(crate) fn on_local_filesystem(&self) -> bool {
        self.filesystem.as_ref().is_some_and(|f| f.local)
    }

    /// The filesystem the database is on, when WAL mode is not safe there and the policy
    /// (`HERMES_GUARD_UNSAFE_FS=refuse`) refuses it.
    pub(crate) fn wal_refused_on(&self) -> Option<&Filesystem> {
        self.filesystem.as_ref().filter(|f| {
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
            database: self.db_path.clone(),
            retired: inner.reason.is_some(),
            reason: inner.reason,
            main: inner.main_id,
            wal: inner.wal.as_ref().map(PinnedWal::id),
            shm: inner.shm_id,
            capture: inner.capture.as_deref().map(|at| self.capture_now(at)),
            capture_error: inner.capture_error.clone(),
            refusals: self.refusals.load(Ordering::Relaxed),
            backfill_at_loss: inner.backfill_at_loss,
            main_torn: inner.backfill_at_loss.is_some_and(|b| b.tears_main()),
            shield_active,
            shield_shm_active,
            shield_off_reason,
            capture_attempts: inner.backoff.failures(),
            let_go: inner.let_go.clone(),
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
            filesystem: self.filesystem.as_ref().map(|f| f.name.clone()),
            wal_safe: self.filesystem.as_ref().map(|f| f.wal_safe),
        }
    }

    /// Whether `<db>-shm` may be unlinked by this connection's close: only while it still
    /// resolves to the mapping this connection pinned.
    pub(crate) fn may_delete_shm(&self) -> bool {
        if self.is_retired() {
            return false;
        }
        let inner = self.inner.lock();
        let pinned = inner.shm_id;
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

impl super::stale_wal::Holder for DbState {
    fn db_path(&self) -> &Path {
        DbState::db_path(self)
    }

    fn main_id(&self) -> Option<FileId> {
        DbState::main_id(self)
    }

    fn is_retired(&self) -> bool {
        DbState::is_retired(self)
    }

    fn hold_wal_gate_for_header(&self, hold: bool) {
        DbState::hold_wal_gate_for_header(self, hold)
    }

    fn overwritten_under_cache(&self, detail: &str) {
        DbState::overwritten_under_cache(self, detail)
    }

    fn with_pinned_wal<R>(&self, f: impl FnOnce(&PinnedWal) -> R) -> Option<R> {
        DbState::with_pinned_wal(self, f)
    }

    fn slot(&self) -> &StaleWalSlot {
        DbState::stale_wal(self)
    }

    fn wal_seen_before_open(&self, id: Option<FileId>) {
        DbState::wal_seen_before_open(self, id)
    }
}
