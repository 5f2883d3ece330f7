//! A main file overwritten in place under a running connection (`cp backup.db
//! state.db`: the same inode, so the pins see nothing) is found before a checkpoint writes this
//! generation's pages into it, and at the close.
//!
//! In WAL mode only checkpoints write the main file, and a checkpoint writes, for each page, the
//! last version of it among the frames it copies. So between two checkpoints each page of the
//! main file is either what it was when the WAL generation began — the WAL-base record the guard
//! keeps on the WAL (a hash of the first 16 pages' headers) — or one of the
//! generation's frames of that page, among those a checkpoint copied or began to copy
//! (`nBackfillAttempted` in the wal-index). A recorded page that is neither was written by
//! something else: the file was overwritten. The connection is then retired (reason
//! `main-overwritten`): the checkpoint is refused, its writes too, and the generation captured.
//!
//! Cost: nothing per transaction. Per checkpoint (and per close), the record (`fgetxattr`), the
//! WAL header and the recorded pages of the main file in one read; only when a page is not as
//! recorded (a checkpoint of this generation already copied frames) are the frame headers read,
//! up to the frames copied. What cannot be seen: an overwrite with a copy whose first pages are
//! the ones the generation's checkpoints left (a copy taken since the last checkpoint, or one
//! that differs only beyond the recorded pages), and any overwrite while no guarded connection
//! of the database checkpoints or closes.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::{ConnectionState, Inner};
use crate::capture::ImageSource;
use crate::status::RetireReason;
use crate::wal_base::{
    fragment_len, hex16, page_hash, recorded_span, ENCODED_MAX, RECORDED_PAGES, RECORD_XATTR,
};
use crate::walfile::{parse_wal_header, WalHeader, WAL_FRAME_HEADER_SIZE, WAL_HEADER_SIZE};

/// The recorded pages' read: one buffer per process (allocated at the first judgement), kept off
/// the heap's top (the C allocator serves this size from its own mapping: a checkpoint never
/// moves the program break).
static BUF: Mutex<Vec<u8>> = Mutex::new(Vec::new());
const BUF_LEN: usize = 256 << 10;

impl ConnectionState {
    /// A checkpoint took its lock since the last judgement: judge before its first main-file
    /// write (cleared). Panic-free: one atomic load, a swap when set.
    #[inline]
    pub(crate) fn main_judge_due(&self) -> bool {
        self.checks.take_main_judge_due()
    }

    /// EXCLUSIVE on the main file in WAL mode: the close-time checkpoint (or
    /// `locking_mode=EXCLUSIVE`) may write the main file without taking the checkpoint lock
    /// (SQLite skips the `-shm` locks in its exclusive mode), and its `SQLITE_FCNTL_HAS_MOVED`
    /// came before this lock, so an overwrite in between would go unseen: the next main-file
    /// write judges first.
    pub(crate) fn main_writes_may_follow(&self) {
        self.checks.main_judge_due.store(true, Ordering::Relaxed);
    }

    /// Judges the main file (`main`: this connection's own file object of it) against the WAL
    /// generation it is about to be checkpointed with; retires the generation (reason
    /// [`RetireReason::MainOverwritten`]) when something else wrote it.
    pub(crate) fn judge_main(&self, main: &dyn ImageSource) {
        let mut inner = self.inner.lock();
        if inner.loss.reason.is_some() {
            return;
        }
        let Some(detail) = overwritten(&inner, main) else {
            return;
        };
        log::error!(
            "hermes-guard: {} was overwritten in place under this connection ({detail}): no \
             checkpoint of this connection's WAL generation will write into it",
            self.paths.db.display()
        );
        self.retire_locked(&mut inner, RetireReason::MainOverwritten);
    }

