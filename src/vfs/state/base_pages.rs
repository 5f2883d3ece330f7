//! The base of every page a WAL generation writes: the page as the main file held it before the
//! generation's first frame of it, kept by this process for the generation's capture.
//!
//! A retired generation's WAL says what its pages became, not what they were. When a newer
//! generation has checkpointed into the main file, the file no longer says it either, and
//! recovery cannot tell the retired generation's own inserts, updates and deletes from the newer
//! generation's (docs/plans/recovery-from-changes.md). So at the first frame of each page that the
//! main file holds, the connection writing it reads that page from the main file (through the
//! wrapped main file, its own descriptor: one `pread`) and keeps it here, once per process and
//! generation, for the capture to write beside the WAL (`<file>-base`, docs/capture-format.md).
//!
//! The main file's copy of a page changes only when a checkpoint copies a frame of it there, and
//! SQLite's checkpoint copies a page only when its latest frame is at or below the point it
//! backfills to: a page with a later frame keeps its older copy, so the main file after a
//! partial checkpoint is not the generation at that point, page for page. So when a checkpoint
//! of this process writes a page into the main file, its kept base goes and the page counts as
//! unseen again: its next frame reads the main file's copy, the one a newer generation would
//! start from. A page never written again after that has its last frame at or below the
//! backfill, and recovery takes that frame (docs/plans/recovery-from-changes.md, "Step 7 as
//! built").

//! The read happens before the frame rule's check of the same write: when that check passes,
//! nothing at the path changed, so no newer generation had checkpointed into the file read. A
//! page beyond the main file's size when the store began is new in the generation (its base is
//! "absent") and is not read. Memory is capped ([`CAP_PAGES`], [`CAP_BYTES`]); past the cap a
//! page is counted, not kept, and said at WARN once per generation: recovery treats its rows as
//! undecided, never guessed.
//!
//! Not seen here: pages a stock peer of the generation, or another guarded process, wrote first
//! (that process keeps them, in its own capture), and pages the generation freed without writing
//! them (SQLite's "don't write" for a freelist leaf).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::ConnectionState;
use crate::capture::{BasePages, ImageSource};
use crate::identity::FileId;

/// Pages kept per generation per process, at most.
pub(crate) const CAP_PAGES: usize = 1024;
/// Bytes kept per generation per process, at most.
pub(crate) const CAP_BYTES: usize = 8 << 20;

/// Which generation a store is for: the pinned main file and WAL inodes, and the WAL's salts (a
/// restarted WAL is a new generation in the same file).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct StoreKey {
    main: Option<FileId>,
    wal: FileId,
}

/// One generation's store, while any connection of the process has it pinned.
#[derive(Default)]
pub(crate) struct BaseStore {
    state: Mutex<Option<Generation>>,
}

struct Generation {
    kept: BasePages,
    /// Pages whose first frame went by (kept, over the cap, or being read).
    seen: Vec<u64>,
    bytes: usize,
    /// The freelist's first trunk page in the main file when the store began (0: none).
    start_trunk: u32,
    /// The freelist's page count as last seen (page 1's, at the start and at each of its frames).
    free_count: u32,
    /// Pages past `pages_at_start` (new in the generation) that a checkpoint of this process
    /// copied into the main file since their last frame: their next frame reads that copy.
    copied: BTreeSet<u32>,
}

impl Generation {
    fn seen(&self, pgno: u32) -> bool {
        let i = pgno as usize;
        self.seen
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn mark(&mut self, pgno: u32) {
        let i = pgno as usize;
        if let Some(w) = self.seen.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    fn unmark(&mut self, pgno: u32) {
        let i = pgno as usize;
        if let Some(w) = self.seen.get_mut(i / 64) {
            *w &= !(1 << (i % 64));
        }
    }
}

static STORES: Mutex<Option<HashMap<StoreKey, Weak<BaseStore>>>> = Mutex::new(None);

/// What to do about a frame of `pgno`, told by [`BaseStore::first_frame`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Nothing: the page was seen in this generation, or is new in it.
    Nothing,
    /// Read the page from the main file, then [`BaseStore::keep`] it.
    Read,
    /// The store is for another generation (or none yet): [`BaseStore::begin`] first.
    Begin,
}

impl BaseStore {
    /// The process's store for the generation of `main` and `wal`, made if none is alive.
    pub(crate) fn join(main: Option<FileId>, wal: FileId) -> Arc<BaseStore> {
        let key = StoreKey { main, wal };
        let mut map = STORES.lock();
        let map = map.get_or_insert_with(HashMap::new);
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        map.retain(|_, slot| slot.strong_count() > 0);
        let store = Arc::new(BaseStore::default());
        map.insert(key, Arc::downgrade(&store));
        store
    }

