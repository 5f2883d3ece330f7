//! The frame rule: every WAL write of a write transaction is checked before its first byte,
//! and the write that makes a commit frame whole is checked again after its last.
//!
//! SQLite writes a WAL frame as two writes: its 24-byte header, then its page at the header's
//! offset + 24 (`walWriteOneFrame`). A newer generation that shares the WAL file (the `-shm`
//! replaced, the `-wal` left at the path) cannot see this connection's locks, so it may write
//! its own frames at the offsets this one is writing, or truncate the file, at any moment after
//! the replacement, between a frame's header and its page too. So:
//!
//! - **before** every WAL write (the WAL header, each frame header, each page, a page rewritten
//!   in place after a spill, a header rewritten with its checksum) the files are checked:
//!   nothing lands once the replacement can be seen;
//! - **after** the write that makes a commit frame whole (the page after a header whose
//!   "database size" field is set, or such a header rewritten over a page written before it),
//!   they are checked again: a commit written while its files changed is failed to the
//!   application, never acknowledged.
//!
//! A new frame's header is *held* rather than written when the WAL's device promises powersafe
//! overwrite (SQLite's default): SQLite then writes the frame's page next, always
//! (`walWriteOneFrame`; without that promise it may sync between the two, to pad a commit to a
//! sector), and the guard writes header and page as one write, checked once, at the page. So a
//! frame costs one check and one write, as SQLite's two writes cost two, and there is no moment
//! at which the header is down and the page not.
//!
//! This file tells which write to hold, which held header goes down with which write, and which
//! write completes a commit; `vfs/file/hot.rs` runs the checks and the writes. What is left
//! between a check and the write it vouches for is the residual window (docs/architecture.md,
//! "A commit checked at its frames").
//!
//! Only the connection's own calls use it, and SQLite serialises them: relaxed atomics, for the
//! `Sync` the state needs, not for ordering.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering::Relaxed};

/// A WAL frame header's size (`WAL_FRAME_HDRSIZE`).
pub(crate) const FRAME_HEADER: i32 = 24;

/// Where the current write transaction is in its frames.
#[derive(Debug)]
pub(crate) struct Frames {
    /// The offset of the page whose header was written just now (-1: none).
    page_at: AtomicI64,
    /// That header's page number.
    page_no: AtomicU32,
    /// The freelist trunk page whose frame will list the pages this transaction freed, once
    /// page 1's frame showed the freelist grew (0: none; `state/freed_pages.rs`).
    trunk_due: AtomicU32,
    /// That header marks a commit frame.
    commit: AtomicBool,
    /// The end of the furthest write of this transaction: a header below it is a rewrite.
    furthest: AtomicI64,
    /// The offset of this transaction's first write (-1: none yet): where its frames begin, or
    /// 0 when it restarted the WAL.
    first: AtomicI64,
    /// The offset of a new frame's header held until its page comes (-1: none), and its bytes.
    held_at: AtomicI64,
    held: [AtomicU64; 3],
}

/// What to do with a WAL write, told before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Next {
    /// Hold this write (a new frame's header): it goes down with its page.
    pub(crate) hold: bool,
    /// The offset of a header held before this write (-1: none), to go down first: with this
    /// write as one when this is its page (`offset` is the header's + 24), else on its own.
    /// Its bytes: [`Frames::held_header`].
    pub(crate) held_at: i64,
    /// This write makes a commit frame whole: the files are checked again after it.
    pub(crate) completes_commit: bool,
    /// This write is a new frame's header (not one rewritten over its page): the first frame
    /// of its page in the generation keeps the page's base (`state/base_pages.rs`).
    pub(crate) new_frame: bool,
    /// This write is the page of the frame whose header came just before it: its page number
    /// (0: it is not).
    pub(crate) page_of: u32,
}

impl Default for Frames {
    fn default() -> Self {
        Self {
            page_at: AtomicI64::new(-1),
            page_no: AtomicU32::new(0),
            trunk_due: AtomicU32::new(0),
            commit: AtomicBool::new(false),
            furthest: AtomicI64::new(0),
            first: AtomicI64::new(-1),
            held_at: AtomicI64::new(-1),
            held: Default::default(),
        }
    }
}

impl Frames {
    /// A write transaction begins (the WAL write lock is taken): nothing written yet.
    pub(crate) fn begin(&self) {
        self.page_at.store(-1, Relaxed);
        self.commit.store(false, Relaxed);
        self.furthest.store(0, Relaxed);
        self.first.store(-1, Relaxed);
        self.trunk_due.store(0, Relaxed);
        // A header still held here never had its page: the frame it began is no frame.
        self.held_at.store(-1, Relaxed);
    }

