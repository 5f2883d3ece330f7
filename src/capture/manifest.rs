//! `manifest.json`: what a capture holds and where it came from (`docs/capture-format.md`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::MANIFEST_NAME;
use crate::identity::FileId;
use crate::paths;
use crate::status::{Backfill, RetireReason};
use crate::walfile::{MainHeader, WalHeader};

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
    pub stale_wal: Option<crate::wal_base_record::Mismatch>,
    /// Whether the main image is the one the WAL generation was written on, and what shows it.
    /// Absent in captures written before it was recorded (read as unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseEntry>,
    /// The base of the pages the WAL carries, as far as the capturing process kept them
    /// (`<file>-base`). Absent when none was kept, and in captures written before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_pages: Option<super::BasePagesEntry>,
}

/// Whether a capture's main image is the file its WAL generation was written on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaseVerdict {
    /// Shown: nothing but that generation (and the file it started on) is in the image.
    Own,
    /// Shown not to be: the main file was replaced or overwritten, so the image is another file.
    NotOwn,
    /// Nothing shows it either way: a newer generation may have checkpointed into the image.
    Unknown,
}

impl BaseVerdict {
    /// The word `captures` and `verify` print.
    pub fn word(self) -> &'static str {
        match self {
            BaseVerdict::Own => "own",
            BaseVerdict::NotOwn => "not own",
            BaseVerdict::Unknown => "unknown",
        }
    }
}

/// The manifest's `base`: the verdict and, for a person, the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BaseEntry {
    /// The verdict.
    pub verdict: BaseVerdict,
    /// What shows it, in words.
    pub evidence: String,
}

impl BaseEntry {
    /// A verdict and its evidence.
    pub fn new(verdict: BaseVerdict, evidence: impl Into<String>) -> BaseEntry {
        BaseEntry {
            verdict,
            evidence: evidence.into(),
        }
    }
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
        matches!(
            self.reason,
            Some(RetireReason::MainReplaced | RetireReason::MainOverwritten)
        )
    }

    /// Whether the main image is the one the WAL generation was written on: what the capture
    /// recorded, unknown for a capture that recorded nothing.
    pub fn base_verdict(&self) -> BaseVerdict {
        self.base
            .as_ref()
            .map_or(BaseVerdict::Unknown, |b| b.verdict)
    }

    /// The base's evidence in words (what a capture without a record means, for one).
    pub fn base_evidence(&self) -> &str {
        self.base.as_ref().map_or(
            "the capture records no base (written before bases were recorded): nothing shows \
             whether a newer generation had checkpointed into its image",
            |b| b.evidence.as_str(),
        )
    }

    /// Reads the manifest of the capture directory `capture` (e.g. [`GuardStatus::capture`]).
    ///
    /// [`GuardStatus::capture`]: crate::status::GuardStatus::capture
    pub fn read(capture: &Path) -> Result<Manifest, ManifestError> {
        let path = capture.join(MANIFEST_NAME);
        let bytes = std::fs::read(&path).map_err(|source| ManifestError::Read {
            manifest: path.clone(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|source| ManifestError::Parse {
            manifest: path,
            source,
        })
    }
}

/// A capture's `manifest.json` that could not be read ([`Manifest::read`]); the one reader of it
/// (recovery's `read_manifest` adds its checks on top).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The file could not be read.
    #[error("reading the capture manifest {manifest}: {source}")]
    Read {
        /// The manifest's path.
        manifest: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// It is not a manifest this version reads.
    #[error("parsing the capture manifest {manifest}: {source}")]
    Parse {
        /// The manifest's path.
        manifest: std::path::PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
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
    /// The generation the WAL holds (`crate::walfile::generation_id`: its header's salts,
    /// checkpoint sequence and checksum, and its first frame's checksum); with `frames`, the
    /// range of it this capture holds. Absent from captures written before it was recorded, and
    /// for a WAL without a valid frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    /// A commit failed to the application (never acknowledged: the check after its commit
    /// frame found the files changed) whose frames the WAL file held after the bytes copied:
    /// left out. Absent when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_commit: Option<FailedCommitEntry>,
}

/// Where a commit failed to the application began in the WAL file (`wal.failed_commit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FailedCommitEntry {
    /// The offset of the failed transaction's first write: the WAL copied ends there (or at
    /// 32, the WAL header, when that write restarted the WAL).
    pub at: u64,
    /// The first 24 bytes of that write, hex: another process of the same generation leaves the
    /// same frames out while its WAL holds them there.
    pub first_bytes: String,
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
    /// The salts in the header of the `<db>-wal` at the path, when one was there with a valid
    /// header: the captured generation's own salts say it is that WAL or a copy of it (whose
    /// commits a newer generation may have read); others, a newer generation's own WAL.
    /// Absent in captures written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_salts: Option<[u32; 2]>,
}

impl PathGeneration {
    /// The pathnames of `database` and its sidecars as they resolve now (`wal_salts` read from
    /// the `-wal`'s first 32 bytes).
    pub(crate) fn of(database: &std::path::Path) -> PathGeneration {
        use crate::identity::identity_of_path;
        let wal_path = crate::paths::sidecar(database, "-wal");
        let wal_salts = std::fs::File::open(&wal_path).ok().and_then(|f| {
            let mut header = [0u8; 32];
            std::os::unix::fs::FileExt::read_exact_at(&f, &mut header, 0).ok()?;
            let parsed = crate::walfile::parse_wal_header(&header);
            parsed.valid.then_some(parsed.salts)
        });
        PathGeneration {
            main: identity_of_path(database).ok().flatten(),
            wal: identity_of_path(&wal_path).ok().flatten(),
            shm: identity_of_path(&crate::paths::sidecar(database, "-shm"))
                .ok()
                .flatten(),
            wal_salts,
        }
    }
}