    /// A new frame of `pgno` in the generation of `salts`: whether its base is to be read now.
    /// A page to read is marked seen at once, so it is read once.
    pub(crate) fn first_frame(&self, pgno: u32, salts: [u32; 2]) -> Keep {
        let mut state = self.state.lock();
        let Some(generation) = state.as_mut().filter(|g| g.kept.salts == salts) else {
            return Keep::Begin;
        };
        if pgno > generation.kept.pages_at_start {
            // New in the generation: its base is "absent" until a checkpoint copied it.
            return match generation.copied.remove(&pgno) {
                true => Keep::Read,
                false => Keep::Nothing,
            };
        }
        if pgno == 0 || generation.seen(pgno) {
            return Keep::Nothing;
        }
        generation.mark(pgno);
        Keep::Read
    }

    /// Begins the generation of `salts` from the main file `main` as it is now (its size and
    /// page size: two reads), unless a connection did already. Anything kept for another
    /// generation goes. `false` when the main file cannot be read (nothing is kept then).
    pub(crate) fn begin(&self, salts: [u32; 2], main: &dyn ImageSource) -> bool {
        if self
            .state
            .lock()
            .as_ref()
            .is_some_and(|g| g.kept.salts == salts)
        {
            return true;
        }
        let Ok(size) = main.size() else {
            return false;
        };
        // An empty main file has no header, and nothing in it to keep.
        let mut header = [0u8; 40];
        if size > 0 && main.read_at(&mut header, 0).is_err() {
            return false;
        }
        let page_size = match u16::from_be_bytes([header[16], header[17]]) {
            1 => 65_536,
            n => u32::from(n),
        };
        let pages_at_start = if page_size == 0 {
            0
        } else {
            u32::try_from(size / u64::from(page_size)).unwrap_or(u32::MAX)
        };
        let words = (pages_at_start as usize).div_ceil(64) + 1;
        *self.state.lock() = Some(Generation {
            kept: BasePages {
                salts,
                page_size,
                pages_at_start,
                pages: BTreeMap::new(),
                freed: BTreeSet::new(),
                over_cap: 0,
            },
            seen: vec![0; words],
            bytes: 0,
            copied: BTreeSet::new(),
            start_trunk: u32::from_be_bytes([header[32], header[33], header[34], header[35]]),
            free_count: u32::from_be_bytes([header[36], header[37], header[38], header[39]]),
        });
        true
    }

    /// Keeps `page`, the main file's page `pgno` read for the generation of `salts` (dropped if
    /// the store moved on to another generation meanwhile). Past the cap it is counted instead;
    /// `true` the first time that happens in the generation, to be said once.
    pub(crate) fn keep(&self, pgno: u32, salts: [u32; 2], page: Box<[u8]>) -> bool {
        self.keep_as(pgno, salts, false, page)
    }

    /// [`BaseStore::keep`] for a page the generation freed without writing it (its base is
    /// where the rows the generation deleted with it are).
    pub(crate) fn keep_freed(&self, pgno: u32, salts: [u32; 2], page: Box<[u8]>) -> bool {
        self.keep_as(pgno, salts, true, page)
    }

    /// Keeps `page`: at a frame of it, or freed.
    fn keep_as(&self, pgno: u32, salts: [u32; 2], freed: bool, page: Box<[u8]>) -> bool {
        let mut state = self.state.lock();
        let Some(generation) = state.as_mut().filter(|g| g.kept.salts == salts) else {
            return false;
        };
        if generation.kept.pages.len() >= CAP_PAGES || generation.bytes + page.len() > CAP_BYTES {
            generation.kept.over_cap += 1;
            return generation.kept.over_cap == 1;
        }
        generation.bytes += page.len();
        if let Some(old) = generation.kept.pages.insert(pgno, page) {
            generation.bytes -= old.len();
        }
        if freed {
            generation.kept.freed.insert(pgno);
        }
        false
    }

