//! Writing a retired generation next to its database: the WAL from the pinned descriptor, the
//! main image as the retiring connection sees it, and `manifest.json`.
//!
//! The artifact is staged in a `.partial` directory, every file and the directory fsynced, then
//! renamed into place: a directory without `.partial` is complete. Memory stays bounded by one
//! copy buffer whatever the WAL's size.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::digest::{sha256_stream, ReadAt};
use crate::identity::{identity_of_path, FileId, PinnedWal};
use crate::paths::{self, open_dir, path_display, path_hex, DirHandle};
use crate::status::{Backfill, RetireReason};
use crate::walfile::{parse_main_header, MainHeader, WalHeader, WalScanner};

/// Name of the manifest inside an artifact directory.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Marker between the database's name and the timestamp in an artifact's directory name.
pub const ARTIFACT_MARKER: &str = ".retired-wal-";

const STAGING_SUFFIX: &str = ".partial";
const COPY_CHUNK: usize = 1 << 20;

/// The longest file name Linux filesystems accept, in bytes.
pub const NAME_MAX: usize = 255;
/// Hex digits of the name hash in a shortened name (64 bits of sha256).
const NAME_HASH_HEX: usize = 16;
/// The most an artifact directory's name adds after its stem: the marker, `yyyymmdd-HHMMSS`,
/// `-<pid>` (10 digits at most), `-<n>` (likewise) and `.partial`.
const DIR_SUFFIX_MAX: usize = ARTIFACT_MARKER.len() + 15 + 11 + 11 + STAGING_SUFFIX.len();
/// The longest stem of an artifact directory's name.
pub const DIR_STEM_MAX: usize = NAME_MAX - DIR_SUFFIX_MAX;
/// The longest name of the main image inside an artifact: SQLite appends at most `-journal` to
/// a database's name (`-wal` for the WAL beside it, `-shm` when the copy is opened).
pub const FILE_STEM_MAX: usize = NAME_MAX - "-journal".len();

/// Why a capture was taken (`trigger` in the manifest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Trigger {
    /// At the first refused write.
    Halt,
    /// At close, when the loss was first seen there.
    Close,
    /// At the open: a WAL left beside a database it was not written on (reason `stale-wal`).
    Open,
}

