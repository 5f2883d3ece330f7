//! `healed.json`: a capture whose generation was healed into the live file at close says so
//! (issue 26), so that nothing merges its rows a second time.
//!
//! The heal (`vfs/state/healing.rs`) writes the record twice, each time durably (a new file,
//! fsynced, renamed over the name, the capture directory fsynced): `started` before its first
//! step that can reach the live file, `done` after its last. A `started` record names the file
//! the heal was about to rename to `<db>-wal` (the retired WAL's committed prefix, already
//! written and synced under a staging name); that rename is the heal's commit point. So a reader
//! of a `started` record tells an interrupted heal by what is in the database's directory:
//!
//! - the staging file still there (same inode, or, under a new device or inode number after a
//!   power cut or a copy, the same bytes as the capture's WAL): the rename never happened, the
//!   live file was not touched — the heal is rolled back and the rows are in the capture only;
//! - the staging file gone: the rename happened, and from then on every open replays the WAL at
//!   the path as after a crash (or a checkpoint already copied it) — the rows are live.
//!
//! A heal after a lost `-shm` puts nothing back (the WAL never left the path): its `started`
//! record has no staging file, and the rows are live from the start.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::identity::{identity_of_path, FileId};

/// The record's file name inside the capture directory.
pub const HEALED_NAME: &str = "healed.json";

/// Where a heal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HealPhase {
    /// Written before the heal's first step that can reach the live file.
    Started,
    /// Written after its last: the main file holds the generation, synced.
    Done,
}

/// The committed prefix of the retired WAL, written beside the database under a staging name
/// before the heal renames it to `<db>-wal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PutBack {
    /// What follows the `-wal` name: the staging file is `<db>-wal<suffix>` in the database's
    /// directory.
    pub suffix: String,
    /// Its identity.
    pub identity: FileId,
}

/// `healed.json`, version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HealRecord {
    /// Format version: 1.
    pub v: u32,
    /// Where the heal stands.
    pub phase: HealPhase,
    /// UTC, RFC 3339, when this record was written.
    pub at: String,
    /// The healing process.
    pub pid: u32,
    /// The main file healed.
    pub main: Option<FileId>,
    /// WAL frames (up to the last commit) and commits healed.
    pub frames: u64,
    /// Commits healed.
    pub commits: u64,
    /// The put-back WAL (`None` after a lost `-shm`: the WAL stayed at the path).
    pub put_back: Option<PutBack>,
}

/// What became of a capture's generation, as far as a heal goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HealState {
    /// Not healed: the rows are in the capture only (unless a merge brought them back).
    NotHealed,
    /// Healed into the live file at close (`interrupted`: the heal stopped after its commit
    /// point, and the WAL it put back at the path carries the rows until a checkpoint copies
    /// them).
    Healed {
        /// The record.
        record: HealRecord,
        /// The heal stopped between its commit point and its end.
        interrupted: bool,
    },
    /// A heal stopped before its commit point: the live file was not touched.
    RolledBack {
        /// The record.
        record: HealRecord,
    },
}

impl HealState {
    /// Whether the generation's rows are in the live file through a heal.
    pub fn is_healed(&self) -> bool {
        matches!(self, HealState::Healed { .. })
    }

    /// One line for a person.
    pub fn describe(&self) -> String {
        match self {
            HealState::NotHealed => "not healed".into(),
            HealState::Healed {
                record,
                interrupted: false,
            } => format!(
                "healed into the live file at close ({} commit(s), {} frame(s), {})",
                record.commits, record.frames, record.at
            ),
            HealState::Healed { record, .. } => format!(
                "healed into the live file at close, interrupted after its commit point (the \
                 WAL put back at the path holds its {} commit(s); SQLite replays it at the next \
                 open)",
                record.commits
            ),
            HealState::RolledBack { .. } => {
                "a heal at close was interrupted before it touched the live file: rolled back, \
                 the rows are in this capture only"
                    .into()
            }
        }
    }
}

/// The heal state of the capture `dir` of the database `database`: read-only.
pub fn heal_state(dir: &Path, database: &Path) -> io::Result<HealState> {
    let bytes = match std::fs::read(dir.join(HEALED_NAME)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(HealState::NotHealed),
        Err(e) => return Err(e),
    };
    let record: HealRecord = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", dir.join(HEALED_NAME).display()),
        )
    })?;
    Ok(match (record.phase, &record.put_back) {
        (HealPhase::Done, _) => HealState::Healed {
            record,
            interrupted: false,
        },
        (HealPhase::Started, None) => HealState::Healed {
            record,
            interrupted: true,
        },
        (HealPhase::Started, Some(put_back)) => {
            let mut still_staged = false;
            for staging in staging_paths(dir, database, &put_back.suffix) {
                if identity_of_path(&staging)? == Some(put_back.identity)
                    || holds_capture_prefix(dir, &staging)?
                {
                    still_staged = true;
                    break;
                }
            }
            if still_staged {
                HealState::RolledBack { record }
            } else {
                HealState::Healed {
                    record,
                    interrupted: true,
                }
            }
        }
    })
}

/// Whether `staging` is there holding a prefix of the capture's WAL, byte for byte (its header at
/// least): the staging file under another device or inode number than the record names, as after
/// a power cut on a filesystem whose device number changes at the next mount (FUSE, network
/// filesystems), or a directory copied elsewhere. Its bytes are the retired WAL's committed
/// prefix, salts included, so another heal's file (a reused pid) does not match.
fn holds_capture_prefix(dir: &Path, staging: &Path) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let staged = match File::open(staging) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let Ok(manifest) = super::Manifest::read(dir) else {
        return Ok(false);
    };
    let wal = File::open(dir.join(&manifest.wal.file))?;
    let len = staged.metadata()?.len();
    if len < crate::walfile::WAL_HEADER_SIZE as u64 || len > wal.metadata()?.len() {
        return Ok(false);
    }
    let (mut a, mut b) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    let mut at = 0u64;
    while at < len {
        let n = a.len().min((len - at) as usize);
        staged.read_exact_at(&mut a[..n], at)?;
        wal.read_exact_at(&mut b[..n], at)?;
        if a[..n] != b[..n] {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// Where `<db>-wal<suffix>` is staged: beside the database, which is beside the capture `dir`
/// (wherever the directory went since), or — for a capture in a fallback capture directory — at
/// the database's recorded path.
fn staging_paths(dir: &Path, database: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut name = database.file_name().unwrap_or_default().to_owned();
    name.push("-wal");
    name.push(suffix);
    let mut paths = vec![dir.parent().unwrap_or(Path::new(".")).join(&name)];
    if let Some(parent) = database.parent().filter(|p| !p.as_os_str().is_empty()) {
        let recorded = parent.join(&name);
        if recorded != paths[0] {
            paths.push(recorded);
        }
    }
    paths
}

/// Writes `record` as the capture's `healed.json` (in the capture directory `dir`), durably: a
/// new file, fsynced, renamed over the name, the directory fsynced.
pub(crate) fn write_record(dir: BorrowedFd<'_>, record: &HealRecord) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    let tmp = format!("{HEALED_NAME}.{}.tmp", std::process::id());
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), rustix::fs::AtFlags::empty());
    super::write_synced(dir, &tmp, |f: &mut File| f.write_all(&json))?;
    rustix::fs::renameat(dir, tmp.as_str(), dir, HEALED_NAME)?;
    rustix::fs::fsync(dir.as_fd())?;
    Ok(())
}
