//! The frame rule: which WAL writes of a write transaction are checked before their first byte,
//! and which commit is checked again after its last.
//!
//! SQLite writes a WAL frame as two writes: its 24-byte header, then its page at the header's
//! offset + 24 (`walWriteOneFrame`). A newer generation that shares the WAL file (the `-shm`
//! replaced, the `-wal` left at the path) cannot see this connection's locks, so it may write
//! its own frames at the offsets this one is writing, or truncate the file, at any moment after
//! the replacement. So:
//!
//! - **before** every frame header, and every other WAL write that is not the page of the
//!   header checked just before it (the WAL header at offset 0, a page rewritten in place after a
//!   spill, a header rewritten with its checksum), the files are checked: nothing lands once the
//!   replacement can be seen;
//! - **after** the write that makes a commit frame whole (the page after a header whose
//!   "database size" field is set, or such a header rewritten over a page written before it),
//!   they are checked again: a commit written while its files changed is failed to the
//!   application, never acknowledged.
//!
//! What is left between a check and the write it vouches for is the residual window
//! (docs/architecture.md, "A commit checked at its frames").
//!
//! Only the connection's own calls use it, and SQLite serialises them: relaxed atomics, for the
//! `Sync` the state needs, not for ordering.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

/// A WAL frame header's size (`WAL_FRAME_HDRSIZE`).
pub(crate) const FRAME_HEADER: i32 = 24;

/// Where the current write transaction is in its frames.
#[derive(Debug)]
pub(crate) struct Frames {
    /// The offset of the page whose header was checked just now (-1: none).
    page_at: AtomicI64,
    /// That header marks a commit frame.
    commit: AtomicBool,
    /// The end of the furthest write of this transaction: a header below it is a rewrite.
    furthest: AtomicI64,
}

/// What a write needs, told before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Check the files before the write.
    pub(crate) check_before: bool,
    /// Check them again after it: it makes a commit frame whole.
    pub(crate) check_after: bool,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            page_at: AtomicI64::new(-1),
            commit: AtomicBool::new(false),
            furthest: AtomicI64::new(0),
        }
    }
}

impl Frames {
    /// A write transaction begins (the WAL write lock is taken): nothing written yet.
    pub(crate) fn begin(&self) {
        self.page_at.store(-1, Relaxed);
        self.commit.store(false, Relaxed);
        self.furthest.store(0, Relaxed);
    }

    /// The plan for a WAL write of `buf` at `offset`.
    pub(crate) fn plan(&self, buf: &[u8], offset: i64) -> Plan {
        let end = offset.saturating_add(buf.len() as i64);
        let furthest = self.furthest.fetch_max(end, Relaxed);
        let page_at = self.page_at.swap(-1, Relaxed);
        if offset == page_at && offset > 0 {
            // The page of the header checked just before it.
            return Plan {
                check_before: false,
                check_after: self.commit.swap(false, Relaxed),
            };
        }
        self.commit.store(false, Relaxed);
        if buf.len() == FRAME_HEADER as usize && offset > 0 {
            let commit = buf[4..8] != [0, 0, 0, 0];
            // A header below the furthest write is rewritten over its page (SQLite's checksum
            // rewrite after a spill): a commit frame is whole once its header lands.
            let rewrite = end < furthest;
            self.page_at.store(end, Relaxed);
            self.commit.store(commit && !rewrite, Relaxed);
            return Plan {
                check_before: true,
                check_after: commit && rewrite,
            };
        }
        Plan {
            check_before: true,
            check_after: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;
    const FRAME: i64 = FRAME_HEADER as i64 + PAGE as i64;

    fn header(commit: bool) -> Vec<u8> {
        let mut h = vec![0u8; 24];
        h[3] = 2;
        if commit {
            h[7] = 9;
        }
        h
    }

    fn plan(f: &Frames, buf: &[u8], offset: i64) -> (bool, bool) {
        let p = f.plan(buf, offset);
        (p.check_before, p.check_after)
    }

    #[test]
    fn a_one_frame_commit_is_checked_before_its_header_and_after_its_page() {
        let f = Frames::default();
        f.begin();
        let at = 32 + 3 * FRAME;
        assert_eq!(plan(&f, &header(true), at), (true, false));
        assert_eq!(plan(&f, &[0; PAGE], at + 24), (false, true));
    }

    #[test]
    fn every_frame_header_is_checked_and_only_the_commit_frame_after() {
        let f = Frames::default();
        f.begin();
        assert_eq!(plan(&f, &[0; 32], 0), (true, false), "the WAL header");
        assert_eq!(plan(&f, &header(false), 32), (true, false));
        assert_eq!(plan(&f, &[0; PAGE], 56), (false, false));
        assert_eq!(plan(&f, &header(true), 32 + FRAME), (true, false));
        assert_eq!(plan(&f, &[0; PAGE], 56 + FRAME), (false, true));
    }

    #[test]
    fn a_page_rewritten_in_place_is_checked_before_it() {
        let f = Frames::default();
        f.begin();
        plan(&f, &header(false), 32);
        plan(&f, &[0; PAGE], 56);
        plan(&f, &header(false), 32 + FRAME);
        plan(&f, &[0; PAGE], 56 + FRAME);
        assert_eq!(plan(&f, &[1; PAGE], 56), (true, false));
    }

    #[test]
    fn a_commit_header_rewritten_over_its_page_is_checked_after_it() {
        let f = Frames::default();
        f.begin();
        plan(&f, &header(false), 32);
        plan(&f, &[0; PAGE], 56);
        plan(&f, &header(true), 32 + FRAME);
        assert_eq!(plan(&f, &[0; PAGE], 56 + FRAME), (false, true));
        // The checksum rewrite: every header from the first page rewritten, the commit's last.
        assert_eq!(plan(&f, &header(false), 32), (true, false));
        assert_eq!(plan(&f, &header(true), 32 + FRAME), (true, true));
    }

    #[test]
    fn a_page_not_at_its_headers_offset_is_checked_before_it() {
        let f = Frames::default();
        f.begin();
        plan(&f, &header(true), 32);
        assert_eq!(plan(&f, &[0; PAGE], 32 + 4096), (true, false));
    }

    #[test]
    fn a_new_transaction_forgets_the_last_ones_frames() {
        let f = Frames::default();
        f.begin();
        plan(&f, &header(false), 32 + 5 * FRAME);
        plan(&f, &[0; PAGE], 56 + 5 * FRAME);
        // Rolled back; the next transaction writes from the same place, a commit not a rewrite.
        f.begin();
        assert_eq!(plan(&f, &header(true), 32), (true, false));
        assert_eq!(plan(&f, &[0; PAGE], 56), (false, true));
    }
}
