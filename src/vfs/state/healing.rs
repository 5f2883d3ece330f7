//! Healing at close: a lone connection's lost `-wal` (or `-shm`) checkpointed back into the main
//! file, as stock SQLite's close would have done, when — and only when — it is provably safe.
//!
//! Stock SQLite keeps committing into an unlinked WAL and its close checkpoints those frames
//! back into the main file: for a connection nobody else touched, that is right, and the rows
//! are in the live file afterwards. The guard refuses the writes (it cannot know that nobody
//! will create a newer generation) and captures the generation; at the close it can know
//! whether anybody did. The obligations, each checked at the main file's close, after the
//! capture is written, and again under SQLite's EXCLUSIVE lock on the main file:
//!
//! 1. The generation retired for a lost `-wal` or `-shm` (never a replaced main file), its
//!    capture is written, and the pinned WAL is still held.
//! 2. **The main file is what this connection last saw**: the same inode, and the same size,
//!    `st_mtime` and `st_ctime` as at the last full check that passed, with no checkpoint or
//!    main-file write of this connection's since (`Checks::main_written`, `state/checks.rs`).
//!    The kernel moves both times at every write by anyone, and `st_ctime` cannot be set back:
//!    equal stamps mean no newer generation checkpointed into it, nothing was copied over it
//!    (`cp` keeps the inode), no peer of the old generation checkpointed.
//! 3. **Nothing newer is at the path**: no `-wal` but the pinned one (none at all after a lost
//!    `-wal`) and no `-shm`. A newer generation that is open has both.
//! 4. **Nobody is inside**: the guard takes SHARED and then EXCLUSIVE on the main file through
//!    the connection's own file object (SQLite's locks, seen by every process and by the unix
//!    VFS's own bookkeeping in this one); anybody holding the database open in any mode refuses
//!    it. Under the lock, 2 and 3 are checked again: a process that opens the database now
//!    cannot read its header, so it cannot create a newer WAL, until the lock goes.
//!
//! Then the committed prefix of the pinned WAL is written into the main file frame by frame in
//! WAL order (each page's last committed version wins, exactly what a full checkpoint leaves),
//! the file is truncated to the database size of the last commit, synced, and unlocked. Any
//! failure on the way leaves the capture as the only copy, as without healing.

