//! Writing a retired generation next to its database: the WAL from the pinned descriptor, the
//! main image as the retiring connection sees it, and `manifest.json`.
//!
//! The artifact is staged in a `.partial` directory, every file and the directory fsynced, then
//! renamed into place: a directory without `.partial` is complete. Memory stays bounded by one
//! copy buffer whatever the WAL's size.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::identity::{identity_of_path, FileId, PinnedWal};
use crate::status::{Backfill, RetireReason};
use crate::walfile::{parse_main_header, MainHeader, WalHeader, WalScanner};

/// Name of the manifest inside an artifact directory.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Marker between the database's name and the timestamp in an artifact's directory name.
pub const ARTIFACT_MARKER: &str = ".retired-wal-";

const STAGING_SUFFIX: &str = ".partial";
const COPY_CHUNK: usize = 1 << 20;

/// Why a capture was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    /// At the first refused write.
    Halt,
    /// At close, when the loss was first seen there.
    Close,
}

/// A capture that could not be made. Nothing is left behind but, at worst, a `.partial` directory.
#[derive(Debug, thiserror::Error)]
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
    /// The database's pathname.
    pub database: &'a Path,
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

/// `manifest.json`, version 1 (keys compatible with the Python implementation).
#[derive(Debug, Serialize)]
pub struct Manifest {
    /// Format version: 1.
    pub version: u32,
    /// The database's pathname.
    pub database: String,
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
    pub backfill_at_loss: Option<Backfill>,
    /// The loss left the live main file torn (see [`Backfill::tears_main`]): it needs repair.
    pub main_torn: bool,
}

/// The WAL part of the manifest.
#[derive(Debug, Serialize)]
pub struct WalEntry {
    /// Pinned identity.
    pub identity: FileId,
    /// File name inside the artifact.
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
#[derive(Debug, Serialize)]
pub struct ShmEntry {
    /// Pinned identity.
    pub identity: FileId,
}

/// The main-image part of the manifest.
#[derive(Debug, Serialize)]
pub struct MainEntry {
    /// Pinned identity.
    pub identity: Option<FileId>,
    /// Size of the image when the copy began.
    pub size: u64,
    /// The database header.
    pub header: MainHeader,
    /// `copied`: the whole image is in the artifact.
    pub mode: &'static str,
    /// File name inside the artifact.
    pub file: String,
    /// Bytes copied.
    pub bytes: u64,
    /// sha256 of the bytes copied, hex.
    pub sha256: String,
}

/// What the pathnames resolved to at capture time.
#[derive(Debug, Serialize)]
pub struct PathGeneration {
    /// `<db>`.
    pub main: Option<FileId>,
    /// `<db>-wal`.
    pub wal: Option<FileId>,
    /// `<db>-shm`.
    pub shm: Option<FileId>,
}

static FAULTS: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// Test hook: make every capture of a database under `dir` fail with `message` (as a disk-full
/// would) until [`clear_capture_fault`] is called. Scoped by directory so parallel tests do not
/// see each other's faults.
#[doc(hidden)]
pub fn inject_capture_fault(dir: &Path, message: &str) {
    FAULTS.lock().push((dir.to_path_buf(), message.to_owned()));
}

/// Test hook: undo [`inject_capture_fault`] for `dir`.
#[doc(hidden)]
pub fn clear_capture_fault(dir: &Path) {
    FAULTS.lock().retain(|(d, _)| d != dir);
}

fn injected_fault(database: &Path) -> Option<String> {
    let faults = FAULTS.lock();
    faults
        .iter()
        .find(|(dir, _)| database.starts_with(dir))
        .map(|(_, m)| m.clone())
}

/// Writes the artifact and returns its final directory.
pub fn write_capture(input: &CaptureInput<'_>) -> Result<PathBuf, CaptureError> {
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
    let name = database
        .file_name()
        .ok_or_else(|| {
            io_err(
                database,
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "database path has no file name",
                ),
            )
        })?
        .to_string_lossy()
        .into_owned();
    if let Some(message) = injected_fault(database) {
        return Err(io_err(parent, io::Error::other(message)));
    }

    let final_dir = choose_artifact_dir(parent, &name);
    let mut staging = final_dir.clone().into_os_string();
    staging.push(STAGING_SUFFIX);
    let staging = PathBuf::from(staging);
    fs::create_dir(&staging).map_err(|e| io_err(&staging, e))?;