/// A capture that could not be made. Nothing is left behind but, at worst, a `.partial` directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Asked to capture without an identity: guessing by pathname could capture somebody else's WAL.
    #[error(
        "refusing to capture the retired WAL of {database} by pathname: no pinned WAL identity was \
         recorded, and the file now at `{database}-wal` may belong to another generation"
    )]
    NoPinnedIdentity {
        /// The database whose generation was asked for.
        database: PathBuf,
    },
    /// The identity given is not held by any guarded connection of this process.
    #[error(
        "this process no longer holds the WAL inode ({identity}) of {database}: its bytes cannot be \
         captured from here, and the pathname will not be trusted instead"
    )]
    NotHeld {
        /// The database whose generation was asked for.
        database: PathBuf,
        /// The identity asked for.
        identity: FileId,
    },
    /// The generation is live: a capture stands for the generation once taken, so one taken now
    /// would miss every later commit.
    #[error(
        "refusing to capture {database}: its generation is not retired (its -wal, -shm and main \
         file are still the ones the connection opened)"
    )]
    NotRetired {
        /// The database asked about.
        database: PathBuf,
    },
    /// The retired generation holds nothing a capture would save: its WAL has no frame, so the
    /// main file at the path holds everything.
    #[error(
        "nothing to capture for {database}: the retired WAL holds no frame, so nothing is at stake"
    )]
    NothingAtStake {
        /// The database asked about.
        database: PathBuf,
    },
    /// An automatic retry that is not due yet: the last attempt failed and the back-off has not
    /// passed (an explicit request tries at once).
    #[error(
        "the capture of {database}'s retired generation is not retried yet: {attempts} attempt(s) \
         failed, the last with: {last}"
    )]
    Deferred {
        /// The database whose generation waits.
        database: PathBuf,
        /// Failed attempts so far.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The database's directory was deleted and no orphan capture directory is set: the retired
    /// generation was let go uncaptured and its descriptors released.
    #[error(
        "the retired generation of {database} was let go uncaptured: its directory {} was \
         deleted (no link left) and no orphan capture directory is set \
         (HERMES_GUARD_ORPHAN_CAPTURE_DIR, hermes_guard::set_orphan_capture_dir)",
        directory.display()
    )]
    LetGo {
        /// The database whose generation was let go.
        database: PathBuf,
        /// Its deleted directory, as last known.
        directory: PathBuf,
    },
    /// Reading the retired generation or writing the artifact failed.
    #[error("capturing the retired generation of {database} into {artifact}: {source}")]
    Io {
        /// The database whose generation is being captured.
        database: PathBuf,
        /// The artifact (or staging) path being written.
        artifact: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

impl CaptureError {
    /// The database whose generation the capture was for.
    pub fn database(&self) -> &Path {
        match self {
            CaptureError::NoPinnedIdentity { database }
            | CaptureError::NotHeld { database, .. }
            | CaptureError::NotRetired { database }
            | CaptureError::NothingAtStake { database }
            | CaptureError::Io { database, .. }
            | CaptureError::Deferred { database, .. }
            | CaptureError::LetGo { database, .. } => database,
        }
    }
}

thread_local! {
    /// The capture failure a `PRAGMA hermes_guard_capture` on this thread just reported to SQLite
    /// as text, kept whole for the library call that ran the pragma on this same thread.
    static HANDED_OVER: std::cell::RefCell<Option<CaptureError>> =
        const { std::cell::RefCell::new(None) };
}

/// Keeps `error` for [`take_handed_over`] on this thread and returns the message SQLite shows.
pub(crate) fn hand_over(error: CaptureError) -> String {
    let message = error.to_string();
    HANDED_OVER.with(|slot| *slot.borrow_mut() = Some(error));
    message
}

/// The capture failure [`hand_over`] kept on this thread for `database`, if any (taken).
pub(crate) fn take_handed_over(database: &Path) -> Option<CaptureError> {
    HANDED_OVER.with(|slot| {
        let mut slot = slot.borrow_mut();
        match slot.as_ref() {
            Some(e) if e.database() == database => slot.take(),
            _ => None,
        }
    })
}

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
}

/// `manifest.json`, version 1 (keys compatible with the Python implementation): what a capture
/// holds and where it came from. Read one back with [`Manifest::read`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Manifest {
    /// Format version: 1.
    pub version: u32,
    /// The database's pathname as SQLite opened it, for display (invalid UTF-8 shown as U+FFFD).
    pub database: String,
    /// The exact bytes of that pathname in hex, present only when they are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_hex: Option<String>,
    /// `halt` or `close`.
    pub trigger: Trigger,
    /// What retired the generation.
    pub reason: Option<RetireReason>,
    /// The capturing process.
    pub pid: u32,
    /// UTC, RFC 3339.
    pub captured_at: String,
    /// SQLite library version.
    pub sqlite: String,
    /// The retired WAL.
    pub wal: WalEntry,
    /// The `-shm` identity, when one was pinned (its bytes are derivable and not copied).
    pub shm: Option<ShmEntry>,
    /// The main image.
    pub main: MainEntry,
    /// What the three pathnames resolved to when the capture was taken.
    pub path_generation_at_capture: PathGeneration,
    /// The retired WAL's checkpoint progress when the loss was seen (from the `-shm`).
    #[serde(default)]
    pub backfill_at_loss: Option<Backfill>,
    /// The loss left the live main file torn (see [`Backfill::tears_main`]): it needs repair.
    #[serde(default)]
    pub main_torn: bool,
    /// Reason `stale-wal` only: what the WAL's record said and what the main file at the path
    /// was instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_wal: Option<crate::stale_wal::Mismatch>,
}

impl Manifest {
    /// The manifest's file name inside a capture directory.
    pub const FILE_NAME: &'static str = MANIFEST_NAME;

    /// The database's exact pathname: from `database_hex` when the path is not UTF-8.
    pub fn database_path(&self) -> PathBuf {
        paths::path_from_parts(self.database.clone(), self.database_hex.as_deref())
            .unwrap_or_else(|_| PathBuf::from(&self.database))
    }