use std::collections::HashSet;
use std::ffi::{c_int, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rusqlite::ffi;
use rustix::fs::AtFlags;

use super::heal_error::HealError;
use super::heal_staging::{stage, Staged};
use super::prefix::{committed_prefix, Prefix};
use super::{ConnectionState, Inner};
use crate::capture::fallback;
use crate::capture::healed::{write_record, HealPhase, HealRecord, PutBack};
use crate::identity::{identity_of_path, stamp_of_path, FileId, PinnedWal};
use crate::paths::{sync_dir, DirHandle};
use crate::permissions::Permissions;
use crate::status::RetireReason;
use crate::walfile::{WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// The calls a heal makes on the main file: the connection's own wrapped file object, through
/// its own methods (`file.rs`). Each returns an SQLite result code.
pub(crate) trait MainFile {
    fn lock(&self, level: c_int) -> c_int;
    fn unlock(&self, level: c_int) -> c_int;
    fn write_at(&self, bytes: &[u8], offset: i64) -> c_int;
    fn truncate(&self, size: i64) -> c_int;
    fn sync(&self) -> c_int;
}

/// Obligation 1, from what the state holds: a heal may follow. A generation whose capture could not
/// be written for want of permission or space (beside the database, and in the fallback directory)
/// is healed all the same when the other obligations hold: that is stock SQLite's outcome, never
/// worse. Any other capture failure keeps the generation held for a retry, as before.
pub(super) fn may_heal(inner: &Inner) -> bool {
    matches!(
        inner.loss.reason,
        Some(RetireReason::WalLost | RetireReason::ShmLost)
    ) && (inner.loss.capture.is_some()
        || (inner.loss.capture_error.is_some() && inner.loss.unwritable_beside))
        && !inner.close.healed
        && inner.loss.let_go.is_none()
        && inner.pins.wal.is_some()
}

/// What a heal wrote.
struct Healed {
    frames: u64,
    commits: u64,
    pages: u64,
}

impl ConnectionState {
    /// Whether a sync of the main file ends a checkpoint of this connection's whose result is
    /// not stamped yet (WAL mode, live generation). Atomics only.
    pub(crate) fn stamp_due(&self) -> bool {
        self.checks
            .main_written
            .load(std::sync::atomic::Ordering::Acquire)
            && self.wal_pinned()
            && !self.is_retired()
    }

    /// Stamps the main file as this connection's checkpoint just left it (after its writes,
    /// truncate and sync): from now on a heal compares with this. A stamp of another inode than
    /// the pinned one is not kept (the next check retires the generation).
    pub(crate) fn stamp_main(&self) {
        let Ok(Some(now)) = stamp_of_path(&self.paths.db) else {
            return;
        };
        let mut inner = self.inner.lock();
        if inner.pins.main_id == Some(now.id) && inner.loss.reason.is_none() {
            self.saw_links(&mut inner, now.links);
            inner.pins.main_stamp = Some(now);
            self.checks
                .main_written
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// At the main file's close (before the wrapped file is closed): heals the retired
    /// generation into the main file when every obligation holds, and says so at WARN; does
    /// nothing otherwise (said at INFO when a heal was possible in principle).
    /// Returns whether the generation is healed (now, or by an earlier call).
    pub(crate) fn heal_at_close(&self, main: &dyn MainFile) -> bool {
        let mut inner = self.inner.lock();
        if inner.close.healed {
            return true;
        }
        if !may_heal(&inner) {
            return false;
        }
        let kept = if inner.loss.capture.is_some() {
            "its retired generation stays in the capture only"
        } else {
            "its retired generation stays in the descriptors this process holds"
        };
        if let Err(why) = self.nothing_newer(&inner) {
            log::info!(
                "hermes-guard: not healing {} at close: {why}; {kept}",
                self.paths.db.display()
            );
            return false;
        }
        let started = Instant::now();
        let result = self.heal_locked(&inner, main);
        inner.close.healed = result.is_ok();
        match result {
            // ERROR, not WARN: the guard could keep no copy anywhere, which needs the operator's
            // eye (a directory or HOME it cannot write), even though no row is lost.
            Ok(h) if inner.loss.capture.is_none() => log::error!(
                "hermes-guard: healed {} at close WITHOUT a copy: its capture could not be written \
                 anywhere ({}), but nothing newer had touched the database, so the retired \
                 generation's {} frame(s) ({} commit(s)) were checkpointed back into the main \
                 file, as SQLite's own close would have done; every row is live, and no capture \
                 of them exists",
                self.paths.db.display(),
                inner.loss.capture_error.as_deref().unwrap_or("unknown error"),
                h.frames,
                h.commits
            ),
            Ok(h) => {
                log::warn!(
                    "hermes-guard: healed {} at close: nothing newer had touched it, so the \
                     retired generation's {} frame(s) ({} commit(s), {} page(s)) were \
                     checkpointed back into the main file, as SQLite's own close would have done \
                     ({:?}); the capture {} stays as a copy",
                    self.paths.db.display(),
                    h.frames,
                    h.commits,
                    h.pages,
                    started.elapsed(),
                    inner
                        .loss
                        .capture
                        .as_deref()
                        .map(|c| c.display().to_string())
                        .unwrap_or_default()
                );
            }
            Err(why) => log::info!(
                "hermes-guard: not healing {} at close: {why}; {kept}",
                self.paths.db.display()
            ),
        }
        inner.close.healed
    }

    /// Obligations 2 and 3.
    fn nothing_newer(&self, inner: &Inner) -> Result<(), HealError> {
        if self
            .checks
            .main_written
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(HealError::MainWrittenHere);
        }
        let Some(then) = inner.pins.main_stamp else {
            return Err(HealError::NeverStamped);
        };
        let db = &self.paths.db;
        let now = stamp_of_path(db).map_err(|source| HealError::StatMain {
            path: db.clone(),
            source,
        })?;
        if now != Some(then) {
            return Err(HealError::MainChanged { path: db.clone() });
        }
        let wal = inner.pins.wal_id();
        let lost_shm = inner.loss.reason == Some(RetireReason::ShmLost);
        let wal_path = &self.paths.wal;
        match identity_of_path(wal_path).map_err(|source| HealError::StatWal {
            path: wal_path.clone(),
            source,
        })? {
            None => {}
            Some(id) if Some(id) == wal && lost_shm => {}
            Some(found) => {
                return Err(HealError::NewerWal {
                    path: wal_path.clone(),
                    found,
                    retired: wal,
                })
            }
        }
        // After a lost -wal the connection's own -shm is still at the path: an opener since would
        // have made a -wal there (checked above) or written the main file (its stamp, checked
        // first). Any other -shm is a newer generation's.
        let shm_path = self.shm_check_path(inner);
        match identity_of_path(shm_path).map_err(|source| HealError::StatShm {
            path: shm_path.to_path_buf(),
            source,
        })? {
            None => {}
            Some(id) if Some(id) == inner.pins.shm_id && !lost_shm => {}
            Some(found) => {
                return Err(HealError::NewerShm {
                    path: shm_path.to_path_buf(),
                    found,
                })
            }
        }
        Ok(())
    }

    /// Obligation 4, the checks again under the lock, and the copy.
    fn heal_locked(&self, inner: &Inner, main: &dyn MainFile) -> Result<Healed, HealError> {
        if main.lock(ffi::SQLITE_LOCK_SHARED) != ffi::SQLITE_OK {
            return Err(HealError::SharedRefused);
        }
        let result = if main.lock(ffi::SQLITE_LOCK_EXCLUSIVE) != ffi::SQLITE_OK {
            Err(HealError::ExclusiveRefused)
        } else {
            self.nothing_newer(inner)
                .and_then(|()| put_back_and_checkpoint(self, inner, main))
        };
        main.unlock(ffi::SQLITE_LOCK_NONE);
        result
    }
}

/// What a heal works with, found before it writes anything.
struct Plan<'a> {
    wal: &'a PinnedWal,
    /// The database's directory: `None` when it could not be found (or is only reachable by a
    /// relative path).
    dir: Option<Arc<DirHandle>>,
    /// The WAL's name in it.
    name: OsString,
    /// The capture the heal is recorded in, and its directory, open.
    record_in: Option<(&'a Path, OwnedFd)>,
    /// The database's permissions: the staged WAL and the heal record get them.
    permissions: Permissions,
    prefix: Prefix,
    record: HealRecord,
}

/// The heal proper, under the EXCLUSIVE lock, crash-safe at every step the way SQLite's own
/// checkpoint is, and recorded in the capture (`healed.json`, see `capture/healed.rs`) so that
/// its rows are never merged twice. The order of writes and syncs:
///
/// 1. After a lost `-wal`: the retired WAL's committed prefix is written to a new file beside the
///    database (`<db>-wal.hermes-guard-heal-<pid>`), fsynced, the directory fsynced.
/// 2. `healed.json` phase `started`, naming that file and its inode, durably.
/// 3. The file is renamed to `<db>-wal` (never over anything), the directory fsynced: the commit
///    point. From here any open replays the WAL at the path as after a crash.
/// 4. The frames are written into the main file in WAL order, the file truncated to the last
///    commit's size and synced.
/// 5. `healed.json` phase `done`, durably.
/// 6. The WAL at the path is unlinked (if it is still the one put there, or after a lost `-shm`
///    the pinned one), the directory fsynced.
///
/// A crash before 3 leaves the main file untouched and, with a `started` record, the staging
/// file in place: the heal reads as rolled back. A crash from 3 on leaves the WAL at the path
/// (or, after 6, the main file complete): the heal reads as done, the rows are live. After a
/// lost `-shm` the WAL never left the path: steps 1 and 3 fall away.
fn put_back_and_checkpoint(
    state: &ConnectionState,
    inner: &Inner,
    main: &dyn MainFile,
) -> Result<Healed, HealError> {
    let mut plan = plan(state, inner)?;
    let staged = stage_prefix(state, &plan, inner.pins.wal_id())?;
    if let Some(staged) = &staged {
        plan.record.put_back = Some(PutBack {
            suffix: staged.suffix.clone(),
            identity: staged.id,
            bytes: Some(staged.bytes),
            sha256: Some(staged.sha256.clone()),
        });
    }
    let placed = record_start_and_place(state, &plan, staged.as_ref(), inner.pins.wal_id())?;
    let pages = copy_frames(&plan, main)?;
    finish(state, &mut plan, placed);
    Ok(Healed {
        frames: plan.prefix.frames,
        commits: plan.prefix.commits,
        pages,
    })
}

/// What the heal needs before it writes: the pinned WAL, the directory (none at all with a
/// capture: the heal does not happen), the capture's directory to record in, the database's
/// permissions and the WAL's committed prefix.
fn plan<'a>(state: &ConnectionState, inner: &'a Inner) -> Result<Plan<'a>, HealError> {
    let wal = inner.pins.wal.as_ref().ok_or(HealError::NoPinnedWal)?;
    // Read-only, or `O_PATH` for a directory this process may write in but not list.
    // None at all (it could not be found, or is only reachable by a relative path): a generation
    // with a capture stays capture-only (the crash-safe steps need the directory); one that no
    // capture could be written for is healed in place, as SQLite's own close would.
    let dir = state.dir();
    if dir.is_none() && inner.loss.capture.is_some() {
        return Err(HealError::NoDirectory {
            database: state.paths.db.clone(),
        });
    }
    let name = state
        .paths
        .wal
        .file_name()
        .ok_or_else(|| HealError::NoWalName {
            path: state.paths.wal.clone(),
        })?
        .to_owned();
    // The record goes into the capture — beside the database (through its directory, wherever
    // that went), else (a fallback capture directory) by its path. A generation no capture could
    // be written for is healed without one: nothing to record, nothing could merge it twice.
    let record_in = match inner.loss.capture.as_deref() {
        Some(capture) => {
            let beside = capture
                .file_name()
                .zip(dir.as_ref())
                .and_then(|(name, dir)| crate::paths::open_dir(dir.fd(), Path::new(name)).ok());
            let fd = beside
                .map_or_else(|| crate::paths::open_dir(rustix::fs::CWD, capture), Ok)
                .map_err(|source| HealError::OpenCapture {
                    capture: capture.to_path_buf(),
                    source,
                })?;
            Some((capture, fd))
        }
        None => None,
    };
    // The database's permissions: the staged WAL (the database's `-wal` once renamed into
    // place) and the heal record get them, as SQLite's own `-wal` does.
    let permissions = match dir.as_ref() {
        Some(d) => Permissions::of_database_in(d.fd(), &state.paths.db),
        None => Permissions::of_database(&state.paths.db),
    };
    let prefix = committed_prefix(wal, inner.generation_end())?;
    let record = HealRecord {
        v: 1,
        phase: HealPhase::Started,
        at: now(),
        pid: std::process::id(),
        main: inner.pins.main_id,
        frames: prefix.frames,
        commits: prefix.commits,
        put_back: None,
    };
    Ok(Plan {
        wal,
        dir,
        name,
        record_in,
        permissions,
        prefix,
        record,
    })
}

/// Step 1: the committed prefix staged beside the database, after a lost `-wal` (`pinned`: the
/// pinned WAL's identity). `None` when the WAL is still at the path (a lost `-shm`: it is the
/// crash-safe copy already), or when nothing can be staged and no copy of the generation exists
/// (healed in place, as stock SQLite's close does: not crash-safe, never worse).
fn stage_prefix(
    state: &ConnectionState,
    plan: &Plan<'_>,
    pinned: Option<FileId>,
) -> Result<Option<Staged>, HealError> {
    let wal_at_path = identity_of_path(&state.paths.wal).ok().flatten() == pinned;
    match &plan.dir {
        _ if wal_at_path => Ok(None),
        // No directory to stage in, and (checked in `plan`) no capture: in place.
        None => {
            log::warn!(
                "hermes-guard: the retired WAL of {} cannot be put back beside it (no descriptor \
                 of its directory): healing it straight into the main file, as SQLite's own \
                 close does",
                state.paths.db.display()
            );
            Ok(None)
        }
        Some(dir) => match stage(
            dir,
            &plan.name,
            plan.wal.file(),
            plan.prefix.bytes(),
            &plan.permissions,
        ) {
            Ok(staged) => Ok(Some(staged)),
            Err(e) if plan.record_in.is_none() && fallback::wants_fallback(&e) => {
                log::warn!(
                    "hermes-guard: the retired WAL of {} cannot be put back beside it ({e}): \
                     healing it straight into the main file, as SQLite's own close does",
                    state.paths.db.display()
                );
                Ok(None)
            }
            Err(source) => Err(HealError::Stage {
                wal: plan.wal.id(),
                source,
            }),
        },
    }
}

/// Steps 2 and 3: the `started` record, durably, then the staged WAL renamed to `<db>-wal` (the
/// commit point). The WAL at the path afterwards: the one put there, or (nothing staged) the
/// pinned one. A failure before the commit point rolls the heal back.
fn record_start_and_place(
    state: &ConnectionState,
    plan: &Plan<'_>,
    staged: Option<&Staged>,
    pinned: Option<FileId>,
) -> Result<FileId, HealError> {
    let recorded = match &plan.record_in {
        Some((capture, d)) => {
            write_record(d.as_fd(), &plan.record, &plan.permissions).map_err(|source| {
                HealError::RecordStart {
                    capture: capture.to_path_buf(),
                    source,
                }
            })
        }
        None => Ok(()),
    };
    let record_dir = plan.record_in.as_ref().map(|(_, d)| d.as_fd());
    if let Err(e) = recorded {
        // The record may have reached its name before the failure (its directory's fsync).
        if let Some(staged) = staged {
            staged.roll_back(record_dir);
        }
        return Err(e);
    }
    let Some(staged) = staged else {
        return pinned.ok_or(HealError::NoPinnedWal);
    };
    staged.rename_into_place(&plan.name).inspect_err(|_| {
        // Renamed, but the directory's fsync failed: the rename may reach the disk with any
        // later fsync of the directory. Back under its staging name, durably, it is rolled back;
        // if it cannot go back it stays at the path, committed (the record, `started` with its
        // staging file gone, reads healed; the next open replays it).
        let at_path = identity_of_path(&state.paths.wal).ok().flatten() == Some(staged.id);
        if at_path && !staged.rename_back(&plan.name) {
            return;
        }
        staged.roll_back(record_dir);
    })
}

/// Step 4: the prefix's frames written into the main file in WAL order (each page's last
/// committed version wins), the file truncated to the last commit's size and synced. The number
/// of distinct pages written.
fn copy_frames(plan: &Plan<'_>, main: &dyn MainFile) -> Result<u64, HealError> {
    let (wal, prefix) = (plan.wal.file(), &plan.prefix);
    let mut frame = vec![0u8; prefix.frame_len() as usize];
    let mut pages = HashSet::new();
    let mut db_pages = 0u32;
    for i in 0..prefix.frames {
        let at = WAL_HEADER_SIZE as u64 + i * prefix.frame_len();
        wal.read_exact_at(&mut frame, at)
            .map_err(|source| HealError::ReadFrame {
                wal: plan.wal.id(),
                at,
                source,
            })?;
        let pgno = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        let commit = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let offset = (i64::from(pgno) - 1) * prefix.page as i64;
        let rc = main.write_at(&frame[WAL_FRAME_HEADER_SIZE..], offset);
        if pgno == 0 || rc != ffi::SQLITE_OK {
            return Err(HealError::WritePage { page: pgno, rc });
        }
        pages.insert(pgno);
        if commit != 0 {
            db_pages = commit;
        }
    }
    let rc = main.truncate(i64::from(db_pages) * prefix.page as i64);
    let rc = if rc == ffi::SQLITE_OK {
        main.sync()
    } else {
        rc
    };
    if rc != ffi::SQLITE_OK {
        return Err(HealError::TruncateOrSync { rc });
    }
    Ok(pages.len() as u64)
}

/// Steps 5 and 6: the `done` record, and the WAL at the path unlinked if it is still `placed`.
fn finish(state: &ConnectionState, plan: &mut Plan<'_>, placed: FileId) {
    plan.record.phase = HealPhase::Done;
    plan.record.at = now();
    if let Some((capture, d)) = &plan.record_in {
        if let Err(e) = write_record(d.as_fd(), &plan.record, &plan.permissions) {
            // The `started` record with the staging file gone already reads as healed.
            log::warn!(
                "hermes-guard: healed {} but could not record the end of the heal in {} ({e}); \
                 its start record already says the rows are live",
                state.paths.db.display(),
                capture.display()
            );
        }
    }
    // Checkpointed: the WAL at the path goes (put back, or never moved after a lost -shm), if it
    // is still the one the heal wrote from.
    // Without a descriptor of the directory (healed in place, nothing staged) it goes by its
    // path, after the same check, as SQLite's own close deletes it.
    if identity_of_path(&state.paths.wal).ok().flatten() == Some(placed) {
        match &plan.dir {
            Some(dir) => {
                let _ = rustix::fs::unlinkat(dir.fd(), &plan.name, AtFlags::empty());
                let _ = sync_dir(dir.fd(), plan.wal.file().as_fd());
            }
            None => {
                let _ = std::fs::remove_file(&state.paths.wal);
            }
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