    /// What to do with a WAL write of `buf` at `offset`, about to be made; `powersafe`: the
    /// WAL's device promises powersafe overwrite (a new frame's header may be held). Plain
    /// loads and stores: SQLite serialises a connection's calls.
    #[inline]
    pub(crate) fn next(&self, buf: &[u8], offset: i64, powersafe: bool) -> Next {
        let end = offset.saturating_add(buf.len() as i64);
        let furthest = self.furthest.load(Relaxed);
        if end > furthest {
            self.furthest.store(end, Relaxed);
        }
        if furthest == 0 {
            self.first.store(offset, Relaxed);
        }
        let page_at = self.page_at.load(Relaxed);
        let held_at = self.held_at.load(Relaxed);
        if held_at >= 0 {
            self.held_at.store(-1, Relaxed);
        }
        if offset == page_at && offset > 0 {
            // The page of the header written (or held) just before it.
            self.page_at.store(-1, Relaxed);
            return Next {
                hold: false,
                held_at,
                completes_commit: self.commit.load(Relaxed),
                new_frame: false,
                page_of: self.page_no.load(Relaxed),
            };
        }
        let mut next = Next {
            hold: false,
            held_at,
            completes_commit: false,
            new_frame: false,
            page_of: 0,
        };
        if let (Ok(header), true) = (<&[u8; 24]>::try_from(buf), offset > 0) {
            let commit = header[4..8] != [0, 0, 0, 0];
            // A header below the furthest write is rewritten over its page (SQLite's checksum
            // rewrite after a spill): a commit frame is whole once its header lands. No page
            // follows it, so it is never held.
            let rewrite = end < furthest;
            self.page_at.store(end, Relaxed);
            self.page_no.store(
                u32::from_be_bytes([header[0], header[1], header[2], header[3]]),
                Relaxed,
            );
            self.commit.store(commit && !rewrite, Relaxed);
            next.completes_commit = commit && rewrite;
            next.new_frame = !rewrite;
            // Never over a header still held (its page never came: it goes down first, alone).
            if powersafe && !rewrite && held_at < 0 {
                for (word, i) in self.held.iter().zip([0, 8, 16]) {
                    let bytes = [
                        header[i],
                        header[i + 1],
                        header[i + 2],
                        header[i + 3],
                        header[i + 4],
                        header[i + 5],
                        header[i + 6],
                        header[i + 7],
                    ];
                    word.store(u64::from_ne_bytes(bytes), Relaxed);
                }
                self.held_at.store(offset, Relaxed);
                next.hold = true;
            }
        } else {
            self.page_at.store(-1, Relaxed);
        }
        next
    }

    /// The offset of this transaction's first write, if it wrote: everything it wrote is at or
    /// after it (SQLite appends a transaction's frames after the last commit it read, or
    /// restarts the WAL at its header).
    pub(crate) fn first_write(&self) -> Option<u64> {
        u64::try_from(self.first.load(Relaxed)).ok()
    }

    /// The freelist trunk page whose frame is due to list freed pages (0: none).
    #[inline]
    pub(crate) fn trunk_due(&self) -> u32 {
        self.trunk_due.load(Relaxed)
    }

    /// Expects the frame of freelist trunk `page` (0: none any more).
    pub(crate) fn expect_trunk(&self, page: u32) {
        self.trunk_due.store(page, Relaxed);
    }

