//! Writing a retired generation next to its database: the WAL from the pinned descriptor, the
//! main image as the retiring connection sees it, and `manifest.json`.
//!
//! The artifact is staged in a `.partial` directory, every file and the directory fsynced, then
//! renamed into place: a directory without `.partial` is complete. Memory stays bounded by one
//! copy buffer whatever the WAL's size.

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::AtFlags;

use crate::identity::{FileId, PinnedWal};
use crate::paths::{open_dir, open_dir_to_write_in, sync_dir, DirHandle};
use crate::permissions::Permissions;
use crate::status::{Backfill, RetireReason};

pub(crate) mod base_file;
mod error;
mod existing;
pub(crate) mod fallback;
pub(crate) mod healed;
mod manifest;
mod names;
#[cfg(test)]
mod proptests;
mod staging;
#[cfg(test)]
mod tests;
mod unacknowledged;

pub use base_file::{BaseFileError, BasePages, BasePagesEntry};
pub use error::CaptureError;
pub(crate) use error::{hand_over, take_handed_over};
use existing::find_identical_capture;
pub(crate) use existing::{read_captured_wal, CapturedWal};
pub use healed::{heal_state, HealPhase, HealRecord, HealState, PutBack, HEALED_NAME};
pub use manifest::{
    BaseEntry, BaseVerdict, FailedCommitEntry, ImageMode, MainEntry, Manifest, ManifestError,
    PathGeneration, ShmEntry, Trigger, WalEntry,
};
pub(crate) use names::reserve_staging;
pub use names::{capture_dir_stem, capture_file_name, fitted_name, DIR_STEM_MAX, FILE_STEM_MAX};
use staging::fill_staging;
pub(crate) use staging::write_synced;
pub(crate) use unacknowledged::{generation_size, FailedCommit, FIRST_BYTES};

/// Name of the manifest inside an artifact directory.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Marker between the database's name and the timestamp in an artifact's directory name.
pub const ARTIFACT_MARKER: &str = ".retired-wal-";

const STAGING_SUFFIX: &str = ".partial";

/// Where the main image comes from: the retiring connection's own file object, so no second
/// descriptor is opened (and closed) on a file SQLite holds locks on.
pub trait ImageSource {
    /// Size of the image in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fill `buf` from `offset`; the caller never reads past `size()`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// Everything a capture needs, gathered by the guard while it holds the generation.
pub struct CaptureInput<'a> {
    /// The database's pathname, as SQLite opened it.
    pub database: &'a Path,
    /// The database's directory, held open since the database was opened: the capture is
    /// written into it wherever it is now. `None`: the directory is opened by path now.
    pub dir: Option<&'a DirHandle>,
    /// The pinned WAL descriptor.
    pub wal: &'a PinnedWal,
    /// The main image.
    pub main: &'a dyn ImageSource,
    /// The main file's pinned identity.
    pub main_id: Option<FileId>,
    /// The `-shm` pinned identity, when one was mapped.
    pub shm_id: Option<FileId>,
    /// Why the capture happens.
    pub trigger: Trigger,
    /// What retired the generation.
    pub reason: Option<RetireReason>,
    /// How far the retired WAL had been checkpointed when the loss was seen.
    pub backfill_at_loss: Option<Backfill>,
    /// Judges, once the image has been read, whether it is the file the WAL generation was written
    /// on (`None`: nothing to judge by, recorded as unknown).
    pub base: Option<&'a dyn Fn() -> BaseEntry>,
    /// The database's permissions, which the capture's directory and files get
    /// (`src/permissions.rs`), wherever the capture is written.
    pub(crate) permissions: Permissions,
    /// A commit failed to the application, whose frames the WAL file holds: left out
    /// (`capture/unacknowledged.rs`).
    pub(crate) failed_commit: Option<FailedCommit>,
    /// The base pages this process kept for the generation of the given WAL salts, if any
    /// (`vfs/state/base_pages.rs`): written as `<file>-base`.
    pub(crate) base_pages: Option<&'a dyn Fn([u32; 2]) -> Option<BasePages>>,
}

/// The database's directory (`.` for a bare file name) and its file name; an error naming the
/// path when it has no file name. Where every capture of `database` is written.
pub(crate) fn split_database(database: &Path) -> Result<(&Path, &std::ffi::OsStr), CaptureError> {
    let parent = database
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = database.file_name().ok_or_else(|| CaptureError::Io {
        database: database.to_path_buf(),
        artifact: database.to_path_buf(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "database path has no file name",
        ),
    })?;
    Ok((parent, name))
}

