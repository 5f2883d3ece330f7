//! The durable state: what a power cut keeps.
//!
//! Every file and directory has an id of its own (assigned at creation, never reused, unlike the
//! backing inode numbers). The model keeps, per directory id, two durable name tables and, per
//! file id, the bytes its last `fsync`/`fdatasync` saw:
//!
//! - `strict` (LazyFS, POSIX): a directory's names become durable only when the directory is
//!   fsynced; until then a creation, rename, unlink or link is undone by a crash.
//! - `ordered` (a journaling filesystem's metadata, ext4 `data=writeback`): every name operation is
//!   durable at once, in order, while file data still waits for its fsync — a rename can survive
//!   while the data it points to does not.
//!
//! A [`Crash`] writes the disk a power cut leaves into a directory ([`Crash::write_image`]), with
//! either name table and a file's unsynced data dropped or torn at page granularity.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The page size of a torn write.
pub const PAGE: usize = 4096;

/// A directory's durable entries: name to id.
pub type Entries = BTreeMap<OsString, u64>;

/// Which directory entries survive the crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Names {
    /// Only those of a directory that was fsynced after the change (POSIX, LazyFS).
    Strict,
    /// Every completed creation, rename, unlink and link (ordered metadata journaling).
    Ordered,
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

/// Every combination of [`Names`] and [`Data`], the images a crash point is checked against.
pub const ALL_MODES: [(Names, Data); 4] = [
    (Names::Strict, Data::Drop),
    (Names::Strict, Data::Torn),
    (Names::Ordered, Data::Drop),
    (Names::Ordered, Data::Torn),
];

/// The durable state of a mounted filesystem.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// The root directory's id.
    pub root: u64,
    /// Ids that are directories.
    pub dirs: HashSet<u64>,
    /// Durable entries under [`Names::Strict`], per directory id.
    pub strict: HashMap<u64, Entries>,
    /// Durable entries under [`Names::Ordered`], per directory id.
    pub ordered: HashMap<u64, Entries>,
    /// A file's bytes at its last fsync, per file id (absent: never fsynced, empty on disk).
    pub data: HashMap<u64, Vec<u8>>,
}

impl Model {
    /// A file or directory `id` created as `name` in `dir` (not durable under `Strict` yet).
    pub fn created(&mut self, dir: u64, name: &OsString, id: u64, is_dir: bool) {
        if is_dir {
            self.dirs.insert(id);
            self.strict.entry(id).or_default();
            self.ordered.entry(id).or_default();
        }
        self.ordered
            .entry(dir)
            .or_default()
            .insert(name.clone(), id);
    }

    /// `name` removed from `dir` (unlink, rmdir).
    pub fn removed(&mut self, dir: u64, name: &OsString) {
        if let Some(entries) = self.ordered.get_mut(&dir) {
            entries.remove(name);
        }
    }

    /// `from/name` renamed to `to/new_name`.
    pub fn renamed(&mut self, from: u64, name: &OsString, to: u64, new_name: &OsString) {
        let id = self.ordered.get_mut(&from).and_then(|e| e.remove(name));
        if let Some(id) = id {
            self.ordered
                .entry(to)
                .or_default()
                .insert(new_name.clone(), id);
        }
    }

    /// The directory `dir` fsynced: its current entries are durable under both tables.
    pub fn dir_synced(&mut self, dir: u64, entries: Entries) {
        self.ordered.insert(dir, entries.clone());
        self.strict.insert(dir, entries);
    }

    /// The file `id` fsynced holding `bytes`.
    pub fn file_synced(&mut self, id: u64, bytes: Vec<u8>) {
        self.data.insert(id, bytes);
    }
}

/// The state at a power cut: the durable model and what was visible (for torn writes).
#[derive(Debug)]
pub struct Crash {
    /// The durable state.
    pub model: Model,
    /// Every file's visible bytes at the cut, per id (unlinked ones included).
    pub visible: HashMap<u64, Vec<u8>>,
    /// Where each file is now: in the backing directory, or in the graveyard once unlinked.
    pub located: HashMap<u64, PathBuf>,
    /// The backing directory.
    pub backing: PathBuf,
    /// Where the unlinked files are kept (`<backing>.lazyfs-unlinked`).
    pub graveyard: PathBuf,
}

impl Crash {
    /// Turns the backing directory into the disk this crash leaves, under `names` and `data`, in
    /// place: every file that survives is the same inode as before the cut (moved back from the
    /// graveyard when an unlink or a rename over it is undone), its bytes those `data` says.
    pub fn restore(&self, names: Names, data: Data) -> io::Result<()> {
        for (&id, path) in &self.located {
            let grave = self.graveyard.join(id.to_string());
            if path != &grave {
                std::fs::rename(path, &grave)?;
            }
        }
        for entry in std::fs::read_dir(&self.backing)? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        let table = match names {
            Names::Strict => &self.model.strict,
            Names::Ordered => &self.model.ordered,
        };
        let mut placed = HashMap::new();
        let mut seen = HashSet::new();
        self.restore_dir(
            table,
            self.model.root,
            &self.backing,
            data,
            &mut placed,
            &mut seen,
        )?;
        std::fs::remove_dir_all(&self.graveyard)
    }

