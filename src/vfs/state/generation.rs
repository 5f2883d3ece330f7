//! One retired generation's capture, shared by the process's connections that retired it, and
//! a connection's way to it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::Inner;
use crate::capture::{Captured, FailedCommit};
use crate::identity::FileId;

/// One retired generation, as far as captures go: the process's connections that retired it
/// take one capture between them. Keyed by the pinned main file and WAL inodes; an inode number
/// cannot be reused while a pinned descriptor holds it, and the map holds only weak references,
/// so a key never outlives the descriptors that make it unique.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GenerationKey {
    main: Option<FileId>,
    wal: FileId,
}

#[derive(Default)]
pub(crate) struct GenerationCapture {
    /// The capture and the WAL bytes it holds. Held across the capture, so connections that
    /// retire the same generation at once wait for the first one's capture instead of writing
    /// their own.
    pub(super) done: Mutex<Option<Captured>>,
    /// A commit of the generation failed to the application after its frames were written: what
    /// reads the generation from its WAL leaves them out (`capture/unacknowledged.rs`).
    pub(super) failed_commit: Mutex<Option<FailedCommit>>,
}

static GENERATIONS: Mutex<Option<HashMap<GenerationKey, Weak<GenerationCapture>>>> =
    Mutex::new(None);

impl GenerationCapture {
    /// The process's capture slot for `key`, made if none is alive.
    pub(super) fn join(key: GenerationKey) -> Arc<GenerationCapture> {
        let mut map = GENERATIONS.lock();
        let map = map.get_or_insert_with(HashMap::new);
        if let Some(live) = map.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        map.retain(|_, slot| slot.strong_count() > 0);
        let slot = Arc::new(GenerationCapture::default());
        map.insert(key, Arc::downgrade(&slot));
        slot
    }
}

impl Inner {
    /// The process's capture slot of this connection's generation, joined now if it was not;
    /// `None` without a pinned WAL.
    pub(super) fn generation_slot(&mut self) -> Option<Arc<GenerationCapture>> {
        let key = GenerationKey {
            main: self.pins.main_id,
            wal: self.pins.wal.as_ref()?.id(),
        };
        Some(
            self.loss
                .generation
                .get_or_insert_with(|| GenerationCapture::join(key))
                .clone(),
        )
    }

    /// The commit of this generation failed to the application, if any: its frames are no part
    /// of the generation.
    pub(super) fn failed_commit(&self) -> Option<FailedCommit> {
        *self.loss.generation.as_ref()?.failed_commit.lock()
    }

    /// Where the generation's bytes end in the pinned WAL: `None`, the whole file.
    pub(super) fn generation_end(&self) -> Option<u64> {
        let failed = self.failed_commit()?;
        failed.end_in(self.pins.wal.as_ref()?)
    }
}
