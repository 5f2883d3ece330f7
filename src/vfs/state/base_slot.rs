//! Where this connection's base pages go and come from: the process's base-page store of its
//! pinned WAL generation (`state/base_pages.rs`) and the reader of the main file they are read
//! with.

use std::sync::Arc;

use parking_lot::Mutex;

use super::base_pages::BaseStore;
use crate::capture::ImageSource;

#[derive(Default)]
pub(super) struct BaseSlot {
    /// The process's base-page store of this connection's WAL generation, while it is pinned.
    pub(super) store: Mutex<Option<Arc<BaseStore>>>,
    /// How the base pages are read from the main file: SQLite's descriptor of it where the shim
    /// sees into the unix VFS (`vfs/file/open.rs`), else the file object. Apart from the state's
    /// `inner`, so that no read is made under the state's lock.
    pub(super) reader: Mutex<Option<Box<dyn ImageSource + Send>>>,
}

impl BaseSlot {
    /// The store, while the WAL is pinned.
    pub(super) fn store(&self) -> Option<Arc<BaseStore>> {
        self.store.lock().clone()
    }
}
