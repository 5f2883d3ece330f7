//! `healed.json`: a capture whose generation was healed into the live file at close says so, so
//! that nothing merges its rows a second time.
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
    /// Its length: the bytes the heal puts back at `<db>-wal` (absent in records written before
    /// it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Their sha256, hex: with `bytes`, what the live `-wal` shows once the heal's commit point
    /// (the rename) is passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
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
    /// A heal stopped, and nothing durable says whether it passed its commit point: its staging
    /// file is gone (deleted by hand?), and neither the live `-wal` (the length and sha256 the
    /// record names) nor the main file (every page of the healed frames) shows the heal's bytes.
    /// Read as rolled back: `recover` merges the rows, comparing each added row with the live
    /// row of its rowid, so a row the heal did put back is not inserted twice.
    Undetermined {
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
            HealState::Undetermined { .. } => {
                "a heal at close was interrupted, its staging file is gone and the live file does \
                 not show its bytes: read as rolled back (recover merges the rows, each once)"
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
            let places = database_places(dir, database);
            for db in &places {
                let staging = with_suffix(db, &format!("-wal{}", put_back.suffix));
                if identity_of_path(&staging)? == Some(put_back.identity)
                    || holds_capture_prefix(dir, &staging)?
                {
                    return Ok(HealState::RolledBack { record });
                }
            }
            // Healed only when the live files show it: the WAL it put back at the path, or every
            // page of its frames in the main file.
            for db in &places {
                if live_wal_shows(dir, db, &record, put_back)? || main_shows(dir, db, &record)? {
                    return Ok(HealState::Healed {
                        record,
                        interrupted: true,
                    });
                }
            }
            HealState::Undetermined { record }
        }
    })
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// sha256 (hex) of the first `len` bytes of `file`; `None` when it is shorter.
fn sha256_prefix(file: &File, len: u64) -> io::Result<Option<String>> {
    if file.metadata()?.len() < len {
        return Ok(None);
    }
    let reader = io::Read::take(crate::digest::ReadAt { file, pos: 0 }, len);
    let (sha, n) = crate::digest::sha256_stream(reader, |_| Ok(()))?;
    Ok((n == len).then_some(sha))
}

fn open_if_there(path: &Path) -> io::Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The captured WAL's page size and its file, for the record's frames.
fn captured_wal(dir: &Path) -> io::Result<Option<(File, u64)>> {
    let Ok(manifest) = super::Manifest::read(dir) else {
        return Ok(None);
    };
    let page = u64::from(manifest.wal.header.page_size);
    if page == 0 {
        return Ok(None);
    }
    Ok(open_if_there(&dir.join(&manifest.wal.file))?.map(|f| (f, page)))
}

/// Whether `<db>-wal` begins with the bytes the heal put back: the length and sha256 the record
/// names, or (a record without them) the captured WAL up to the healed frames.
fn live_wal_shows(
    dir: &Path,
    db: &Path,
    record: &HealRecord,
    put_back: &PutBack,
) -> io::Result<bool> {
    let Some(live) = open_if_there(&with_suffix(db, "-wal"))? else {
        return Ok(false);
    };
    let (len, want) = match (put_back.bytes, &put_back.sha256) {
        (Some(len), Some(sha)) => (len, sha.clone()),
        _ => {
            let Some((wal, page)) = captured_wal(dir)? else {
                return Ok(false);
            };
            let len = crate::walfile::WAL_HEADER_SIZE as u64
                + record.frames * (crate::walfile::WAL_FRAME_HEADER_SIZE as u64 + page);
            match sha256_prefix(&wal, len)? {
                Some(sha) => (len, sha),
                None => return Ok(false),
            }
        }
    };
    Ok(len > crate::walfile::WAL_HEADER_SIZE as u64
        && sha256_prefix(&live, len)?.is_some_and(|sha| sha.eq_ignore_ascii_case(&want)))
}

/// Whether the main file at `db` holds, for every page the healed frames wrote, that page as the
/// last of those frames has it: the heal (or SQLite replaying the WAL it put back) checkpointed
/// them, and nothing rewrote them since. One read per page.
fn main_shows(dir: &Path, db: &Path, record: &HealRecord) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let (Some((wal, page)), Some(main)) = (captured_wal(dir)?, open_if_there(db)?) else {
        return Ok(false);
    };
    let frame = crate::walfile::WAL_FRAME_HEADER_SIZE as u64 + page;
    let mut last = std::collections::HashMap::new();
    let mut head = [0u8; 4];
    for i in 0..record.frames {
        let at = crate::walfile::WAL_HEADER_SIZE as u64 + i * frame;
        if wal.read_exact_at(&mut head, at).is_err() {
            return Ok(false);
        }
        last.insert(u32::from_be_bytes(head), at);
    }
    if last.is_empty() || last.contains_key(&0) {
        return Ok(false);
    }
    let (mut a, mut b) = (vec![0u8; page as usize], vec![0u8; page as usize]);
    for (pgno, at) in last {
        wal.read_exact_at(&mut a, at + crate::walfile::WAL_FRAME_HEADER_SIZE as u64)?;
        if main
            .read_exact_at(&mut b, u64::from(pgno - 1) * page)
            .is_err()
            || a != b
        {
            return Ok(false);
        }
    }
    Ok(true)
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

/// Where the database is (its staging file and `-wal` beside it): beside the capture `dir`
/// (wherever the directory went since), or — for a capture in a fallback capture directory — at
/// the database's recorded path.
fn database_places(dir: &Path, database: &Path) -> Vec<PathBuf> {
    let name = database.file_name().unwrap_or_default();
    let mut paths = vec![dir.parent().unwrap_or(Path::new(".")).join(name)];
    if let Some(parent) = database.parent().filter(|p| !p.as_os_str().is_empty()) {
        let recorded = parent.join(name);
        if recorded != paths[0] {
            paths.push(recorded);
        }
    }
    paths
}

/// Writes `record` as the capture's `healed.json` (in the capture directory `dir`), durably: a
/// new file with the database's `permissions`, fsynced, renamed over the name, the directory
/// fsynced.
pub(crate) fn write_record(
    dir: BorrowedFd<'_>,
    record: &HealRecord,
    permissions: &crate::permissions::Permissions,
) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    let tmp = format!("{HEALED_NAME}.{}.tmp", std::process::id());
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), rustix::fs::AtFlags::empty());
    super::write_synced(dir, &tmp, permissions, |f: &mut File| f.write_all(&json))?;
    rustix::fs::renameat(dir, tmp.as_str(), dir, HEALED_NAME)?;
    rustix::fs::fsync(dir.as_fd())?;
    Ok(())
}