    /// Whether the capture is of a replaced main file (a restore: an operator's decision), as
    /// opposed to a lost `-wal`/`-shm` (an accident).
    pub fn is_main_replaced(&self) -> bool {
        self.reason == Some(RetireReason::MainReplaced)
    }

    /// Reads the manifest of the capture directory `capture` (e.g. [`GuardStatus::capture`]).
    ///
    /// [`GuardStatus::capture`]: crate::status::GuardStatus::capture
    pub fn read(capture: &Path) -> Result<Manifest, crate::error::GuardError> {
        let path = capture.join(MANIFEST_NAME);
        let bytes =
            std::fs::read(&path).map_err(|source| crate::error::GuardError::ManifestRead {
                manifest: path.clone(),
                source,
            })?;
        serde_json::from_slice(&bytes).map_err(|source| crate::error::GuardError::ManifestParse {
            manifest: path,
            source,
        })
    }
}

/// The WAL part of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WalEntry {
    /// Pinned identity.
    pub identity: FileId,
    /// File name inside the artifact (always UTF-8, at most `NAME_MAX` bytes: see
    /// `docs/capture-format.md`).
    pub file: String,
    /// Bytes copied.
    pub bytes: u64,
    /// sha256 of the bytes copied, hex.
    pub sha256: String,
    /// The WAL header.
    pub header: WalHeader,
    /// Valid frames.
    pub frames: u64,
    /// Commit frames among them.
    pub commits: u64,
    /// 1-based index of the last commit frame.
    pub last_commit_frame: Option<u64>,
}

/// The `-shm` part of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ShmEntry {
    /// Pinned identity.
    pub identity: FileId,
}

/// The main-image part of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MainEntry {
    /// Pinned identity.
    pub identity: Option<FileId>,
    /// Size of the image when the copy began.
    pub size: u64,
    /// The database header.
    pub header: MainHeader,
    /// How the image is kept: `copied`, the whole image is in the artifact.
    pub mode: ImageMode,
    /// File name inside the artifact (always UTF-8, at most `NAME_MAX` bytes: see
    /// `docs/capture-format.md`).
    pub file: String,
    /// Bytes copied.
    pub bytes: u64,
    /// sha256 of the bytes copied, hex.
    pub sha256: String,
}

/// How a capture keeps the main image (`main.mode` in the manifest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ImageMode {
    /// The whole image is copied into the artifact.
    Copied,
    /// No image: a stale WAL set aside at the open (reason `stale-wal`). The main file it was
    /// written on is not the one at the path; `recover --main <file>` takes it from the operator.
    Absent,
}

/// What the pathnames resolved to at capture time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PathGeneration {
    /// `<db>`.
    pub main: Option<FileId>,
    /// `<db>-wal`.
    pub wal: Option<FileId>,
    /// `<db>-shm`.
    pub shm: Option<FileId>,
}

/// Injected capture failures (test builds only: the `test-hooks` feature).
#[cfg(any(test, feature = "test-hooks"))]
static FAULTS: parking_lot::Mutex<Vec<(PathBuf, String)>> = parking_lot::Mutex::new(Vec::new());

/// Test hook: make every capture of a database under `dir` fail with `message` (as a disk-full
/// would) until [`clear_capture_fault`] is called. Scoped by directory so parallel tests do not
/// see each other's faults.
#[cfg(any(test, feature = "test-hooks"))]
pub fn inject_capture_fault(dir: &Path, message: &str) {
    FAULTS.lock().push((dir.to_path_buf(), message.to_owned()));
}

/// Test hook: undo [`inject_capture_fault`] for `dir`.
#[cfg(any(test, feature = "test-hooks"))]
pub fn clear_capture_fault(dir: &Path) {
    FAULTS.lock().retain(|(d, _)| d != dir);
}

#[cfg(any(test, feature = "test-hooks"))]
fn injected_fault(database: &Path) -> Option<String> {
    let faults = FAULTS.lock();
    faults
        .iter()
        .find(|(dir, _)| database.starts_with(dir))
        .map(|(_, m)| m.clone())
}

/// Without the test hooks no fault is ever injected, and nothing is locked to find that out.
#[cfg(not(any(test, feature = "test-hooks")))]
#[inline]
fn injected_fault(_database: &Path) -> Option<String> {
    None
}