    /// A checkpoint of this process wrote page `pgno` into the main file: what the main file
    /// holds of it is no longer its kept base. The page's next frame reads the copy now there
    /// (the one a newer generation would start from); a page with no later frame has its last
    /// frame at or below the backfill, which recovery takes instead.
    pub(crate) fn checkpoint_wrote(&self, pgno: u32) {
        let mut state = self.state.lock();
        let Some(generation) = state.as_mut() else {
            return;
        };
        if let Some(page) = generation.kept.pages.remove(&pgno) {
            generation.bytes -= page.len();
        }
        generation.kept.freed.remove(&pgno);
        if pgno > generation.kept.pages_at_start {
            generation.copied.insert(pgno);
        } else {
            generation.unmark(pgno);
        }
    }

    /// Page 1's frame shows the freelist holding `count` pages: whether it grew since the last
    /// look (pages were freed: the first trunk's frame will list them). The page is written by a
    /// transaction of the generation the store holds (its frame headers began it).
    pub(crate) fn free_count_now(&self, count: u32) -> bool {
        let mut state = self.state.lock();
        let Some(generation) = state.as_mut() else {
            return false;
        };
        let grew = count > generation.free_count;
        generation.free_count = count;
        grew
    }

    /// The leaves the freelist trunk `trunk` listed when the generation began: its kept base's
    /// list when it was the first trunk then; none when it became a trunk in the generation;
    /// `None` when it was the first trunk but its base is not kept (what it listed is unknown).
    pub(crate) fn trunk_at_start(&self, trunk: u32) -> Option<Vec<u32>> {
        let state = self.state.lock();
        let generation = state.as_ref()?;
        if generation.start_trunk != trunk {
            return Some(Vec::new());
        }
        let page = generation.kept.pages.get(&trunk)?;
        Some(trunk_leaves(page))
    }

    /// Of `leaves`, freed by the generation, those whose base is to be read now: not seen in the
    /// generation (no frame of theirs, not read before) and held by the main file when the store
    /// began. Marked seen. With the generation's salts, to keep them under.
    pub(crate) fn freed_to_read(&self, leaves: &[u32]) -> (Option<[u32; 2]>, Vec<u32>) {
        let mut state = self.state.lock();
        let Some(generation) = state.as_mut() else {
            return (None, Vec::new());
        };
        let mut read = Vec::new();
        for &pgno in leaves {
            if pgno != 0 && pgno <= generation.kept.pages_at_start && !generation.seen(pgno) {
                generation.mark(pgno);
                read.push(pgno);
            }
        }
        (Some(generation.kept.salts), read)
    }

    /// A page of the generation the store holds whose base is not kept (see
    /// [`BaseStore::not_kept`]).
    pub(crate) fn not_kept_current(&self) {
        if let Some(g) = self.state.lock().as_mut() {
            g.kept.over_cap += 1;
        }
    }

    /// The page size of the generation the store holds, if any.
    pub(crate) fn current_page_size(&self) -> Option<u32> {
        self.state.lock().as_ref().map(|g| g.kept.page_size)
    }

    /// The page size of the generation of `salts`, once begun.
    pub(crate) fn page_size(&self, salts: [u32; 2]) -> Option<u32> {
        let state = self.state.lock();
        state
            .as_ref()
            .filter(|g| g.kept.salts == salts)
            .map(|g| g.kept.page_size)
    }

    /// A page whose read failed: counted as over the cap (its base is not held).
    pub(crate) fn not_kept(&self, salts: [u32; 2]) {
        if let Some(g) = self.state.lock().as_mut().filter(|g| g.kept.salts == salts) {
            g.kept.over_cap += 1;
        }
    }