/// Writes the artifact and returns its final directory, where it is now (when the database's
/// directory was renamed away, that is inside the directory's new name).
pub fn write_capture(input: &CaptureInput<'_>) -> Result<Captured, CaptureError> {
    let database = input.database;
    let io_err = |artifact: &Path, source: io::Error| CaptureError::Io {
        database: database.to_path_buf(),
        artifact: artifact.to_path_buf(),
        source,
    };
    let (parent, name) = split_database(database)?;
    if let Some(message) = crate::testing::seam::injected_capture_fault(database) {
        return Err(io_err(parent, io::Error::other(message)));
    }

    // The directory held since the open, wherever it is now; without one, the parent by path.
    // Either may be an `O_PATH` descriptor of a directory this process may write in but not
    // list: everything below is relative to it and needs no read permission.
    let opened: OwnedFd;
    let (dir_fd, dir_path) = match input.dir {
        Some(dir) => (dir.fd(), dir.current_path()),
        None => {
            opened =
                open_dir_to_write_in(rustix::fs::CWD, parent).map_err(|e| io_err(parent, e))?;
            (opened.as_fd(), parent.to_path_buf())
        }
    };

    let stem = capture_dir_stem(name);
    let file_name = capture_file_name(name);
    if let Some((existing, wal, pid)) = find_identical_capture(input, dir_fd, &stem) {
        let existing = dir_path.join(existing);
        log_found(database, &existing, pid);
        return Ok(Captured { dir: existing, wal });
    }
    let (final_name, staging_name) = reserve_staging(dir_fd, &stem, &input.permissions)
        .map_err(|(staging, e)| io_err(&dir_path.join(staging), e))?;
    let final_dir = dir_path.join(&final_name);
    let staging_dir = dir_path.join(&staging_name);

    let mut staging = Staging {
        dir: dir_fd,
        name: staging_name,
        final_name,
        fd: None,
        renamed: false,
    };
    match staging.fill_and_rename(input, &file_name) {
        Ok(wal) => {
            log_captured(input, &final_dir);
            Ok(Captured {
                dir: final_dir,
                wal,
            })
        }
        Err(e) => {
            staging.discard(&file_name);
            Err(io_err(&staging_dir, e))
        }
    }
}

/// Logs (and hands to SQLite's log) that the generation of `database` is already captured in
/// `existing`, by the process `pid`.
fn log_found(database: &Path, existing: &Path, pid: u32) {
    // A second connection of this process is not "another process".
    let by = if pid == std::process::id() {
        format!("by another connection of this process, pid {pid}")
    } else {
        format!("by another process, pid {pid}")
    };
    log::warn!(
        "hermes-guard: the retired generation of {} is already captured, byte for byte, in {} \
         ({by}); not writing it again",
        database.display(),
        existing.display()
    );
    crate::sqlite_log::captured(database, existing);
}

/// Logs (and hands to SQLite's log) the capture written into `final_dir`.
fn log_captured(input: &CaptureInput<'_>, final_dir: &Path) {
    let database = input.database;
    log::warn!(
        "hermes-guard: captured the retired generation of {} into {} (trigger {:?}): every row it \
         committed is there. Unless this connection's close says it healed them back, run {} \
         once the database is reopened",
        database.display(),
        final_dir.display(),
        input.trigger,
        crate::host::recover_hint(final_dir, database)
    );
    crate::sqlite_log::captured(database, final_dir);
}

/// A capture's staging directory, reserved in the database's directory, while it is filled and
/// renamed into place.
struct Staging<'a> {
    /// The database's directory.
    dir: BorrowedFd<'a>,
    /// The staging directory's name in it.
    name: String,
    /// The capture's final name in it.
    final_name: String,
    /// The staging directory, once opened.
    fd: Option<OwnedFd>,
    /// Whether it was renamed to `final_name`.
    renamed: bool,
}

impl Staging<'_> {
    /// Fills the staging directory (the files, then the manifest), fsyncs it, renames it to its
    /// final name (never over anything) and fsyncs the database's directory.
    fn fill_and_rename(
        &mut self,
        input: &CaptureInput<'_>,
        file_name: &str,
    ) -> io::Result<CapturedWal> {
        let staging = self.fd.insert(open_dir(self.dir, Path::new(&self.name))?);
        let manifest = fill_staging(input, staging.as_fd(), file_name)?;
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        write_synced(staging.as_fd(), MANIFEST_NAME, &input.permissions, |f| {
            f.write_all(&json)
        })?;
        rustix::fs::fsync(&*staging)?;
        // Never over anything: a name taken meanwhile fails the capture (retried), it is not
        // replaced.
        rustix::fs::renameat_with(
            self.dir,
            &self.name,
            self.dir,
            &self.final_name,
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        self.renamed = true;
        // The directory's own fsync, or (a directory this process cannot read) its filesystem's
        // through the capture directory just made in it.
        sync_dir(self.dir, staging.as_fd())?;
        Ok(CapturedWal {
            bytes: manifest.wal.bytes,
            sha256: manifest.wal.sha256,
            failed_commit: manifest.wal.failed_commit.as_ref().and(input.failed_commit),
        })
    }

    /// After a failure: the files a capture of `file_name` may hold unlinked and the directory
    /// removed, where it is.
    fn discard(&self, file_name: &str) {
        if let Some(staging) = &self.fd {
            // Every file a capture may hold: its directory must be empty to go.
            let wal_name = format!("{file_name}-wal");
            let base_name = format!("{file_name}-base");
            for f in [
                MANIFEST_NAME,
                file_name,
                wal_name.as_str(),
                base_name.as_str(),
            ] {
                let _ = rustix::fs::unlinkat(staging, f, AtFlags::empty());
            }
        }
        // Renamed into place but its directory's fsync failed: the name may reach the disk
        // with any later fsync of the directory (whoever makes it), while the caller takes
        // the capture as failed (a heal at close would then record nothing in it, and its
        // rows would be merged twice). It goes, and the removal with the rename.
        let left = if self.renamed {
            &self.final_name
        } else {
            &self.name
        };
        let _ = rustix::fs::unlinkat(self.dir, left, AtFlags::REMOVEDIR);
        if self.renamed {
            if let Some(staging) = &self.fd {
                let _ = sync_dir(self.dir, staging.as_fd());
            }
        }
    }
}

/// A capture written (or found) by [`write_capture`]: where it is, and which WAL bytes it holds.
pub(crate) struct Captured {
    /// The capture directory, where it is now.
    pub dir: PathBuf,
    /// The captured WAL.
    pub wal: CapturedWal,
}

// `<db>` + suffix: where the guard (src/vfs) has always found it.
pub(crate) use crate::paths::sidecar;