    let result = fill_staging(input, &staging, &name).and_then(|manifest| {
        let json = serde_json::to_vec_pretty(&manifest).map_err(io::Error::other)?;
        write_synced(&staging.join(MANIFEST_NAME), |f| f.write_all(&json))?;
        File::open(&staging)?.sync_all()?;
        fs::rename(&staging, &final_dir)?;
        File::open(parent)?.sync_all()
    });
    match result {
        Ok(()) => {
            log::warn!(
                "hermes-guard: captured the retired generation of {} into {} (trigger {:?})",
                database.display(),
                final_dir.display(),
                input.trigger
            );
            Ok(final_dir)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(io_err(&staging, e))
        }
    }
}

fn choose_artifact_dir(parent: &Path, name: &str) -> PathBuf {
    let stamp = utc_stamp(SystemTime::now());
    let base = format!("{name}{ARTIFACT_MARKER}{stamp}-{}", std::process::id());
    let taken = |p: &Path| {
        let mut staging = p.as_os_str().to_owned();
        staging.push(STAGING_SUFFIX);
        p.exists() || Path::new(&staging).exists()
    };
    let first = parent.join(&base);
    if !taken(&first) {
        return first;
    }
    (1u32..)
        .map(|n| parent.join(format!("{base}-{n}")))
        .find(|p| !taken(p))
        .expect("an unbounded counter finds a free name")
}

/// `yyyymmdd-HHMMSS` in UTC.
fn utc_stamp(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string(); // 2026-11-29T19:35:18Z
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    format!("{}-{}", &digits[..8], &digits[8..14])
}

fn write_synced(path: &Path, body: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    body(&mut f)?;
    f.sync_all()
}

fn fill_staging(input: &CaptureInput<'_>, staging: &Path, name: &str) -> io::Result<Manifest> {
    let mut buf = vec![0u8; COPY_CHUNK];
    let wal_name = format!("{name}-wal");

    let mut scanner = WalScanner::new();
    let mut wal_hash = Sha256::new();
    let mut wal_bytes = 0u64;
    write_synced(&staging.join(&wal_name), |out| {
        let src = input.wal.file();
        loop {
            let n = src.read_at(&mut buf, wal_bytes)?;
            if n == 0 {
                return Ok(());
            }
            let chunk = &buf[..n];
            wal_hash.update(chunk);
            scanner.feed(chunk);
            out.write_all(chunk)?;
            wal_bytes += n as u64;
        }
    })?;
    let summary = scanner.finish();

    let main_size = input.main.size()?;
    let mut main_hash = Sha256::new();
    let mut header_bytes = Vec::with_capacity(100);
    write_synced(&staging.join(name), |out| {
        let mut offset = 0u64;
        while offset < main_size {
            let n = (main_size - offset).min(COPY_CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            input.main.read_at(chunk, offset)?;
            if header_bytes.len() < 100 {
                let take = (100 - header_bytes.len()).min(n);
                header_bytes.extend_from_slice(&chunk[..take]);
            }
            main_hash.update(&*chunk);
            out.write_all(chunk)?;
            offset += n as u64;
        }
        Ok(())
    })?;

    Ok(Manifest {
        version: 1,
        database: input.database.to_string_lossy().into_owned(),
        trigger: input.trigger,
        reason: input.reason,
        pid: std::process::id(),
        captured_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        sqlite: rusqlite::version().to_owned(),
        wal: WalEntry {
            identity: input.wal.id(),
            file: wal_name,
            bytes: wal_bytes,
            sha256: hex(&wal_hash.finalize()),
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
            mode: "copied",
            file: name.to_owned(),
            bytes: main_size,
            sha256: hex(&main_hash.finalize()),
        },
        backfill_at_loss: input.backfill_at_loss,
        main_torn: input.backfill_at_loss.is_some_and(|b| b.tears_main()),
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

/// `<db>` + suffix, e.g. `state.db-wal`.
pub fn sidecar(database: &Path, suffix: &str) -> PathBuf {
    let mut s = database.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

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
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }

    #[test]
    fn artifact_names_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let first = choose_artifact_dir(dir.path(), "state.db");
        fs::create_dir(&first).unwrap();
        let second = choose_artifact_dir(dir.path(), "state.db");
        assert_ne!(first, second);
        assert!(second
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("state.db.retired-wal-"));
    }
}