/// The name a capture gives `name` in a place that holds at most `max` bytes: `name` itself
/// when it is UTF-8 and fits, else the longest prefix of it (cut at a character boundary, each
/// invalid UTF-8 sequence shown as `_`) that leaves room for `~` and the first 16 hex digits of
/// the sha256 of the full name's bytes. Always UTF-8, never longer than `max`.
pub fn fitted_name(name: &OsStr, max: usize) -> String {
    let bytes = name.as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        if s.len() <= max {
            return s.to_owned();
        }
    }
    let hash = paths::hex(&Sha256::digest(bytes)[..NAME_HASH_HEX / 2]);
    let room = max.saturating_sub(1 + NAME_HASH_HEX);
    let mut stem = String::with_capacity(room);
    for c in String::from_utf8_lossy(bytes).chars() {
        let c = if c == char::REPLACEMENT_CHARACTER {
            '_'
        } else {
            c
        };
        if stem.len() + c.len_utf8() > room {
            break;
        }
        stem.push(c);
    }
    format!("{stem}~{hash}")
}

/// The stem of the artifact directory of a database named `name`:
/// `<stem>.retired-wal-<UTC>-<pid>[-n][.partial]` always fits [`NAME_MAX`].
pub fn capture_dir_stem(name: &OsStr) -> String {
    fitted_name(name, DIR_STEM_MAX)
}

/// The name of the main image inside the artifact of a database named `name`; the WAL is this
/// plus `-wal`. Opening the two as a database still fits `-shm` and `-journal` in [`NAME_MAX`].
pub fn capture_file_name(name: &OsStr) -> String {
    fitted_name(name, FILE_STEM_MAX)
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
    let parent = database
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = database.file_name().ok_or_else(|| {
        io_err(
            database,
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "database path has no file name",
            ),
        )
    })?;
    if let Some(message) = injected_fault(database) {
        return Err(io_err(parent, io::Error::other(message)));
    }

    // The directory held since the open, wherever it is now; without one, the parent by path.
    let opened: OwnedFd;
    let (dir_fd, dir_path) = match input.dir {
        Some(dir) => (dir.fd(), dir.current_path()),
        None => {
            opened = open_dir(rustix::fs::CWD, parent).map_err(|e| io_err(parent, e))?;
            (opened.as_fd(), parent.to_path_buf())
        }
    };

    let stem = capture_dir_stem(name);
    let file_name = capture_file_name(name);
    if let Some((existing, wal)) = find_identical_capture(input, dir_fd, &stem) {
        let existing = dir_path.join(existing);
        log::warn!(
            "hermes-guard: the retired generation of {} is already captured, byte for byte, in {} \
             (by another process); not writing it again",
            database.display(),
            existing.display()
        );
        crate::sqlite_log::captured(database, &existing);
        return Ok(Captured { dir: existing, wal });
    }
    let (final_name, staging_name) = reserve_staging(dir_fd, &stem)
        .map_err(|(staging, e)| io_err(&dir_path.join(staging), e))?;
    let final_dir = dir_path.join(&final_name);
    let staging_dir = dir_path.join(&staging_name);

    let mut staging_fd = None;
    let result = open_dir(dir_fd, Path::new(&staging_name)).and_then(|staging| {
        let staging = staging_fd.insert(staging);
        let manifest = fill_staging(input, staging.as_fd(), &file_name)?;
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        write_synced(staging.as_fd(), MANIFEST_NAME, |f| f.write_all(&json))?;
        rustix::fs::fsync(&*staging)?;
        rustix::fs::renameat(dir_fd, &staging_name, dir_fd, &final_name)?;
        rustix::fs::fsync(dir_fd)?;
        Ok(CapturedWal {
            bytes: manifest.wal.bytes,
            sha256: manifest.wal.sha256,
        })
    });
    match result {
        Ok(wal) => {
            log::warn!(
                "hermes-guard: captured the retired generation of {} into {} (trigger {:?})",
                database.display(),
                final_dir.display(),
                input.trigger
            );
            crate::sqlite_log::captured(database, &final_dir);
            Ok(Captured {
                dir: final_dir,
                wal,
            })
        }
        Err(e) => {
            if let Some(staging) = &staging_fd {
                let wal_name = format!("{file_name}-wal");
                for f in [MANIFEST_NAME, file_name.as_str(), wal_name.as_str()] {
                    let _ = rustix::fs::unlinkat(staging, f, AtFlags::empty());
                }
            }
            let _ = rustix::fs::unlinkat(dir_fd, &staging_name, AtFlags::REMOVEDIR);
            Err(io_err(&staging_dir, e))
        }
    }
}

