//! A main file copied over in place (`cp backup.db
//! state.db`, the same inode) while the WAL holds nothing left to checkpoint, under a connection
//! whose page cache holds the old file's pages.
//!
//! SQLite keeps a connection's page cache for as long as the wal-index header it read at the
//! start of its last read transaction is unchanged; every commit and every WAL reset changes it.
//! While a header is *settled* — every frame it counts copied into the main file (`nBackfill` ==
//! `mxFrame`, `0` for an empty WAL) — no checkpoint has anything to write, so nothing SQLite does
//! writes the main file until the header changes. A page a connection read from the main file
//! under a settled header is therefore still what the file holds as long as that header is the
//! wal-index's, unless something outside SQLite wrote the file. The guard keeps, per connection,
//! the header and the hashes of the recorded fragments (`stale_wal::fragment_len`) of the first
//! 16 pages it read from the main file under it; at its next write lock under the same header
//! (and at a WAL reset inside that transaction) it reads those fragments again: one that differs
//! means the file was overwritten under the connection's cache, and the connection is retired
//! (`main-overwritten`) before its first frame, which would have been made from that cache.
//!
//! Cost: nothing for a read beyond the first 16 pages (a compare); for a read of one of them
//! under a mapped wal-index, two reads of the header and a hash of at most 112 bytes. A write
//! lock with fragments kept reads them again (one `pread` each), until the header changes (the
//! connection's first commit). A connection that never reads the first pages from the main
//! file (a writer whose cache holds them, W1) pays nothing.
//!
//! Not seen: a copy that differs from the old file only beyond the recorded fragments, pages
//! read through memory-mapped I/O (`mmap_size` > 0 reads without `xRead`), and a stock
//! connection's cache.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::capture::ImageSource;
use crate::wal_base::{fragment_len, hex16, page_hash, RECORDED_PAGES};

/// The wal-index header as the guard compares it: both copies of `WalIndexHdr` (12 words each).
pub(crate) type Header = [u32; 24];

const PAGES: usize = RECORDED_PAGES as usize;

/// One connection's pages read from the main file under one settled wal-index header.
#[derive(Default)]
pub(crate) struct MainReads {
    kept: Mutex<Kept>,
}

#[derive(Default, Clone, Copy)]
struct Kept {
    header: Option<Header>,
    /// The header's page size, or (a WAL with no frame yet) page 1's; 0 until known.
    page_size: u32,
    pages: [(u32, u64); PAGES],
    n: usize,
    /// A page read twice under the header with two contents: (page, first, second).
    changed: Option<(u32, u64, u64)>,
}

impl MainReads {
    /// The header of the wal-index mapped at `p` (region 0) when it is settled and consistent
    /// (its two copies equal, initialised, every frame it counts checkpointed), else `None`.
    ///
    /// # Safety
    /// `p` is region 0 of a live wal-index mapping.
    pub(crate) unsafe fn settled_header(p: *const u8) -> Option<Header> {
        let mut h = [0u32; 24];
        for (i, w) in h.iter_mut().enumerate() {
            // SAFETY: as the caller promises: offsets 0..96 of the mapped header, aligned.
            *w = unsafe { load_u32(p, 4 * i) };
        }
        // SAFETY: as above: `nBackfill`, offset 96.
        let backfilled = unsafe { load_u32(p, 96) };
        let is_init = h[3].to_ne_bytes()[0] != 0;
        (h[..12] == h[12..] && is_init && h[4] == backfilled).then_some(h)
    }

