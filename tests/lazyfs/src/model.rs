//! The durable state: what a power cut keeps.
//!
//! Every file and directory has an id of its own (assigned at creation, never reused, unlike the
//! backing inode numbers). The model keeps, per directory id, the durable name table and the name
//! operations not durable yet, and per file id the bytes and extended attributes its last
//! `fsync`/`fdatasync` saw:
//!
//! - `strict` (LazyFS, POSIX): a directory's names as its last fsync saw them; every creation,
//!   rename, unlink or link since is undone by a crash ([`Names::Strict`]).
//! - `pending`: those operations, in order, each with the durable step that made it. Every one of
//!   them kept is [`Names::Ordered`] (a journaling filesystem's metadata, ext4
//!   `data=writeback`: a rename can survive while the data it points to does not); any subset of
//!   them kept is a reordered state ([`Crash::restore_with`]): a disk that wrote some of a
//!   directory's unsynced name operations and not others (the ALICE and CrashMonkey results).
//!
//! [`crate::Crash`] writes the disk a power cut leaves ([`crate::crash`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;

#[cfg(doc)]
use crate::Crash;

/// A directory's durable entries: name to id.
pub type Entries = BTreeMap<OsString, u64>;

/// A file's extended attributes: name to value.
pub type Xattrs = BTreeMap<OsString, Vec<u8>>;

/// Which directory entries survive the crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// Only those of a directory that was fsynced after the change (POSIX, LazyFS).
    Strict,
    /// Every completed creation, rename, unlink and link (ordered metadata journaling).
    Ordered,
    /// Some of the unsynced name operations, not others ([`Crash::restore_with`]).
    Reordered,
}

/// What happens to a file's data written after its last fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Data {
    /// Dropped: the file holds what its last fsync saw (nothing, if never fsynced).
    Drop,
    /// Torn: of the pages that differ from what the last fsync saw, the 1st, 3rd, 5th... reached
    /// the disk and the others did not; the file keeps its visible length.
    Torn,
}

/// Every combination of [`Names::Strict`]/[`Names::Ordered`] and [`Data`], the images each crash
/// point is checked against.
pub const ALL_MODES: [(Names, Data); 4] = [
    (Names::Strict, Data::Drop),
    (Names::Strict, Data::Torn),
    (Names::Ordered, Data::Drop),
    (Names::Ordered, Data::Torn),
];

/// One entry of a directory set (`Some(id)`) or removed (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The directory's id.
    pub dir: u64,
    /// The entry.
    pub name: OsString,
    /// What it names afterwards.
    pub to: Option<u64>,
}

/// A name operation not yet durable: its changes (one per directory it touches; a rename within
/// a directory is one operation of two changes, kept or undone together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameOp {
    /// The index (0-based) of the durable step that performed it.
    pub step: usize,
    /// Its changes.
    pub changes: Vec<Change>,
}

/// The durable state of a mounted filesystem.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// The root directory's id.
    pub root: u64,
    /// Ids that are directories.
    pub dirs: HashSet<u64>,
    /// Durable entries as each directory's last fsync saw them, per directory id.
    pub strict: HashMap<u64, Entries>,
    /// The entries now (every name operation applied), per directory id.
    pub ordered: HashMap<u64, Entries>,
    /// The name operations since each directory's last fsync, in order.
    pub pending: Vec<NameOp>,
    /// A file's bytes at its last fsync, per file id (absent: never fsynced, empty on disk).
    pub data: HashMap<u64, Vec<u8>>,
    /// A file's extended attributes at its last fsync (`user.` names), per file id.
    pub xattrs: HashMap<u64, Xattrs>,
}

impl Model {
    fn record(&mut self, step: usize, changes: Vec<Change>) {
        for c in &changes {
            let entries = self.ordered.entry(c.dir).or_default();
            match c.to {
                Some(id) => entries.insert(c.name.clone(), id),
                None => entries.remove(&c.name),
            };
        }
        self.pending.push(NameOp { step, changes });
    }

    /// A file or directory `id` created (or linked) as `name` in `dir` by the step `step`.
    pub fn created(&mut self, step: usize, dir: u64, name: &OsString, id: u64, is_dir: bool) {
        if is_dir {
            self.dirs.insert(id);
            self.strict.entry(id).or_default();
            self.ordered.entry(id).or_default();
        }
        let change = Change {
            dir,
            name: name.clone(),
            to: Some(id),
        };
        self.record(step, vec![change]);
    }

    /// `name` removed from `dir` (unlink, rmdir) by the step `step`.
    pub fn removed(&mut self, step: usize, dir: u64, name: &OsString) {
        let change = Change {
            dir,
            name: name.clone(),
            to: None,
        };
        self.record(step, vec![change]);
    }

    /// `from/name` renamed to `to/new_name` by the step `step`.
    pub fn renamed(&mut self, step: usize, from: u64, name: &OsString, to: u64, new: &OsString) {
        let Some(id) = self.ordered.get(&from).and_then(|e| e.get(name)).copied() else {
            return;
        };
        let changes = vec![
            Change {
                dir: from,
                name: name.clone(),
                to: None,
            },
            Change {
                dir: to,
                name: new.clone(),
                to: Some(id),
            },
        ];
        self.record(step, changes);
    }

    /// The directory `dir` fsynced holding `entries`: they are durable, and no pending operation
    /// changes `dir` any more.
    pub fn dir_synced(&mut self, dir: u64, entries: Entries) {
        self.ordered.insert(dir, entries.clone());
        self.strict.insert(dir, entries);
        for op in &mut self.pending {
            op.changes.retain(|c| c.dir != dir);
        }
        self.pending.retain(|op| !op.changes.is_empty());
    }

    /// The file `id` fsynced holding `bytes` and the extended attributes `xattrs`.
    pub fn file_synced(&mut self, id: u64, bytes: Vec<u8>, xattrs: Xattrs) {
        self.data.insert(id, bytes);
        self.xattrs.insert(id, xattrs);
    }

    /// The name tables a crash leaves when, of the pending operations, those `kept` says
    /// (by their index in `pending`) are durable and the others not.
    pub fn tables(&self, kept: &dyn Fn(usize) -> bool) -> HashMap<u64, Entries> {
        let mut tables = self.strict.clone();
        for (i, op) in self.pending.iter().enumerate() {
            if !kept(i) {
                continue;
            }
            for c in &op.changes {
                let entries = tables.entry(c.dir).or_default();
                match c.to {
                    Some(id) => entries.insert(c.name.clone(), id),
                    None => entries.remove(&c.name),
                };
            }
        }
        tables
    }
}