/// A complete capture in `dir` of exactly the WAL `input` would capture: the same main and WAL
/// inodes, the same size and the same sha256. Another process that retired the same generation
/// (the WAL inode is shared) has captured it already. The WAL is hashed only when a candidate's
/// inodes and size match; anything unreadable is no match.
fn find_identical_capture(
    input: &CaptureInput<'_>,
    dir: BorrowedFd<'_>,
    stem: &str,
) -> Option<(String, CapturedWal)> {
    let prefix = format!("{stem}{ARTIFACT_MARKER}");
    let size = input.wal.size().ok()?;
    let mut our_sha256: Option<String> = None;
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
        if !same_files || captured.wal.bytes != size {
            continue;
        }
        if our_sha256.is_none() {
            our_sha256 = Some(sha256_of(input.wal.file(), size).ok()?);
        }
        if our_sha256.as_deref() == Some(captured.wal.sha256.as_str()) {
            let wal = CapturedWal {
                bytes: captured.wal.bytes,
                sha256: captured.wal.sha256,
            };
            return Some((name.to_owned(), wal));
        }
    }
    None
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
}

impl CapturedWal {
    /// Whether `wal` holds exactly these bytes now: the same size, then the same sha256 (the WAL
    /// is read through the pinned descriptor only when the sizes match). A WAL that was appended
    /// to, or rewritten in place after a restart by a peer still attached to it, is not the same.
    pub(crate) fn is_held_by(&self, wal: &PinnedWal) -> bool {
        wal.size().is_ok_and(|size| size == self.bytes)
            && sha256_of(wal.file(), self.bytes).is_ok_and(|sha| sha == self.sha256)
    }
}

