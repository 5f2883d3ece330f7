//! The base of the pages a generation frees without writing them.
//!
//! SQLite does not write a page it puts on the freelist as a leaf (`freePage2` calls
//! `sqlite3PagerDontWrite` on it, unless `secure_delete` is on): its frame never reaches the WAL,
//! and the rows the generation deleted with it are seen nowhere but in what the page was before.
//! What the WAL does carry is the freelist: page 1's header (the first trunk at offset 32, the
//! page count at 36) and the first trunk page, which lists its leaves (a count at byte 4, then
//! one page number each). So when page 1's frame shows the count grew, the guard expects the
//! first trunk's frame of the same transaction (frames are written in page order, page 1 first),
//! and each page it lists that it did not list when the generation began (the trunk's kept base,
//! when it was the first trunk then; nothing, when it became a trunk in the generation), that has
//! no frame in the generation and that the main file held, is read from the main file and kept,
//! flagged freed (`capture/base_file.rs`). Before the frame rule's check of the same write, as
//! every base page is read (`state/base_pages.rs`).

use super::base_pages::trunk_leaves;
use super::ConnectionState;

impl ConnectionState {
    /// The page of page 1's frame, or of the freelist trunk's frame it announced, is about to be
    /// written: the pages this transaction freed are kept (see the module's docs).
    pub(crate) fn freelist_page_written(&self, pgno: u32, page: &[u8]) {
        let Some(store) = self.base.store() else {
            return;
        };
        let word = |i: usize| {
            page.get(i..i + 4)
                .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        };
        if pgno == 1 {
            if let (Some(trunk), Some(count)) = (word(32), word(36)) {
                if store.free_count_now(count) && trunk != 0 {
                    self.frames.expect_trunk(trunk);
                }
            }
            return;
        }
        self.frames.expect_trunk(0);
        let Some(at_start) = store.trunk_at_start(pgno) else {
            // The first trunk when the generation began, its base not kept: which of its leaves
            // are new is unknown, and none is kept.
            store.not_kept_current();
            return;
        };
        let freed: Vec<u32> = trunk_leaves(page)
            .into_iter()
            .filter(|p| !at_start.contains(p))
            .collect();
        let (Some(salts), to_read) = store.freed_to_read(&freed) else {
            return;
        };
        let Some(page_size) = store.page_size(salts) else {
            return;
        };
        for leaf in to_read {
            let mut base = vec![0u8; page_size as usize].into_boxed_slice();
            let read =
                self.base.reader.lock().as_deref().map(|main| {
                    main.read_at(&mut base, u64::from(leaf - 1) * u64::from(page_size))
                });
            match read {
                Some(Ok(())) => {
                    if store.keep_freed(leaf, salts, base) {
                        self.base_cap_reached();
                    }
                }
                _ => store.not_kept(salts),
            }
        }
    }
}
