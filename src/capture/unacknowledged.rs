//! A commit failed to the application is no part of its generation.
//!
//! The frame rule (`vfs/state/frames.rs`) checks the files again after a commit frame is whole;
//! when they changed meanwhile, SQLite is told the commit failed, and the application may retry
//! it on a new connection. Its frames stay in the WAL file — nothing is written to a retired
//! generation to take them back — and a reader of that file finds a valid commit there. So
//! whatever reads the generation from its pinned WAL (the capture, the heal at close, the
//! left-behind check) reads only the bytes before the failed transaction's first write: else
//! the runbook would merge rows the application was told were never committed, beside the ones
//! its retry committed.
//!
//! The cut holds while that first write is still there, byte for byte. Once another writer of
//! the same generation (a peer that shares its `-shm`, never told of the failed frames) wrote
//! there, the bytes from that offset are its frames, acknowledged to it, and the WAL is read
//! whole again.

use std::io;
use std::os::unix::fs::FileExt;

use super::FailedCommitEntry;
use crate::identity::PinnedWal;
use crate::paths::{hex, unhex};
use crate::walfile::WAL_HEADER_SIZE;

/// The bytes of a WAL write compared to tell that it is still there: a frame header (page
/// number, commit size, salts, checksums), or the WAL header's first 24 bytes (magic, version,
/// page size, checkpoint sequence, salts) when the transaction restarted the WAL.
pub(crate) const FIRST_BYTES: usize = 24;

/// Where a commit failed to the application begins in its WAL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FailedCommit {
    /// The offset of the failed transaction's first write: its first frame, or 0 when it
    /// restarted the WAL (a new header, then its frames).
    pub(crate) from: u64,
    /// The first [`FIRST_BYTES`] bytes it wrote there.
    pub(crate) first_bytes: [u8; FIRST_BYTES],
}

impl FailedCommit {
    /// As a manifest records it.
    pub(crate) fn entry(&self) -> FailedCommitEntry {
        FailedCommitEntry {
            at: self.from,
            first_bytes: hex(&self.first_bytes),
        }
    }

    /// From a manifest's record; `None` when it is malformed.
    pub(crate) fn from_entry(entry: &FailedCommitEntry) -> Option<FailedCommit> {
        let first_bytes = unhex(&entry.first_bytes)?.try_into().ok()?;
        Some(FailedCommit {
            from: entry.at,
            first_bytes,
        })
    }

    /// Where the generation's bytes end in `wal`: `Some(offset)` while the failed transaction's
    /// first write is still there (a restarted WAL keeps its new header: 32 bytes, no frame);
    /// `None`, the whole file, once anything else is there. An error reading proves nothing:
    /// the whole file (the cut is lost, never a frame of anybody else's).
    pub(crate) fn end_in(&self, wal: &PinnedWal) -> Option<u64> {
        let mut there = [0u8; FIRST_BYTES];
        match wal.file().read_exact_at(&mut there, self.from) {
            Ok(()) if there == self.first_bytes => Some(self.from.max(WAL_HEADER_SIZE as u64)),
            Ok(()) => None,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
            Err(e) => {
                log::warn!(
                    "hermes-guard: could not read the WAL (inode {}) at byte {} to tell whether a \
                     failed commit's frames are still there ({e}): it is read whole",
                    wal.id(),
                    self.from
                );
                None
            }
        }
    }
}

/// The generation's bytes of `wal`: the whole file, or up to where `failed` begins.
pub(crate) fn generation_end(wal: &PinnedWal, failed: Option<&FailedCommit>) -> Option<u64> {
    failed.and_then(|f| f.end_in(wal))
}

/// The size of the generation's part of `wal` now.
pub(crate) fn generation_size(wal: &PinnedWal, failed: Option<&FailedCommit>) -> io::Result<u64> {
    let size = wal.size()?;
    Ok(generation_end(wal, failed).map_or(size, |end| end.min(size)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn wal_of(bytes: &[u8]) -> (tempfile::TempDir, PinnedWal) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db-wal");
        fs::write(&path, bytes).expect("write");
        let pinned = PinnedWal::open(&path).expect("pin");
        (dir, pinned)
    }

    fn failed_at(from: u64, bytes: &[u8]) -> FailedCommit {
        let mut first_bytes = [0u8; FIRST_BYTES];
        first_bytes.copy_from_slice(&bytes[from as usize..from as usize + FIRST_BYTES]);
        FailedCommit { from, first_bytes }
    }

    #[test]
    fn a_failed_commit_still_in_place_ends_the_generation_where_it_began() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let (_dir, wal) = wal_of(&bytes);
        let failed = failed_at(80, &bytes);
        assert_eq!(generation_end(&wal, Some(&failed)), Some(80));
        assert_eq!(generation_size(&wal, Some(&failed)).unwrap(), 80);
        assert_eq!(generation_size(&wal, None).unwrap(), 200);
    }

    #[test]
    fn a_restart_that_failed_keeps_its_header_and_no_frame() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let (_dir, wal) = wal_of(&bytes);
        let failed = failed_at(0, &bytes);
        assert_eq!(generation_end(&wal, Some(&failed)), Some(32));
    }

    #[test]
    fn frames_written_over_the_failed_commit_are_read_whole() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let failed = failed_at(80, &bytes);
        let mut over = bytes.clone();
        over[90] ^= 0xff;
        let (_dir, wal) = wal_of(&over);
        assert_eq!(generation_end(&wal, Some(&failed)), None);
        assert_eq!(generation_size(&wal, Some(&failed)).unwrap(), 200);
    }

    #[test]
    fn a_manifests_record_reads_back_as_the_same_failed_commit() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let failed = failed_at(80, &bytes);
        assert_eq!(FailedCommit::from_entry(&failed.entry()), Some(failed));
        let mut short = failed.entry();
        short.first_bytes.truncate(46);
        assert_eq!(FailedCommit::from_entry(&short), None);
    }

    #[test]
    fn a_wal_truncated_below_the_failed_commit_is_read_whole() {
        let bytes: Vec<u8> = (0..200u8).collect();
        let failed = failed_at(80, &bytes);
        let (_dir, wal) = wal_of(&bytes[..90]);
        assert_eq!(generation_end(&wal, Some(&failed)), None);
    }
}
