//! The guarded main files open in this process, by main inode (issue 30): how many connections
//! of a retired generation are still open here. The unix VFS shares one `-shm` mapping per inode
//! in a process, so while any of them is open a new connection to the same file attaches to the
//! retired generation's wal-index, and the guard refuses it (`shm-lost`); once they have all
//! closed, a new connection maps the `-shm` at the path afresh and works.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::DbState;
use crate::identity::FileId;

static OPEN: Mutex<Option<HashMap<FileId, Vec<Weak<DbState>>>>> = Mutex::new(None);

impl DbState {
    /// The main file of `state` was opened (one entry per connection).
    pub(crate) fn opened_here(state: &Arc<DbState>) {
        let Some(id) = state.main_id() else {
            return;
        };
        let mut open = OPEN.lock();
        let connections = open.get_or_insert_with(HashMap::new).entry(id).or_default();
        connections.retain(|s| s.strong_count() > 0);
        connections.push(Arc::downgrade(state));
    }

    /// The main file of this connection is closing.
    pub(crate) fn closing_here(&self) {
        let Some(id) = self.main_id() else {
            return;
        };
        let mut open = OPEN.lock();
        let Some(map) = open.as_mut() else {
            return;
        };
        if let Some(connections) = map.get_mut(&id) {
            connections.retain(|s| s.strong_count() > 0 && !std::ptr::eq(s.as_ptr(), self));
            if connections.is_empty() {
                map.remove(&id);
            }
        }
    }

    /// Connections open in this process on this connection's main file whose generation is
    /// retired (this one included).
    pub(crate) fn retired_open_here(&self) -> usize {
        let Some(id) = self.main_id() else {
            return usize::from(self.is_retired());
        };
        let states: Vec<Arc<DbState>> = OPEN
            .lock()
            .as_ref()
            .and_then(|map| map.get(&id))
            .map(|c| c.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        states.iter().filter(|s| s.is_retired()).count()
    }
}