    /// A copy of what is kept for the generation of `salts`, for its capture; `None` when the
    /// store holds another generation (or none).
    pub(crate) fn snapshot(&self, salts: [u32; 2]) -> Option<BasePages> {
        let state = self.state.lock();
        state
            .as_ref()
            .filter(|g| g.kept.salts == salts)
            .map(|g| g.kept.clone())
    }
}

impl ConnectionState {
    /// A new frame's header is about to be written (or held): at the generation's first frame of
    /// a page the main file holds, the page is read from the main file and kept. Before the
    /// frame rule's check of the same write, which vouches for what was read.
    pub(crate) fn new_frame(&self, header: &[u8; 24]) {
        let Some(store) = self.base.store() else {
            return;
        };
        let (pgno, salts) = frame_page(header);
        let mut keep = store.first_frame(pgno, salts);
        if keep == Keep::Begin {
            let reader = self.base.reader.lock();
            let Some(main) = reader.as_deref() else {
                return;
            };
            if !store.begin(salts, main) {
                return;
            }
            drop(reader);
            keep = store.first_frame(pgno, salts);
        }
        if keep != Keep::Read {
            return;
        }
        let Some(page_size) = store.page_size(salts) else {
            return;
        };
        let mut page = vec![0u8; page_size as usize].into_boxed_slice();
        let read = self
            .base
            .reader
            .lock()
            .as_deref()
            .map(|main| main.read_at(&mut page, u64::from(pgno - 1) * u64::from(page_size)));
        match read {
            Some(Ok(())) => {
                if store.keep(pgno, salts, page) {
                    self.base_cap_reached();
                }
            }
            Some(Err(e)) => {
                log::warn!(
                    "hermes-guard: could not read page {pgno} of {} to keep its base: {e}",
                    self.paths.db.display()
                );
                store.not_kept(salts);
            }
            None => store.not_kept(salts),
        }
    }

    /// A checkpoint of this connection's wrote `len` bytes at `offset` of the main file: the
    /// pages it covers are no longer their kept bases ([`BaseStore::checkpoint_wrote`]).
    /// Panic-free: it runs on the main file's write path, outside `catch_unwind`.
    pub(crate) fn main_written(&self, offset: i64, len: i32) {
        let Some(store) = self.base.store() else {
            return;
        };
        let Some(page_size) = store.current_page_size().filter(|&p| p > 0) else {
            return;
        };
        let (Ok(offset), Ok(len)) = (u64::try_from(offset), u64::try_from(len)) else {
            return;
        };
        let page_size = u64::from(page_size);
        let first = offset / page_size;
        let end = offset.saturating_add(len).div_ceil(page_size);
        for index in first..end {
            if let Ok(pgno) = u32::try_from(index + 1) {
                store.checkpoint_wrote(pgno);
            }
        }
    }

    /// The store reached its cap in this generation: said once.
    pub(super) fn base_cap_reached(&self) {
        log::info!(
            "hermes-guard: {} wrote more distinct pages in this WAL generation than the guard \
             keeps the base of ({CAP_PAGES} pages, {} MiB): a capture of it will not hold the base \
             of the pages past that, and recovery leaves their rows undecided",
            self.paths.db.display(),
            CAP_BYTES >> 20
        );
    }

