//! Writing a retired generation next to its database: the WAL from the pinned descriptor, the
//! main image as the retiring connection sees it, and `manifest.json`.
//!
//! The artifact is staged in a `.partial` directory, every file and the directory fsynced, then
//! renamed into place: a directory without `.partial` is complete. Memory stays bounded by one
//! copy buffer whatever the WAL's size.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{AtFlags, Mode, OFlags};

use crate::digest::{sha256_stream, ReadAt};
use crate::identity::{FileId, PinnedWal};
use crate::paths::{open_dir, open_dir_to_write_in, path_display, path_hex, sync_dir, DirHandle};
use crate::permissions::Permissions;
use crate::status::{Backfill, RetireReason};
use crate::walfile::{parse_main_header, WalScanner};

pub(crate) mod base_file;
mod error;
pub(crate) mod fallback;
mod faults;
pub(crate) mod healed;
mod manifest;
mod names;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
mod unacknowledged;

pub use base_file::{BasePages, BasePagesEntry};
pub use error::CaptureError;
pub(crate) use error::{hand_over, take_handed_over};
use faults::injected_fault;
#[cfg(feature = "test-hooks")]
pub use faults::{clear_capture_fault, inject_capture_fault};
pub use healed::{heal_state, HealPhase, HealRecord, HealState, PutBack, HEALED_NAME};
pub use manifest::{
    BaseEntry, BaseVerdict, FailedCommitEntry, ImageMode, MainEntry, Manifest, ManifestError,
    PathGeneration, ShmEntry, Trigger, WalEntry,
};
pub(crate) use names::reserve_staging;
pub use names::{capture_dir_stem, capture_file_name, fitted_name, DIR_STEM_MAX, FILE_STEM_MAX};
pub(crate) use unacknowledged::{generation_size, FailedCommit, FIRST_BYTES};

/// Name of the manifest inside an artifact directory.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Marker between the database's name and the timestamp in an artifact's directory name.
pub const ARTIFACT_MARKER: &str = ".retired-wal-";

const STAGING_SUFFIX: &str = ".partial";
const COPY_CHUNK: usize = 1 << 20;

/// Where the main image comes from: the retiring connection's own file object, so no second
/// descriptor is opened (and closed) on a file SQLite holds locks on.
pub trait ImageSource {
    /// Size of the image in bytes.
    fn size(&self) -> io::Result<u64>;
    /// Fill `buf` from `offset`; the caller never reads past `size()`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// An [`ImageSource`] read front to back, up to its `size()`, in chunks of at most [`COPY_CHUNK`].
struct ImageReader<'a> {
    source: &'a dyn ImageSource,
    pos: u64,
    size: u64,
}

