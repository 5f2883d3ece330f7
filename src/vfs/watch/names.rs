//! The creations a directory watch has seen of each guarded database's names — the
//! database itself, `-wal`, `-shm` and `-journal` — so that a capture can say whether its main
//! image is the one its WAL generation was written on.
//!
//! A newer generation of a database cannot write its main file without first making one of
//! those names: a connection that finds no `-wal` at the path creates one, one that finds no
//! `-shm` creates that, a rollback-journal writer creates `-journal`, and a restore by rename
//! moves a new file in under the database's own name. The kernel queues each creation on the
//! inotify instance inside the syscall that makes it, so once the queue is drained, a count
//! that has not moved since a connection pinned its files says that no such name was made in
//! between. Anything that blinds the watch (a queue overflow, a read error) is counted too: a
//! capture then cannot claim its base. A change of the mount table does not blind it: the
//! watch is on the directory's inode, which sees a creation through any mount.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::DirWatch;

/// The suffixes SQLite adds to a database's name for its side files.
const SIDE_SUFFIXES: [&[u8]; 3] = [b"-wal", b"-shm", b"-journal"];

/// What a watched directory has seen of the names of the databases tracked in it.
#[derive(Default)]
pub(super) struct Names {
    /// Database file name → creations of it or of its side files.
    created: Mutex<HashMap<Vec<u8>, u64>>,
    /// Times the watch may have missed an event (a queue overflow, a read error).
    blind: AtomicU64,
}

/// The counts at one moment: equal counts at two moments mean no name of the database was
/// created in between and the watch missed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Creations {
    pub(crate) created: u64,
    pub(crate) blind: u64,
}

impl Names {
    /// Starts counting the names of the database called `name` (idempotent).
    pub(super) fn track(&self, name: &OsStr) {
        self.created
            .lock()
            .entry(name.as_bytes().to_vec())
            .or_insert(0);
    }

    /// An entry `name` was created in the directory or moved into it.
    pub(super) fn created(&self, name: &CStr) {
        let bytes = name.to_bytes();
        let mut created = self.created.lock();
        if created.is_empty() {
            return;
        }
        let stem = SIDE_SUFFIXES
            .iter()
            .find_map(|s| bytes.strip_suffix(*s))
            .filter(|stem| created.contains_key(*stem));
        if let Some(count) = created.get_mut(stem.unwrap_or(bytes)) {
            *count += 1;
        }
    }

    /// The watch may have missed events.
    pub(super) fn blinded(&self) {
        self.blind.fetch_add(1, Ordering::AcqRel);
    }

    /// The counts of the database `name` (`None` when it is not tracked here).
    pub(super) fn of(&self, name: &OsStr) -> Option<Creations> {
        let created = *self.created.lock().get(name.as_bytes())?;
        Some(Creations {
            created,
            blind: self.blind.load(Ordering::Acquire),
        })
    }
}

impl DirWatch {
    /// Counts the creations of the database `name`'s names in the watched directory
    /// from now on (`names.rs`).
    pub(crate) fn track(&self, name: &OsStr) {
        if let Some(dir) = self.entries.first() {
            dir.names.track(name);
        }
    }

    /// Whether `other` counts with the same counters (the same watcher's entry for the same
    /// directory): then a count taken through one compares with a count taken through the other.
    pub(crate) fn counts_with(&self, other: &DirWatch) -> bool {
        self.epoch == other.epoch
            && matches!((self.entries.first(), other.entries.first()),
                (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b))
    }

    /// The creation counts of the tracked database `name`, the queue drained first; `None` when
    /// this watch can no longer vouch (its directory moved, deleted or unwatched, a forked
    /// child, no watcher) or `name` is not tracked.
    pub(crate) fn creations(&self, name: &OsStr) -> Option<Creations> {
        self.after_drain(|w| {
            let dir = w.entries.first()?;
            if !dir.current.load(Ordering::Acquire) {
                return None;
            }
            dir.names.of(name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(names: &Names, db: &str) -> u64 {
        names.of(OsStr::new(db)).unwrap().created
    }

    #[test]
    fn a_side_file_or_the_database_itself_counts_for_its_database() {
        let names = Names::default();
        names.track(OsStr::new("state.db"));
        for made in [
            c"state.db-wal",
            c"state.db-shm",
            c"state.db-journal",
            c"state.db",
        ] {
            names.created(made);
        }
        assert_eq!(of(&names, "state.db"), 4);
    }

    #[test]
    fn another_databases_names_do_not_count() {
        let names = Names::default();
        names.track(OsStr::new("state.db"));
        names.track(OsStr::new("state.db-wal.db"));
        for made in [
            c"other.db-wal",
            c"state.db.tmp",
            c"state.db-wal.db-wal",
            c"state.dbx-wal",
        ] {
            names.created(made);
        }
        assert_eq!(of(&names, "state.db"), 0);
        assert_eq!(of(&names, "state.db-wal.db"), 1);
    }

    #[test]
    fn an_untracked_database_has_no_counts() {
        let names = Names::default();
        names.created(c"state.db-wal");
        assert!(names.of(OsStr::new("state.db")).is_none());
    }
}