    /// The base pages this process kept for the generation of `salts` (for its capture).
    pub(super) fn base_pages(&self, salts: [u32; 2]) -> Option<BasePages> {
        let store = self.base.store()?;
        store.snapshot(salts)
    }
}

/// The leaf page numbers a freelist trunk page lists (bytes 4..8: their count, then one each),
/// as far as the page holds them.
pub(crate) fn trunk_leaves(page: &[u8]) -> Vec<u32> {
    let word = |i: usize| {
        page.get(i..i + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    let count = word(4).unwrap_or(0) as usize;
    (0..count).map_while(|k| word(8 + 4 * k)).collect()
}

/// The page number and the salts a WAL frame header carries.
pub(crate) fn frame_page(header: &[u8; 24]) -> (u32, [u32; 2]) {
    let word =
        |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    (word(0), [word(8), word(12)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    struct Image(Vec<u8>);

    impl ImageSource for Image {
        fn size(&self) -> io::Result<u64> {
            Ok(self.0.len() as u64)
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            let at = offset as usize;
            let there = self
                .0
                .get(at..at + buf.len())
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(there);
            Ok(())
        }
    }

    /// A main file of `pages` 512-byte pages, page `p` filled with `p`.
    fn image(pages: u8) -> Image {
        let mut bytes = vec![0u8; 512 * pages as usize];
        for p in 1..=pages {
            bytes[(p as usize - 1) * 512..p as usize * 512].fill(p);
        }
        bytes[16..18].copy_from_slice(&512u16.to_be_bytes());
        Image(bytes)
    }

    #[test]
    fn a_page_is_read_at_its_first_frame_only_and_a_new_page_never() {
        let store = BaseStore::default();
        let main = image(4);
        assert_eq!(store.first_frame(2, [1, 2]), Keep::Begin);
        assert!(store.begin([1, 2], &main));
        assert_eq!(store.first_frame(2, [1, 2]), Keep::Read);
        assert!(!store.keep(2, [1, 2], vec![2u8; 512].into()));
        assert_eq!(store.first_frame(2, [1, 2]), Keep::Nothing, "seen");
        assert_eq!(
            store.first_frame(5, [1, 2]),
            Keep::Nothing,
            "new in the generation"
        );
        let kept = store.snapshot([1, 2]).unwrap();
        assert_eq!((kept.page_size, kept.pages_at_start), (512, 4));
        assert_eq!(kept.pages.keys().copied().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn new_salts_begin_a_new_generation_and_drop_the_old_pages() {
        let store = BaseStore::default();
        let main = image(4);
        store.begin([1, 2], &main);
        store.first_frame(3, [1, 2]);
        store.keep(3, [1, 2], vec![3u8; 512].into());
        assert_eq!(store.first_frame(3, [7, 8]), Keep::Begin);
        store.begin([7, 8], &main);
        assert_eq!(store.first_frame(3, [7, 8]), Keep::Read);
        assert!(store.snapshot([1, 2]).is_none());
        assert!(store.snapshot([7, 8]).unwrap().pages.is_empty());
        assert!(
            !store.keep(3, [1, 2], vec![3u8; 512].into()),
            "a late page of the old one"
        );
        assert!(store.snapshot([7, 8]).unwrap().pages.is_empty());
    }

    #[test]
    fn past_the_cap_pages_are_counted_and_said_once() {
        let store = BaseStore::default();
        let main = Image({
            let mut b = vec![0u8; 512 * (CAP_PAGES + 8)];
            b[16..18].copy_from_slice(&512u16.to_be_bytes());
            b
        });
        store.begin([1, 1], &main);
        let mut said = 0;
        for p in 1..=(CAP_PAGES as u32 + 3) {
            assert_eq!(store.first_frame(p, [1, 1]), Keep::Read);
            said += usize::from(store.keep(p, [1, 1], vec![0u8; 512].into()));
        }
        let kept = store.snapshot([1, 1]).unwrap();
        assert_eq!(kept.pages.len(), CAP_PAGES);
        assert_eq!(kept.over_cap, 3);
        assert_eq!(said, 1);
    }

    #[test]
    fn a_page_a_checkpoint_wrote_is_read_again_at_its_next_frame() {
        let store = BaseStore::default();
        store.begin([1, 2], &image(6));
        for pgno in [2, 3] {
            assert_eq!(store.first_frame(pgno, [1, 2]), Keep::Read);
            store.keep(pgno, [1, 2], vec![pgno as u8; 512].into());
        }
        assert_eq!(store.first_frame(8, [1, 2]), Keep::Nothing, "new");
        store.checkpoint_wrote(2);
        store.checkpoint_wrote(8);
        let kept = store.snapshot([1, 2]).unwrap();
        assert_eq!(kept.pages.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(
            store.first_frame(2, [1, 2]),
            Keep::Read,
            "the copy now in main"
        );
        assert_eq!(
            store.first_frame(3, [1, 2]),
            Keep::Nothing,
            "still its base"
        );
        assert_eq!(
            store.first_frame(8, [1, 2]),
            Keep::Read,
            "a new page once copied"
        );
        assert_eq!(store.first_frame(8, [1, 2]), Keep::Nothing, "read once");
        store.keep(2, [1, 2], vec![9u8; 512].into());
        let kept = store.snapshot([1, 2]).unwrap();
        assert_eq!(
            &kept.pages[&2][..2],
            &[9, 9],
            "the copy replaces nothing else"
        );
    }

    #[test]
    fn an_empty_main_file_keeps_nothing() {
        let store = BaseStore::default();
        assert!(store.begin([1, 2], &Image(Vec::new())));
        assert_eq!(store.first_frame(1, [1, 2]), Keep::Nothing);
    }

    #[test]
    fn the_frame_header_gives_page_and_salts() {
        let mut h = [0u8; 24];
        h[3] = 9;
        h[8..12].copy_from_slice(&5u32.to_be_bytes());
        h[12..16].copy_from_slice(&6u32.to_be_bytes());
        assert_eq!(frame_page(&h), (9, [5, 6]));
    }

    #[test]
    fn connections_of_one_generation_share_a_store() {
        let wal = FileId { dev: 1, ino: 99 };
        let a = BaseStore::join(None, wal);
        let b = BaseStore::join(None, wal);
        assert!(Arc::ptr_eq(&a, &b));
        let other = BaseStore::join(None, FileId { dev: 1, ino: 100 });
        assert!(!Arc::ptr_eq(&a, &other));
    }
}
