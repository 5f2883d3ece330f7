//! Captures already on disk: the WAL bytes one holds, its manifest read back, and the search for
//! one identical to what a capture would write (another process, or another connection of this
//! one, captured the same generation first).

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{Mode, OFlags};

use super::unacknowledged::{generation_size, FailedCommit};
use super::{
    base_file, BasePages, CaptureInput, Manifest, ARTIFACT_MARKER, MANIFEST_NAME, STAGING_SUFFIX,
};
use crate::digest::{sha256_stream, ReadAt};
use crate::identity::PinnedWal;

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
pub(super) fn find_identical_capture(
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

/// The WAL bytes a capture holds: its size and sha256 (hex), as its manifest records them.
#[derive(Clone)]
pub(crate) struct CapturedWal {
    pub(super) bytes: u64,
    pub(super) sha256: String,
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

/// The manifest of the capture `capture` in `dir`, if it can be read.
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