    /// A read of `buf` (`amt` bytes at `ofst`) from the main file succeeded, under `header`
    /// both before and after it: kept when it is one whole page among the first 16 (whether it
    /// was).
    pub(crate) fn read(&self, header: &Header, buf: &[u8], amt: c_int, ofst: i64) -> bool {
        let Ok(size) = u32::try_from(amt) else {
            return false;
        };
        if !(512..=65536).contains(&size) || ofst < 0 || ofst % i64::from(size) != 0 {
            return false;
        }
        let Some(page) = u32::try_from(ofst / i64::from(size) + 1)
            .ok()
            .filter(|&p| p <= RECORDED_PAGES)
        else {
            return false;
        };
        let mut kept = self.kept.lock();
        if kept.header.as_ref() != Some(header) {
            *kept = Kept {
                header: Some(*header),
                page_size: page_size(header),
                ..Kept::default()
            };
        }
        if kept.page_size == 0 && page == 1 {
            // The header of a WAL with no frame yet has no page size: page 1's own header says.
            kept.page_size = main_header_page_size(buf);
        }
        if size != kept.page_size {
            return false;
        }
        let Some(fragment) = buf.get(..fragment_len(page, size)) else {
            return false;
        };
        let hash = page_hash(fragment);
        let n = kept.n;
        match kept.pages[..n].iter().position(|&(p, _)| p == page) {
            Some(i) if kept.pages[i].1 != hash => {
                let first = kept.pages[i].1;
                kept.changed.get_or_insert((page, first, hash));
            }
            Some(_) => {}
            None if n < PAGES => {
                kept.pages[n] = (page, hash);
                kept.n += 1;
            }
            None => {}
        }
        true
    }

    /// Whether pages are kept (the next write lock is to judge them).
    pub(crate) fn any(&self) -> bool {
        let kept = self.kept.lock();
        kept.n > 0 || kept.changed.is_some()
    }

    /// Forgets every kept page (the mapping goes).
    pub(crate) fn clear(&self) {
        *self.kept.lock() = Kept::default();
    }

    /// The kept pages judged against `main` now, under `header` (the wal-index's now, or the
    /// one a WAL reset just replaced): forgotten when they were read under another header; why
    /// the file is not what they were read from, if it is not.
    pub(crate) fn judge(&self, header: Option<&Header>, main: &dyn ImageSource) -> Option<String> {
        let kept = *self.kept.lock();
        if kept.header.is_none() || kept.header.as_ref() != header {
            if kept.header.is_some() {
                self.clear();
            }
            return None;
        }
        if let Some((page, first, second)) = kept.changed {
            return Some(format!(
                "page {page} was read from it twice while the WAL held nothing left to \
                 checkpoint, its header hashing {} then {}",
                hex16(first),
                hex16(second)
            ));
        }
        let page_size = kept.page_size;
        for &(page, was) in &kept.pages[..kept.n] {
            let mut frag = [0u8; 112];
            let frag = frag.get_mut(..fragment_len(page, page_size))?;
            let at = u64::from(page - 1) * u64::from(page_size);
            let now = main.read_at(frag, at).ok().map(|()| page_hash(frag));
            if now != Some(was) {
                return Some(format!(
                    "page {page}'s header hashes {} where this connection's page cache, read from \
                     it while the WAL held nothing left to checkpoint, has {}: the next frames \
                     would be written from that cache",
                    now.map_or("(beyond the end of the file)".into(), hex16),
                    hex16(was)
                ));
            }
        }
        None
    }
}

/// `szPage` of a header.
fn page_size(header: &Header) -> u32 {
    let b = header[3].to_ne_bytes();
    crate::walfile::page_size_field(u16::from_ne_bytes([b[2], b[3]]))
}

/// The page size the database header at the start of `page1` gives, 0 when it is not one.
fn main_header_page_size(page1: &[u8]) -> u32 {
    crate::walfile::main_header_page_size(page1).unwrap_or(0)
}

/// # Safety
/// `p` is region 0 of a live wal-index mapping.
unsafe fn load_u32(p: *const u8, offset: usize) -> u32 {
    // SAFETY: as the caller promises; `offset` is a multiple of 4 inside the first page, which
    // other processes write concurrently (hence the atomic load).
    unsafe { (*(p.add(offset) as *const AtomicU32)).load(Ordering::Acquire) }
}