    /// The bytes of the header [`Next::held_at`] named, as held.
    pub(crate) fn held_header(&self) -> [u8; FRAME_HEADER as usize] {
        let mut header = [0u8; FRAME_HEADER as usize];
        for (bytes, word) in header.chunks_exact_mut(8).zip(&self.held) {
            bytes.copy_from_slice(&word.load(Relaxed).to_ne_bytes());
        }
        header
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

    /// `next` without powersafe overwrite: nothing held; whether the write completes a commit.
    fn completes(f: &Frames, buf: &[u8], offset: i64) -> bool {
        let next = f.next(buf, offset, false);
        assert!(!next.hold && next.held_at < 0);
        next.completes_commit
    }

    #[test]
    fn a_one_frame_commit_is_whole_after_its_page() {
        let f = Frames::default();
        f.begin();
        let at = 32 + 3 * FRAME;
        assert!(!completes(&f, &header(true), at));
        assert!(completes(&f, &[0; PAGE], at + 24));
    }

    #[test]
    fn only_the_commit_frames_page_completes_a_commit() {
        let f = Frames::default();
        f.begin();
        assert!(!completes(&f, &[0; 32], 0), "the WAL header");
        assert!(!completes(&f, &header(false), 32));
        assert!(!completes(&f, &[0; PAGE], 56));
        assert!(!completes(&f, &header(true), 32 + FRAME));
        assert!(completes(&f, &[0; PAGE], 56 + FRAME));
    }

    #[test]
    fn the_first_write_is_where_the_transaction_begins_and_a_new_one_forgets_it() {
        let f = Frames::default();
        f.begin();
        assert_eq!(f.first_write(), None);
        completes(&f, &header(false), 32 + 2 * FRAME);
        completes(&f, &[0; PAGE], 56 + 2 * FRAME);
        completes(&f, &[1; PAGE], 56 + 2 * FRAME);
        assert_eq!(f.first_write(), Some(32 + 2 * FRAME as u64));
        f.begin();
        assert_eq!(f.first_write(), None);
        completes(&f, &[0; 32], 0);
        assert_eq!(
            f.first_write(),
            Some(0),
            "a restart writes the WAL header first"
        );
    }

    #[test]
    fn a_page_rewritten_in_place_completes_nothing() {
        let f = Frames::default();
        f.begin();
        completes(&f, &header(false), 32);
        completes(&f, &[0; PAGE], 56);
        completes(&f, &header(false), 32 + FRAME);
        completes(&f, &[0; PAGE], 56 + FRAME);
        assert!(!completes(&f, &[1; PAGE], 56));
    }

    #[test]
    fn a_commit_header_rewritten_over_its_page_completes_the_commit() {
        let f = Frames::default();
        f.begin();
        completes(&f, &header(false), 32);
        completes(&f, &[0; PAGE], 56);
        completes(&f, &header(true), 32 + FRAME);
        assert!(completes(&f, &[0; PAGE], 56 + FRAME));
        // The checksum rewrite: every header from the first page rewritten, the commit's last.
        assert!(!completes(&f, &header(false), 32));
        assert!(completes(&f, &header(true), 32 + FRAME));
    }

    #[test]
    fn a_page_not_at_its_headers_offset_completes_nothing() {
        let f = Frames::default();
        f.begin();
        completes(&f, &header(true), 32);
        assert!(!completes(&f, &[0; PAGE], 32 + 4096));
    }

    #[test]
    fn a_new_transaction_forgets_the_last_ones_frames() {
        let f = Frames::default();
        f.begin();
        completes(&f, &header(false), 32 + 5 * FRAME);
        completes(&f, &[0; PAGE], 56 + 5 * FRAME);
        // Rolled back; the next transaction writes from the same place, a commit not a rewrite.
        f.begin();
        assert!(!completes(&f, &header(true), 32));
        assert!(completes(&f, &[0; PAGE], 56));
    }

    #[test]
    fn with_powersafe_overwrite_a_new_header_is_held_and_goes_down_with_its_page() {
        let f = Frames::default();
        f.begin();
        let h = header(true);
        let next = f.next(&h, 32, true);
        assert!(next.hold && next.held_at < 0);
        let next = f.next(&[0; PAGE], 56, true);
        assert!(!next.hold);
        assert_eq!(next.held_at, 32);
        assert_eq!(f.held_header().to_vec(), h);
        assert!(next.completes_commit);
    }

    #[test]
    fn a_rewritten_header_is_never_held() {
        let f = Frames::default();
        f.begin();
        f.next(&header(false), 32, true);
        f.next(&[0; PAGE], 56, true);
        let next = f.next(&header(false), 32, true);
        assert!(!next.hold && next.held_at < 0);
    }

    #[test]
    fn a_held_header_whose_page_does_not_come_goes_down_before_the_next_write() {
        let f = Frames::default();
        f.begin();
        f.next(&header(false), 32, true);
        let next = f.next(&[0; 100], 32 + 4096, true);
        assert_eq!(next.held_at, 32);
        assert!(!next.hold);
    }

    #[test]
    fn a_header_after_a_held_one_whose_page_did_not_come_is_not_held_over_it() {
        let f = Frames::default();
        f.begin();
        let first = header(false);
        f.next(&first, 32, true);
        let next = f.next(&header(true), 32 + FRAME, true);
        assert_eq!(next.held_at, 32);
        assert!(!next.hold, "written after the held one, not held over it");
        assert_eq!(f.held_header().to_vec(), first);
    }

    #[test]
    fn a_header_held_when_the_transaction_ends_is_dropped() {
        let f = Frames::default();
        f.begin();
        f.next(&header(true), 32, true);
        f.begin();
        assert!(f.next(&[0; 32], 0, true).held_at < 0);
    }
}
