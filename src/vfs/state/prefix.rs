//! The committed prefix of a pinned WAL: what a heal puts back (`state/healing.rs`) and what a WAL
//! left for an opener is compared with (`state/left.rs`).

use std::os::unix::fs::FileExt;

use super::heal_error::HealError;
use crate::identity::PinnedWal;
use crate::walfile::{WalScanner, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// The committed prefix of the pinned WAL: its page size, frames, commits and the database
/// size in pages after its last commit.
pub(super) struct Prefix {
    pub(super) page: usize,
    pub(super) frames: u64,
    pub(super) commits: u64,
}

impl Prefix {
    pub(super) fn frame_len(&self) -> u64 {
        (WAL_FRAME_HEADER_SIZE + self.page) as u64
    }

    /// Bytes of the WAL up to the end of its last commit frame.
    pub(super) fn bytes(&self) -> u64 {
        WAL_HEADER_SIZE as u64 + self.frames * self.frame_len()
    }
}

/// The committed prefix of `wal` up to `end` (`None`: the whole file; see
/// `Inner::generation_end`).
pub(super) fn committed_prefix(wal: &PinnedWal, end: Option<u64>) -> Result<Prefix, HealError> {
    let file = wal.file();
    let mut scanner = WalScanner::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = 0u64;
    let end = end.unwrap_or(u64::MAX);
    while at < end {
        let want = usize::try_from(end - at).map_or(chunk.len(), |left| left.min(chunk.len()));
        let n = file
            .read_at(&mut chunk[..want], at)
            .map_err(|source| HealError::ReadWal {
                wal: wal.id(),
                source,
            })?;
        if n == 0 {
            break;
        }
        scanner.feed(&chunk[..n]);
        at += n as u64;
    }
    let summary = scanner.finish();
    let page = summary.header.page_size as usize;
    if !summary.header.valid || summary.committed_frames == 0 || page == 0 {
        return Err(HealError::NoCommittedFrame { wal: wal.id() });
    }
    Ok(Prefix {
        page,
        frames: summary.committed_frames,
        commits: summary.commits,
    })
}