fn read_captured_wal(dir: BorrowedFd<'_>, capture: &str) -> Option<Manifest> {
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

/// Picks the first free `<stem>.retired-wal-<UTC>-<pid>[-n]` in `dir` and creates its
/// `.partial` staging directory; returns (final name, staging name).
pub(crate) fn reserve_staging(
    dir: BorrowedFd<'_>,
    stem: &str,
) -> Result<(String, String), (String, io::Error)> {
    let stamp = utc_stamp(SystemTime::now());
    let base = format!("{stem}{ARTIFACT_MARKER}{stamp}-{}", std::process::id());
    for n in 0u32.. {
        let candidate = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        let staging = format!("{candidate}{STAGING_SUFFIX}");
        match rustix::fs::statat(dir, &candidate, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => continue,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err((staging, e.into())),
        }
        match rustix::fs::mkdirat(dir, &staging, Mode::from_raw_mode(0o755)) {
            Ok(()) => return Ok((candidate, staging)),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err((staging, e.into())),
        }
    }
    Err((
        format!("{base}{STAGING_SUFFIX}"),
        io::Error::other("no free artifact name"),
    ))
}

/// `yyyymmdd-HHMMSS` in UTC.
fn utc_stamp(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string(); // 2026-11-29T19:35:18Z
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}

/// Creates `name` in the directory `dir` (it must not exist), fills it and fsyncs it.
pub(crate) fn write_synced(
    dir: BorrowedFd<'_>,
    name: &str,
    body: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
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
    write_synced(staging, &wal_name, |out| {
        let src = ReadAt {
            file: input.wal.file(),
            pos: 0,
        };
        wal_digest = sha256_stream(src, |chunk| {
            scanner.feed(chunk);
            out.write_all(chunk)
        })?;
        Ok(())
    })?;
    let (wal_sha256, wal_bytes) = wal_digest;
    let summary = scanner.finish();

    let main_size = input.main.size()?;
    let mut main_digest = (String::new(), 0u64);
    let mut header_bytes = Vec::with_capacity(100);
    write_synced(staging, name, |out| {
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
            header: summary.header,
            frames: summary.frames,
            commits: summary.commits,
            last_commit_frame: summary.last_commit_frame,
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
        path_generation_at_capture: PathGeneration {
            main: identity_of_path(input.database).ok().flatten(),
            wal: identity_of_path(&sidecar(input.database, "-wal"))
                .ok()
                .flatten(),
            shm: identity_of_path(&sidecar(input.database, "-shm"))
                .ok()
                .flatten(),
        },
    })
}

// Where the guard (src/vfs) has always found it.
pub(crate) use crate::paths::sidecar;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamp_is_compact_date_and_time() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_000_000);
        assert_eq!(utc_stamp(t), "20261130-005320");
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(paths::hex(&[0, 15, 255]), "000fff");
    }

    #[test]
    fn artifact_names_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir(rustix::fs::CWD, dir.path()).unwrap();
        let (first, first_staging) = reserve_staging(fd.as_fd(), "state.db").unwrap();
        assert!(first.starts_with("state.db.retired-wal-"));
        assert_eq!(first_staging, format!("{first}.partial"));
        // A staging directory in progress holds its name...
        let (second, _) = reserve_staging(fd.as_fd(), "state.db").unwrap();
        assert_ne!(first, second);
        // ...and so does a finished one.
        std::fs::rename(dir.path().join(&first_staging), dir.path().join(&first)).unwrap();
        let (third, _) = reserve_staging(fd.as_fd(), "state.db").unwrap();
        assert!(third != first && third != second);
    }

    fn longest_dir_name(stem: &str) -> usize {
        format!(
            "{stem}{ARTIFACT_MARKER}20261130-005320-{}-{}{STAGING_SUFFIX}",
            u32::MAX,
            u32::MAX
        )
        .len()
    }

    #[test]
    fn a_short_utf8_name_is_kept_as_it_is() {
        let name = OsStr::new("state.db");
        assert_eq!(capture_dir_stem(name), "state.db");
        assert_eq!(capture_file_name(name), "state.db");
    }

    #[test]
    fn every_legal_name_length_fits_name_max_in_the_artifact() {
        for len in 1..=NAME_MAX {
            let raw = "s".repeat(len);
            let name = OsStr::new(&raw);
            let stem = capture_dir_stem(name);
            assert!(longest_dir_name(&stem) <= NAME_MAX, "{len}: {stem}");
            let file = capture_file_name(name);
            assert!(file.len() + "-journal".len() <= NAME_MAX, "{len}: {file}");
            if len <= DIR_STEM_MAX {
                assert_eq!(stem, raw);
            } else {
                assert!(stem.contains('~'), "{len}: {stem}");
            }
        }
    }

    #[test]
    fn a_shortened_name_keeps_a_prefix_and_a_hash_of_the_whole_name() {
        let a = "a".repeat(250) + "1";
        let b = "a".repeat(250) + "2";
        let (sa, sb) = (
            capture_dir_stem(OsStr::new(&a)),
            capture_dir_stem(OsStr::new(&b)),
        );
        assert_ne!(sa, sb, "names differing past the cut are told apart");
        assert_eq!(sa.len(), DIR_STEM_MAX);
        assert!(sa.starts_with(&"a".repeat(DIR_STEM_MAX - 17)));
    }

    #[test]
    fn a_shortened_name_is_cut_at_a_character_boundary() {
        let raw = "é".repeat(127); // 254 bytes
        let stem = capture_dir_stem(OsStr::new(&raw));
        assert!(stem.len() <= DIR_STEM_MAX);
        assert!(stem
            .trim_end_matches(|c: char| c.is_ascii_hexdigit())
            .ends_with("é~"));
    }

    #[test]
    fn a_non_utf8_name_gets_a_utf8_name_with_a_hash() {
        let name = OsStr::from_bytes(b"st\xffate.db");
        let file = capture_file_name(name);
        assert!(file.starts_with("st_ate.db~"), "{file}");
        assert_eq!(file.len(), "st_ate.db~".len() + 16);
        let other = capture_file_name(OsStr::from_bytes(b"st\xfeate.db"));
        assert_ne!(file, other);
    }
}