    fn restore_dir(
        &self,
        table: &HashMap<u64, Entries>,
        dir: u64,
        dest: &Path,
        data: Data,
        placed: &mut HashMap<u64, PathBuf>,
        seen: &mut HashSet<u64>,
    ) -> io::Result<()> {
        if !seen.insert(dir) {
            return Ok(());
        }
        let Some(entries) = table.get(&dir) else {
            return Ok(());
        };
        for (name, &id) in entries {
            let path = dest.join(name);
            if self.model.dirs.contains(&id) {
                std::fs::create_dir(&path)?;
                self.restore_dir(table, id, &path, data, placed, seen)?;
                continue;
            }
            if let Some(first) = placed.get(&id) {
                std::fs::hard_link(first, &path)?;
                continue;
            }
            let grave = self.graveyard.join(id.to_string());
            if grave.exists() {
                std::fs::rename(&grave, &path)?;
            }
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(&path)?;
            file.write_all(&self.file_bytes(id, data))?;
            placed.insert(id, path);
        }
        Ok(())
    }

    /// Writes the disk this crash leaves, under `names` and `data`, into the directory `dest`
    /// (created; it must not exist yet).
    pub fn write_image(&self, dest: &Path, names: Names, data: Data) -> io::Result<()> {
        let table = match names {
            Names::Strict => &self.model.strict,
            Names::Ordered => &self.model.ordered,
        };
        let mut seen = HashSet::new();
        self.write_dir(table, self.model.root, dest, data, &mut seen)
    }

    fn write_dir(
        &self,
        table: &HashMap<u64, Entries>,
        dir: u64,
        dest: &Path,
        data: Data,
        seen: &mut HashSet<u64>,
    ) -> io::Result<()> {
        std::fs::create_dir(dest)?;
        if !seen.insert(dir) {
            return Ok(()); // a cycle of stale directory snapshots: cut it here
        }
        let Some(entries) = table.get(&dir) else {
            return Ok(());
        };
        for (name, &id) in entries {
            let path = dest.join(name);
            if self.model.dirs.contains(&id) {
                self.write_dir(table, id, &path, data, seen)?;
            } else {
                std::fs::write(&path, self.file_bytes(id, data))?;
            }
        }
        Ok(())
    }

    /// The bytes the file `id` holds after the crash.
    pub fn file_bytes(&self, id: u64, data: Data) -> Vec<u8> {
        let synced = self.model.data.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        match (data, self.visible.get(&id)) {
            (Data::Torn, Some(visible)) => tear(synced, visible),
            _ => synced.to_vec(),
        }
    }
}

/// `visible`'s length, with every other page that differs from `synced` reverted to `synced`
/// (zeros past its end): the 1st, 3rd... differing pages reached the disk.
pub fn tear(synced: &[u8], visible: &[u8]) -> Vec<u8> {
    let mut out = visible.to_vec();
    let mut differing = 0usize;
    for start in (0..visible.len()).step_by(PAGE) {
        let end = (start + PAGE).min(visible.len());
        let old: Vec<u8> = (start..end)
            .map(|i| synced.get(i).copied().unwrap_or(0))
            .collect();
        if old[..] == visible[start..end] && synced.len() >= end {
            continue;
        }
        if differing % 2 == 1 {
            out[start..end].copy_from_slice(&old);
        }
        differing += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_write_keeps_the_first_and_third_differing_pages() {
        let synced = vec![0u8; PAGE];
        let visible = vec![7u8; 4 * PAGE];
        let torn = tear(&synced, &visible);
        assert_eq!(torn.len(), 4 * PAGE);
        assert!(torn[..PAGE].iter().all(|&b| b == 7));
        assert!(torn[PAGE..2 * PAGE].iter().all(|&b| b == 0));
        assert!(torn[2 * PAGE..3 * PAGE].iter().all(|&b| b == 7));
        assert!(torn[3 * PAGE..].iter().all(|&b| b == 0));
    }

    #[test]
    fn an_unchanged_page_is_not_counted_as_torn() {
        let synced = [vec![1u8; PAGE], vec![2u8; PAGE]].concat();
        let visible = [vec![1u8; PAGE], vec![3u8; PAGE], vec![4u8; PAGE]].concat();
        let torn = tear(&synced, &visible);
        assert_eq!(&torn[..PAGE], &synced[..PAGE]);
        assert!(torn[PAGE..2 * PAGE].iter().all(|&b| b == 3));
        assert!(torn[2 * PAGE..].iter().all(|&b| b == 0));
    }
}