    /// The main file is no longer what this connection's page cache read from it
    /// (`vfs/main_reads.rs`, `detail` says how): retired (reason
    /// [`RetireReason::MainOverwritten`]) before a frame made from that cache is written.
    pub(crate) fn overwritten_under_cache(&self, detail: &str) {
        let mut inner = self.inner.lock();
        if inner.loss.reason.is_some() {
            return;
        }
        log::error!(
            "hermes-guard: {} was overwritten in place under this connection ({detail}): none \
             of this connection's writes will land on it",
            self.paths.db.display()
        );
        self.retire_locked(&mut inner, RetireReason::MainOverwritten);
    }
}

/// The WAL-base record as its attribute holds it (`stale_wal::encode_record`'s layout), read
/// without allocating: the quick path of every checkpoint formats nothing.
struct Record {
    salts: [u32; 2],
    page_size: u32,
    pages: [(u32, u64); RECORDED_PAGES as usize],
    count: usize,
    /// The greatest of the recorded page numbers (0 when there are none), found as they are
    /// decoded.
    last: u32,
}

impl Record {
    fn read(wal: &File) -> Option<Record> {
        let mut raw = [0u8; ENCODED_MAX];
        let n = rustix::fs::fgetxattr(wal.as_fd(), RECORD_XATTR, &mut raw).ok()?;
        let rest = raw.get(..n)?.strip_prefix(b"hgwb\x01")?;
        let u32_at = |o: usize| Some(u32::from_le_bytes(rest.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(rest.get(o..o + 8)?.try_into().ok()?));
        let count = usize::from(*rest.get(28)?);
        if count > RECORDED_PAGES as usize || rest.len() != 29 + 12 * count {
            return None;
        }
        let mut pages = [(0u32, 0u64); RECORDED_PAGES as usize];
        let mut last = 0;
        for (i, slot) in pages.iter_mut().enumerate().take(count) {
            *slot = (u32_at(29 + 12 * i)?, u64_at(33 + 12 * i)?);
            last = last.max(slot.0);
        }
        Some(Record {
            salts: [u32_at(0)?, u32_at(4)?],
            page_size: u32_at(8)?,
            pages,
            count,
            last,
        })
    }

    fn pages(&self) -> &[(u32, u64)] {
        &self.pages[..self.count]
    }
}

/// Why the main file is not one this generation's checkpoints left, if it is not.
fn overwritten(inner: &Inner, main: &dyn ImageSource) -> Option<String> {
    let wal = inner.pins.wal.as_ref()?.file();
    let record = Record::read(wal)?;
    let mut head = [0u8; WAL_HEADER_SIZE];
    wal.read_exact_at(&mut head, 0).ok()?;
    let header = parse_wal_header(&head);
    // A record of another generation (the WAL restarted, its record not written yet) judges
    // nothing.
    if !header.valid || header.salts != record.salts || header.page_size != record.page_size {
        return None;
    }
    let page_size = record.page_size;
    if record.count == 0 {
        return None;
    }
    let last = record.last;
    // (page, its hash now — `None` beyond the end of the file —, its recorded hash); allocated
    // only when a page differs (not at a checkpoint that finds the file as recorded).
    let mut differs: Vec<(u32, Option<u64>, u64)> = Vec::new();
    {
        let mut buf = BUF.lock();
        let span = recorded_span(last, page_size);
        if buf.len() < span {
            *buf = vec![0u8; span.max(BUF_LEN)];
        }
        // Two loops rather than a test in one: the common one keeps the buffer in registers.
        if main.read_at(&mut buf[..span], 0).is_ok() {
            let whole: &[u8] = &buf;
            for &(page, recorded) in record.pages() {
                let at = u64::from(page - 1) * u64::from(page_size);
                let len = fragment_len(page, page_size);
                let now = whole.get(at as usize..at as usize + len).map(page_hash);
                if now != Some(recorded) {
                    differs.push((page, now, recorded));
                }
            }
        } else {
            // A shorter file: page by page, `None` beyond its end.
            for &(page, recorded) in record.pages() {
                let at = u64::from(page - 1) * u64::from(page_size);
                let len = fragment_len(page, page_size);
                let mut frag = [0u8; 128];
                let frag = frag.get_mut(..len)?;
                let now = main.read_at(frag, at).ok().map(|()| page_hash(frag));
                if now != Some(recorded) {
                    differs.push((page, now, recorded));
                }
            }
        }
    }
    if differs.is_empty() {
        return None;
    }
    // Not as recorded: fine if one of the frames a checkpoint copied (or began to) put it there.
    // The progress is read from the wal-index, the salts after it: a reset in between (another
    // connection's, which no lock of this judgement excludes) zeroes the progress after writing new
    // salts, and the WAL file's header, read above, keeps the old generation's salts until the new
    // one's first frame. Progress of another generation than the header read is no measure of what
    // was copied: no judgement (the next one decides).
    let index = inner.wal_index.as_ref()?;
    let copied = index
        .backfill()
        .map_or(0, |b| b.backfilled.max(b.attempted));
    if index.salts()? != header.salts && !unconfirmed() {
        return None;
    }
    let pages: Vec<u32> = differs.iter().map(|d| d.0).collect();
    let frames = copied_frames(wal, &header, copied, &pages)?;
    for &(page, now, recorded) in &differs {
        let consistent = match now {
            Some(h) => frames.of.get(&page).is_some_and(|v| v.contains(&h)),
            // Beyond the end: a checkpoint truncated the file to a committed size.
            None => frames.min_commit_size.is_some_and(|m| m < page),
        };
        if !consistent {
            // The frames were read from the WAL file: still that generation's (a reset since
            // would have written new salts into the wal-index before its first frame)?
            if index.salts()? != header.salts && !unconfirmed() {
                return None;
            }
            return Some(format!(
                "page {page}'s header hashes {} where WAL generation {:08x} {:08x} began on {} \
                 and none of the {copied} frame(s) its checkpoints copied has it",
                now.map_or("(beyond the end of the file)".into(), hex16),
                header.salts[0],
                header.salts[1],
                hex16(recorded)
            ));
        }
    }
    None
}

/// The explorer's fault switch `judgement-unconfirmed` (the judgement as it was before the
/// wal-index confirmed it: no `READ(0)` at the close, no compare of the wal-index's salts with the
/// WAL header's); always `false` without the `explore-faults` feature.
pub(crate) fn unconfirmed() -> bool {
    crate::testing::seam::judgement_unconfirmed()
}

/// The frames a checkpoint copied or began to copy: the hashes of those of `pages`, and the
/// smallest database size a commit among them records.
struct Copied {
    of: HashMap<u32, Vec<u64>>,
    min_commit_size: Option<u32>,
}

/// Reads the first `copied` frames' headers (and the fragments of `pages`), stopping at a frame
/// of another generation. `None` when the WAL cannot be read.
fn copied_frames(wal: &File, header: &WalHeader, copied: u32, pages: &[u32]) -> Option<Copied> {
    let page_size = u64::from(header.page_size);
    let frame_len = WAL_FRAME_HEADER_SIZE as u64 + page_size;
    let mut out = Copied {
        of: HashMap::new(),
        min_commit_size: None,
    };
    let mut fh = [0u8; WAL_FRAME_HEADER_SIZE];
    let mut frag = [0u8; 128];
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    for i in 0..u64::from(copied) {
        let at = WAL_HEADER_SIZE as u64 + i * frame_len;
        wal.read_exact_at(&mut fh, at).ok()?;
        if [be(&fh[8..12]), be(&fh[12..16])] != header.salts {
            break;
        }
        let (pgno, commit) = (be(&fh[0..4]), be(&fh[4..8]));
        if commit != 0 {
            out.min_commit_size = Some(out.min_commit_size.map_or(commit, |m| m.min(commit)));
        }
        if pages.contains(&pgno) {
            let frag = frag.get_mut(..fragment_len(pgno, header.page_size))?;
            wal.read_exact_at(frag, at + WAL_FRAME_HEADER_SIZE as u64)
                .ok()?;
            out.of.entry(pgno).or_default().push(page_hash(frag));
        }
    }
    Some(out)
}
