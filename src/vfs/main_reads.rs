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
//!
//! This file is also the one place a connection's mapped wal-index header is read
//! ([`Region0`], [`MappedHeader`]): the settled header here, the salts, `mxFrame`, `iChange` and
//! the page size for the WAL-base record (`stale_wal/`).

use std::ffi::c_int;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

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

/// Region 0 of one connection's wal-index mapping while it is mapped, else NULL: set by the
/// connection's `xShmMap` with the address SQLite's wrapped VFS mapped, and cleared before its
/// `xShmUnmap`, which SQLite never runs concurrently with this connection's other calls. The
/// header is read only through it ([`Region0::header`]), so region 0 stays mapped while read.
#[derive(Default)]
pub(crate) struct Region0(AtomicPtr<u8>);

impl Region0 {
    /// Region 0 was just mapped at `addr` (4-byte aligned, the start of a page). Only the
    /// shim's `xShmMap` calls this, with the address it just returned: a safe function on that
    /// promise (docs/decisions.md, "The house, counted").
    pub(crate) fn mapped(&self, addr: *const u8) {
        self.0.store(addr as *mut u8, Ordering::Release);
    }

    /// Region 0 is about to be unmapped.
    pub(crate) fn unmapping(&self) {
        self.0.store(std::ptr::null_mut(), Ordering::Release);
    }

    pub(crate) fn is_mapped(&self) -> bool {
        !self.0.load(Ordering::Acquire).is_null()
    }

    /// The mapped header, `None` while nothing is mapped. Valid while the borrow lasts: the
    /// connection's call that reads it (an `xRead`, an `xShmLock`, an `xWrite`) runs before its
    /// `xShmUnmap` can.
    #[inline]
    pub(crate) fn header(&self) -> Option<MappedHeader<'_>> {
        let p = NonNull::new(self.0.load(Ordering::Acquire))?;
        Some(MappedHeader {
            p,
            _region: PhantomData,
        })
    }
}

/// Region 0 of a connection's wal-index mapping, held by the connection's pin of its `-shm` (the
/// state's wal-index view) from the `xShmMap` that returned it until the state drops the view,
/// under its mutex, before the connection unmaps: the same promise as [`Region0`]'s.
pub(crate) struct MappedIndex(NonNull<u8>);

// SAFETY: the address is only read, through atomics, while the mapping is alive (see the type).
unsafe impl Send for MappedIndex {}

impl MappedIndex {
    /// Region 0 as the connection's `xShmMap` just returned it (page-aligned); `None` for NULL.
    /// Only the shim's `xShmMap` calls this: a safe function on that promise, as
    /// [`Region0::mapped`].
    pub(crate) fn new(addr: *const u8) -> Option<MappedIndex> {
        NonNull::new(addr as *mut u8).map(MappedIndex)
    }

    /// The header, read while the view lives.
    #[inline]
    pub(crate) fn header(&self) -> MappedHeader<'_> {
        MappedHeader {
            p: self.0,
            _region: PhantomData,
        }
    }
}

/// The wal-index header in region 0 of a live mapping (from [`Region0::header`]): its words read
/// atomically (other processes write them concurrently).
#[derive(Clone, Copy)]
pub(crate) struct MappedHeader<'a> {
    p: NonNull<u8>,
    _region: PhantomData<&'a Region0>,
}

impl MappedHeader<'_> {
    /// The word at `offset` (a multiple of 4 at most 128, inside the first page).
    #[inline]
    fn load_u32(self, offset: usize) -> u32 {
        // SAFETY: `p` is region 0 of a live mapping (see `Region0`: mapped while the borrow this
        // header came from lasts), page-aligned; `offset` is a multiple of 4 inside the header.
        unsafe { (*(self.p.as_ptr().add(offset) as *const AtomicU32)).load(Ordering::Acquire) }
    }

    /// `aSalt` of the first header copy (offsets 32 and 36), both words.
    pub(crate) fn salts_word(self) -> u64 {
        let (a, b) = (self.load_u32(32), self.load_u32(36));
        u64::from(a) | (u64::from(b) << 32)
    }

    /// `mxFrame` (offset 16).
    pub(crate) fn max_frame(self) -> u32 {
        self.load_u32(16)
    }

    /// `isInit` (byte 12): the header is initialised.
    pub(crate) fn is_init(self) -> bool {
        self.load_u32(12).to_ne_bytes()[0] != 0
    }

    /// The checkpoint progress: `mxFrame` (16), `nBackfill` (96), `nBackfillAttempted` (128).
    pub(crate) fn backfill(self) -> (u32, u32, u32) {
        (self.load_u32(16), self.load_u32(96), self.load_u32(128))
    }

    /// `aSalt` of the first header copy (offsets 32 and 36) as the WAL header gives them: the
    /// WAL header's big-endian bytes are copied as they are.
    pub(crate) fn salts(self) -> [u32; 2] {
        let be = |w: u32| u32::from_be_bytes(w.to_ne_bytes());
        [be(self.load_u32(32)), be(self.load_u32(36))]
    }

    /// `iChange` (offset 8).
    pub(crate) fn change(self) -> u32 {
        self.load_u32(8)
    }

    /// The page size, `None` while the header is not initialised.
    pub(crate) fn page_size(self) -> Option<u32> {
        let w3 = self.load_u32(12).to_ne_bytes();
        let (is_init, sz) = (w3[0], u16::from_ne_bytes([w3[2], w3[3]]));
        (is_init != 0).then_some(crate::walfile::page_size_field(sz))
    }

    /// The header when it is settled and consistent (its two copies equal, initialised, every
    /// frame it counts checkpointed), else `None`.
    pub(crate) fn settled(self) -> Option<Header> {
        let mut h = [0u32; 24];
        for (i, w) in h.iter_mut().enumerate() {
            *w = self.load_u32(4 * i);
        }
        // `nBackfill`, offset 96.
        let backfilled = self.load_u32(96);
        let is_init = h[3].to_ne_bytes()[0] != 0;
        (h[..12] == h[12..] && is_init && h[4] == backfilled).then_some(h)
    }
}

impl MainReads {
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
