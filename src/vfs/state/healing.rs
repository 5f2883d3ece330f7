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
//!    main-file write of this connection's since (`DbState::main_written`). The kernel moves
//!    both times at every write by anyone, and `st_ctime` cannot be set back: equal stamps mean
//!    no newer generation checkpointed into it, nothing was copied over it (`cp` keeps the
//!    inode), no peer of the old generation checkpointed.
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
use std::ffi::{c_int, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use rusqlite::ffi;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

use super::{DbState, Inner};
use crate::identity::{identity_of_path, stamp_of_path, FileId, PinnedWal};
use crate::status::RetireReason;
use crate::walfile::{WalScanner, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// The calls a heal makes on the main file: the connection's own wrapped file object, through
/// its own methods (`file.rs`). Each returns an SQLite result code.
pub(crate) trait MainFile {
    fn lock(&self, level: c_int) -> c_int;
    fn unlock(&self, level: c_int) -> c_int;
    fn write_at(&self, bytes: &[u8], offset: i64) -> c_int;
    fn truncate(&self, size: i64) -> c_int;
    fn sync(&self) -> c_int;
}

/// Obligation 1, from what the state holds: a heal may follow.
pub(super) fn may_heal(inner: &Inner) -> bool {
    matches!(
        inner.reason,
        Some(RetireReason::WalLost | RetireReason::ShmLost)
    ) && inner.capture.is_some()
        && inner.let_go.is_none()
        && inner.wal.is_some()
}

/// What a heal wrote.
struct Healed {
    frames: u64,
    commits: u64,
    pages: u64,
}

impl DbState {
    /// Whether a sync of the main file ends a checkpoint of this connection's whose result is
    /// not stamped yet (WAL mode, live generation). Atomics only.
    pub(crate) fn stamp_due(&self) -> bool {
        self.main_written.load(std::sync::atomic::Ordering::Acquire)
            && self.wal_pinned()
            && !self.is_retired()
    }

    /// Stamps the main file as this connection's checkpoint just left it (after its writes,
    /// truncate and sync): from now on a heal compares with this. A stamp of another inode than
    /// the pinned one is not kept (the next check retires the generation).
    pub(crate) fn stamp_main(&self) {
        let Ok(Some(now)) = stamp_of_path(&self.db_path) else {
            return;
        };
        let mut inner = self.inner.lock();
        if inner.main_id == Some(now.id) && inner.reason.is_none() {
            inner.main_stamp = Some(now);
            self.main_written
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }

    /// At the main file's close (before the wrapped file is closed): heals the retired
    /// generation into the main file when every obligation holds, and says so at WARN; does
    /// nothing otherwise (said at INFO when a heal was possible in principle).
    pub(crate) fn heal_at_close(&self, main: &dyn MainFile) {
        let inner = self.inner.lock();
        if !may_heal(&inner) {
            return;
        }
        if let Err(why) = self.nothing_newer(&inner) {
            log::info!(
                "hermes-guard: not healing {} at close: {why}; its retired generation stays in \
                 the capture only",
                self.db_path.display()
            );
            return;
        }
        let started = Instant::now();
        let result = self.heal_locked(&inner, main);
        match result {
            Ok(h) => {
                log::warn!(
                    "hermes-guard: healed {} at close: nothing newer had touched it, so the \
                     retired generation's {} frame(s) ({} commit(s), {} page(s)) were \
                     checkpointed back into the main file, as SQLite's own close would have done \
                     ({:?}); the capture {} stays as a copy",
                    self.db_path.display(),
                    h.frames,
                    h.commits,
                    h.pages,
                    started.elapsed(),
                    inner
                        .capture
                        .as_deref()
                        .map(|c| c.display().to_string())
                        .unwrap_or_default()
                );
            }
            Err(why) => log::info!(
                "hermes-guard: not healing {} at close: {why}; its retired generation stays in \
                 the capture only",
                self.db_path.display()
            ),
        }
    }

    /// Obligations 2 and 3.
    fn nothing_newer(&self, inner: &Inner) -> Result<(), String> {
        if self.main_written.load(std::sync::atomic::Ordering::Acquire) {
            return Err("this connection wrote the main file after its last full check".into());
        }
        let Some(then) = inner.main_stamp else {
            return Err("the main file was never stamped by a full check".into());
        };
        let now = stamp_of_path(&self.db_path).map_err(|e| format!("stat: {e}"))?;
        if now != Some(then) {
            return Err("the main file changed since the loss (or was replaced)".into());
        }
        let wal = inner.wal.as_ref().map(PinnedWal::id);
        match identity_of_path(&self.wal_path).map_err(|e| e.to_string())? {
            None => {}
            Some(id) if Some(id) == wal && inner.reason == Some(RetireReason::ShmLost) => {}
            Some(_) => return Err("a -wal of a newer generation is at the path".into()),
        }
        if identity_of_path(self.shm_check_path(inner))
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err("a -shm of a newer generation is at the path".into());
        }
        Ok(())
    }

    /// Obligation 4, the checks again under the lock, and the copy.
    fn heal_locked(&self, inner: &Inner, main: &dyn MainFile) -> Result<Healed, String> {
        if main.lock(ffi::SQLITE_LOCK_SHARED) != ffi::SQLITE_OK {
            return Err("SHARED on the main file was refused".into());
        }
        let result = if main.lock(ffi::SQLITE_LOCK_EXCLUSIVE) != ffi::SQLITE_OK {
            Err("another connection has the database open (EXCLUSIVE was refused)".into())
        } else {
            self.nothing_newer(inner)
                .and_then(|()| put_back_and_checkpoint(self, inner, main))
        };
        main.unlock(ffi::SQLITE_LOCK_NONE);
        result
    }
}

/// The committed prefix of the pinned WAL: its page size, frames, commits and the database
/// size in pages after its last commit.
struct Prefix {
    page: usize,
    frames: u64,
    commits: u64,
}

impl Prefix {
    fn frame_len(&self) -> u64 {
        (WAL_FRAME_HEADER_SIZE + self.page) as u64
    }

    /// Bytes of the WAL up to the end of its last commit frame.
    fn bytes(&self) -> u64 {
        WAL_HEADER_SIZE as u64 + self.frames * self.frame_len()
    }
}

fn committed_prefix(wal: &File) -> Result<Prefix, String> {
    let mut scanner = WalScanner::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = wal
            .read_at(&mut chunk, at)
            .map_err(|e| format!("reading the pinned WAL: {e}"))?;
        if n == 0 {
            break;
        }
        scanner.feed(&chunk[..n]);
        at += n as u64;
    }
    let summary = scanner.finish();
    let page = summary.header.page_size as usize;
    if !summary.header.valid || summary.committed_frames == 0 || page == 0 {
        return Err("the retired WAL holds no committed frame".into());
    }
    Ok(Prefix {
        page,
        frames: summary.committed_frames,
        commits: summary.commits,
    })
}

/// The heal proper, under the EXCLUSIVE lock. Crash-safe at every step, the way SQLite's own
/// checkpoint is: first the committed prefix of the retired WAL is put back at `<db>-wal` (a
/// new file, synced, renamed into place), so that from then on any open replays it as after a
/// crash; then its frames are written into the main file in WAL order, the file is truncated to
/// the last commit's size and synced; last the put-back WAL is removed. A failure after the
/// rename leaves the WAL in place, which SQLite replays: never a torn main file on its own.
fn put_back_and_checkpoint(
    state: &DbState,
    inner: &Inner,
    main: &dyn MainFile,
) -> Result<Healed, String> {
    let wal = inner.wal.as_ref().ok_or("no pinned WAL")?.file();
    let dir = state
        .dir
        .as_deref()
        .ok_or("no descriptor of the database's directory")?;
    let name = state
        .wal_path
        .file_name()
        .ok_or("the WAL path has no file name")?
        .to_owned();
    let prefix = committed_prefix(wal)?;
    let pinned = inner.wal.as_ref().map(PinnedWal::id);
    // After a lost `-shm` the WAL is still at the path (checked): it is the crash-safe copy
    // already. After a lost `-wal` its committed prefix goes back there first.
    let placed = if identity_of_path(&state.wal_path).ok().flatten() == pinned {
        pinned.ok_or("no pinned WAL")?
    } else {
        put_back(dir.fd(), &name, wal, prefix.bytes(), &state.db_path)?
    };

    let mut frame = vec![0u8; prefix.frame_len() as usize];
    let mut pages = HashSet::new();
    let mut db_pages = 0u32;
    for i in 0..prefix.frames {
        let at = WAL_HEADER_SIZE as u64 + i * prefix.frame_len();
        wal.read_exact_at(&mut frame, at).map_err(|e| {
            format!("reading the pinned WAL at {at}: {e} (the WAL is back in place)")
        })?;
        let pgno = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
        let commit = u32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let offset = (i64::from(pgno) - 1) * prefix.page as i64;
        let rc = main.write_at(&frame[WAL_FRAME_HEADER_SIZE..], offset);
        if pgno == 0 || rc != ffi::SQLITE_OK {
            return Err(format!(
                "writing page {pgno} of the main file: SQLite code {rc} (the WAL is back in \
                 place: the next open replays it)"
            ));
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
        return Err(format!(
            "truncating or syncing the main file: SQLite code {rc} (the WAL is back in place: \
             the next open replays it)"
        ));
    }
    // Checkpointed: the put-back WAL goes, if it is still the one put there.
    if identity_of_path(&state.wal_path).ok().flatten() == Some(placed) {
        let _ = rustix::fs::unlinkat(dir.fd(), &name, AtFlags::empty());
        let _ = rustix::fs::fsync(dir.fd());
    }
    Ok(Healed {
        frames: prefix.frames,
        commits: prefix.commits,
        pages: pages.len() as u64,
    })
}

/// Writes the first `len` bytes of `wal` to a new file in `dir`, syncs it and renames it to
/// `name` (which nothing names now: checked under the lock), with the database file's
/// permission bits; returns its identity.
fn put_back(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    wal: &File,
    len: u64,
    database: &Path,
) -> Result<FileId, String> {
    let mode = rustix::fs::stat(database)
        .map(|st| Mode::from_raw_mode(st.st_mode & 0o777))
        .unwrap_or(Mode::from_raw_mode(0o644));
    let mut staging = name.to_owned();
    staging.push(format!(".hermes-guard-heal-{}", std::process::id()));
    let fd = rustix::fs::openat(
        dir,
        staging.as_os_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        mode,
    )
    .map_err(|e| format!("creating {}: {e}", Path::new(&staging).display()))?;
    let file = File::from(fd);
    let copied = (|| -> io::Result<FileId> {
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < len {
            let want = buf.len().min((len - at) as usize);
            wal.read_exact_at(&mut buf[..want], at)?;
            file.write_all_at(&buf[..want], at)?;
            at += want as u64;
        }
        file.sync_all()?;
        // Never over anything: whatever appeared at the name meanwhile wins, and no heal.
        rustix::fs::renameat_with(dir, staging.as_os_str(), dir, name, RenameFlags::NOREPLACE)?;
        rustix::fs::fsync(dir)?;
        crate::identity::identity_of_fd(&file)
    })();
    copied.map_err(|e| {
        let _ = rustix::fs::unlinkat(dir, staging.as_os_str(), AtFlags::empty());
        format!("putting the retired WAL back at the path: {e}")
    })
}