impl io::Read for ImageReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.size - self.pos).min(buf.len().min(COPY_CHUNK) as u64) as usize;
        self.source.read_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
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
    if let Some(message) = injected_fault(database) {
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
        crate::sqlite_log::captured(database, &existing);
        return Ok(Captured { dir: existing, wal });
    }
    let (final_name, staging_name) = reserve_staging(dir_fd, &stem, &input.permissions)
        .map_err(|(staging, e)| io_err(&dir_path.join(staging), e))?;
    let final_dir = dir_path.join(&final_name);
    let staging_dir = dir_path.join(&staging_name);

    let mut staging_fd = None;
    let mut renamed = false;
    let result = open_dir(dir_fd, Path::new(&staging_name)).and_then(|staging| {
        let staging = staging_fd.insert(staging);
        let manifest = fill_staging(input, staging.as_fd(), &file_name)?;
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        write_synced(staging.as_fd(), MANIFEST_NAME, &input.permissions, |f| {
            f.write_all(&json)
        })?;
        rustix::fs::fsync(&*staging)?;
        // Never over anything: a name taken meanwhile fails the capture (retried), it is not
        // replaced.
        rustix::fs::renameat_with(
            dir_fd,
            &staging_name,
            dir_fd,
            &final_name,
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        renamed = true;
        // The directory's own fsync, or (a directory this process cannot read) its filesystem's
        // through the capture directory just made in it.
        sync_dir(dir_fd, staging.as_fd())?;
        Ok(CapturedWal {
            bytes: manifest.wal.bytes,
            sha256: manifest.wal.sha256,
            failed_commit: manifest.wal.failed_commit.as_ref().and(input.failed_commit),
        })
    });
    match result {
        Ok(wal) => {
            log::warn!(
                "hermes-guard: captured the retired generation of {} into {} (trigger {:?}): \
                 every row it committed is there. Unless this connection's close says it healed \
                 them back, run {} once the database is reopened",
                database.display(),
                final_dir.display(),
                input.trigger,
                crate::host::recover_hint(&final_dir, database)
            );
            crate::sqlite_log::captured(database, &final_dir);
            Ok(Captured {
                dir: final_dir,
                wal,
            })
        }
        Err(e) => {
            if let Some(staging) = &staging_fd {
                // Every file a capture may hold: its directory must be empty to go.
                let wal_name = format!("{file_name}-wal");
                let base_name = format!("{file_name}-base");
                for f in [
                    MANIFEST_NAME,
                    file_name.as_str(),
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
            let left = if renamed { &final_name } else { &staging_name };
            let _ = rustix::fs::unlinkat(dir_fd, left, AtFlags::REMOVEDIR);
            if renamed {
                if let Some(staging) = &staging_fd {
                    let _ = sync_dir(dir_fd, staging.as_fd());
                }
            }
            Err(io_err(&staging_dir, e))
        }
    }
}

/// A complete capture in `dir` of exactly the WAL `input` would capture: the same main and WAL
/// inodes, the same size and the same sha256. Another process that retired the same generation
/// (the WAL inode is shared), or another connection of this one, has captured it already: the
/// pid its manifest names is returned with it. The WAL is hashed only when a candidate's
/// inodes and size match; anything unreadable is no match.
///
/// A directory this process may not list (opened `O_PATH`) shows no candidate: a capture's name
/// holds another process's pid and the second it was written, which cannot be guessed. This
/// process's own connections still share one capture (`GenerationCapture`); another process's
/// capture of the same generation may be written a second time — the same bytes twice, never a row
/// less.
fn find_identical_capture(
    input: &CaptureInput<'_>,
    dir: BorrowedFd<'_>,
    stem: &str,
) -> Option<(String, CapturedWal, u32)> {
    if crate::paths::is_path_only(dir) {
        log::debug!(
            "hermes-guard: the directory of {} cannot be listed by this process: no capture by \
             another process is looked for",
            input.database.display()
        );
        return None;
    }
    let prefix = format!("{stem}{ARTIFACT_MARKER}");
    // The sha256 of the WAL's first bytes, by length: a capture that left out a failed commit
    // the input knows nothing of is compared over its own length.
    let mut our_sha256: Vec<(u64, String)> = Vec::new();
    // The base pages this process kept for the generation: a capture that lacks any of them is
    // not taken as this one (recovery would lose their base); this process writes its own.
    let our_pages = input
        .base_pages
        .and_then(|kept| kept(wal_salts(input.wal)?));
    for entry in rustix::fs::Dir::read_from(dir).ok()? {
        let Ok(entry) = entry else {
            break;
        };
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if !name.starts_with(&prefix) || name.ends_with(STAGING_SUFFIX) {
            continue;
        }
        let Some(captured) = read_captured_wal(dir, name) else {
            continue;
        };
        let same_files =
            captured.wal.identity == input.wal.id() && captured.main.identity == input.main_id;
        if !same_files {
            continue;
        }
        // A commit another process failed is left out here too, while the WAL holds it.
        let failed = input.failed_commit.or_else(|| {
            captured
                .wal
                .failed_commit
                .as_ref()
                .and_then(FailedCommit::from_entry)
        });
        let size = generation_size(input.wal, failed.as_ref()).ok()?;
        if captured.wal.bytes != size {
            continue;
        }
        let sha = match our_sha256.iter().find(|(len, _)| *len == size) {
            Some((_, sha)) => sha.clone(),
            None => {
                let sha = sha256_of(input.wal.file(), size).ok()?;
                our_sha256.push((size, sha.clone()));
                sha
            }
        };
        if sha == captured.wal.sha256 && holds_base_of(dir, name, &captured, our_pages.as_ref()) {
            let wal = CapturedWal {
                bytes: captured.wal.bytes,
                sha256: captured.wal.sha256,
                failed_commit: failed,
            };
            return Some((name.to_owned(), wal, captured.pid));
        }
    }
    None
}

/// The salts in the header of the WAL `wal` (`None`: not a valid WAL header).
fn wal_salts(wal: &PinnedWal) -> Option<[u32; 2]> {
    use std::os::unix::fs::FileExt;
    let mut header = [0u8; 32];
    wal.file().read_exact_at(&mut header, 0).ok()?;
    let header = crate::walfile::parse_wal_header(&header);
    header.valid.then_some(header.salts)
}

/// Whether the capture `name` in `dir` (its manifest `captured`) holds the base of every page in
/// `ours` (nothing to hold: yes).
fn holds_base_of(
    dir: BorrowedFd<'_>,
    name: &str,
    captured: &Manifest,
    ours: Option<&BasePages>,
) -> bool {
    let Some(ours) = ours.filter(|p| !p.pages.is_empty()) else {
        return true;
    };
    let Some(entry) = &captured.base_pages else {
        return false;
    };
    let theirs = rustix::fs::openat(
        dir,
        format!("{name}/{}", entry.file),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
    .and_then(|fd| {
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut File::from(fd), &mut bytes).ok()?;
        base_file::read(&bytes).ok()
    });
    theirs.is_some_and(|theirs| ours.pages.keys().all(|p| theirs.pages.contains_key(p)))
}

/// A capture written (or found) by [`write_capture`]: where it is, and which WAL bytes it holds.
pub(crate) struct Captured {
    /// The capture directory, where it is now.
    pub dir: PathBuf,
    /// The captured WAL.
    pub wal: CapturedWal,
}

/// The WAL bytes a capture holds: its size and sha256 (hex), as its manifest records them.
#[derive(Clone)]
pub(crate) struct CapturedWal {
    bytes: u64,
    sha256: String,
    /// The failed commit left out of it, if any: a connection that finds this capture adopts
    /// it, so its heal at close leaves the same frames out.
    pub(crate) failed_commit: Option<FailedCommit>,
}

impl CapturedWal {
    /// Whether `wal` holds exactly these bytes now, as a capture reads it (without the frames of
    /// `failed`): the same size, then the same sha256 (the WAL is read through the pinned
    /// descriptor only when the sizes match). A WAL that was appended to, or rewritten in place
    /// after a restart by a peer still attached to it, is not the same.
    pub(crate) fn is_held_by(&self, wal: &PinnedWal, failed: Option<&FailedCommit>) -> bool {
        generation_size(wal, failed).is_ok_and(|size| size == self.bytes)
            && sha256_of(wal.file(), self.bytes).is_ok_and(|sha| sha == self.sha256)
    }
}

pub(crate) fn read_captured_wal(dir: BorrowedFd<'_>, capture: &str) -> Option<Manifest> {
    let fd = rustix::fs::openat(
        dir,
        format!("{capture}/{MANIFEST_NAME}"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    serde_json::from_reader(io::BufReader::new(File::from(fd))).ok()
}

/// sha256 of the first `len` bytes of `file`, hex.
fn sha256_of(file: &File, len: u64) -> io::Result<String> {
    let from_start = io::Read::take(ReadAt { file, pos: 0 }, len);
    Ok(sha256_stream(from_start, |_| Ok(()))?.0)
}

/// Creates `name` in the directory `dir` (it must not exist) with `permissions`, fills it and
/// fsyncs it.
pub(crate) fn write_synced(
    dir: BorrowedFd<'_>,
    name: &str,
    permissions: &Permissions,
    body: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let fd = permissions.create_file(dir, name, OFlags::WRONLY)?;
    let mut f = File::from(fd);
    body(&mut f)?;
    f.sync_all()
}

fn fill_staging(
    input: &CaptureInput<'_>,
    staging: BorrowedFd<'_>,
    name: &str,
) -> io::Result<Manifest> {
    let wal_name = format!("{name}-wal");

    let mut scanner = WalScanner::new();
    let mut wal_digest = (String::new(), 0u64);
    let end = unacknowledged::generation_end(input.wal, input.failed_commit.as_ref());
    write_synced(staging, &wal_name, &input.permissions, |out| {
        let whole = ReadAt {
            file: input.wal.file(),
            pos: 0,
        };
        let src = io::Read::take(whole, end.unwrap_or(u64::MAX));
        wal_digest = sha256_stream(src, |chunk| {
            scanner.feed(chunk);
            out.write_all(chunk)
        })?;
        Ok(())
    })?;
    let (wal_sha256, wal_bytes) = wal_digest;
    let summary = scanner.finish();
    let base_pages = match input.base_pages {
        Some(kept) if summary.header.valid => kept(summary.header.salts)
            .map(|pages| write_base_pages(staging, &format!("{name}-base"), input, &pages))
            .transpose()?,
        _ => None,
    };

    let main_size = input.main.size()?;
    let mut main_digest = (String::new(), 0u64);
    let mut header_bytes = Vec::with_capacity(100);
    write_synced(staging, name, &input.permissions, |out| {
        let image = ImageReader {
            source: input.main,
            pos: 0,
            size: main_size,
        };
        main_digest = sha256_stream(image, |chunk| {
            if header_bytes.len() < 100 {
                let take = (100 - header_bytes.len()).min(chunk.len());
                header_bytes.extend_from_slice(&chunk[..take]);
            }
            out.write_all(chunk)
        })?;
        Ok(())
    })?;
    let (main_sha256, _) = main_digest;
    // After the image's last byte was read: what the judge saw then covers all of it.
    let base = Some(input.base.map_or_else(
        || {
            BaseEntry::new(
                BaseVerdict::Unknown,
                "the capturing connection had no directory watch to tell by",
            )
        },
        |judge| judge(),
    ));

    Ok(Manifest {
        version: 1,
        database: path_display(input.database),
        database_hex: path_hex(input.database),
        trigger: input.trigger,
        reason: input.reason,
        pid: std::process::id(),
        captured_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        sqlite: rusqlite::version().to_owned(),
        wal: WalEntry {
            identity: input.wal.id(),
            file: wal_name,
            bytes: wal_bytes,
            sha256: wal_sha256,
            header: summary.header.clone(),
            frames: summary.frames,
            commits: summary.commits,
            last_commit_frame: summary.last_commit_frame,
            generation: crate::walfile::generation_id(
                &summary.header,
                summary.first_frame_checksum,
            ),
            failed_commit: end
                .and(input.failed_commit.as_ref())
                .map(FailedCommit::entry),
        },
        shm: input.shm_id.map(|identity| ShmEntry { identity }),
        main: MainEntry {
            identity: input.main_id,
            size: main_size,
            header: parse_main_header(&header_bytes),
            mode: ImageMode::Copied,
            file: name.to_owned(),
            bytes: main_size,
            sha256: main_sha256,
        },
        backfill_at_loss: input.backfill_at_loss,
        main_torn: input.backfill_at_loss.is_some_and(|b| b.tears_main()),
        stale_wal: None,
        base,
        base_pages,
        path_generation_at_capture: PathGeneration::of(input.database),
    })
}

/// Writes the kept base pages as `file` in the staging directory; their manifest entry.
fn write_base_pages(
    staging: BorrowedFd<'_>,
    file: &str,
    input: &CaptureInput<'_>,
    pages: &BasePages,
) -> io::Result<BasePagesEntry> {
    let mut bytes = Vec::new();
    base_file::write(&mut bytes, pages)?;
    write_synced(staging, file, &input.permissions, |f| f.write_all(&bytes))?;
    let (sha256, len) = sha256_stream(&bytes[..], |_| Ok(()))?;
    Ok(BasePagesEntry {
        file: file.to_owned(),
        bytes: len,
        sha256,
        page_size: pages.page_size,
        salts: pages.salts,
        pages_at_start: pages.pages_at_start,
        kept: pages.pages.len() as u64,
        over_cap: pages.over_cap,
    })
}

// `<db>` + suffix: where the guard (src/vfs) has always found it.
pub(crate) use crate::paths::sidecar;
