//! The disk a power cut leaves: [`Crash`] restores it in place or writes it into a directory,
//! under a choice of which unsynced name operations survived ([`Names`], or any subset of them:
//! [`Crash::restore_with`]) and what became of unsynced data ([`Data`]).

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::model::{Data, Entries, Model, NameOp, Names, Xattrs};

/// The page size of a torn write.
pub const PAGE: usize = 4096;

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
    /// The name operations the cut found not durable, in order: [`Crash::restore_with`] keeps a
    /// subset of them.
    pub fn pending(&self) -> &[NameOp] {
        &self.model.pending
    }

    fn tables(&self, names: Names) -> HashMap<u64, Entries> {
        match names {
            Names::Strict => self.model.tables(&|_| false),
            Names::Ordered => self.model.tables(&|_| true),
            Names::Reordered => panic!("a reordered state is restored with Crash::restore_with"),
        }
    }

    /// Turns the backing directory into the disk this crash leaves, under `names` and `data`, in
    /// place: every file that survives is the same inode as before the cut (moved back from the
    /// graveyard when an unlink or a rename over it is undone), its bytes and extended attributes
    /// those its last fsync saw (`data` says what became of later writes).
    pub fn restore(&self, names: Names, data: Data) -> io::Result<()> {
        self.restore_tables(&self.tables(names), data)
    }

    /// [`Crash::restore`] with, of the pending name operations ([`Crash::pending`]), those whose
    /// entry of `kept` is true durable and the others undone (a disk that wrote some of them).
    pub fn restore_with(&self, kept: &[bool], data: Data) -> io::Result<()> {
        let tables = self
            .model
            .tables(&|i| kept.get(i).copied().unwrap_or(false));
        self.restore_tables(&tables, data)
    }

    fn restore_tables(&self, table: &HashMap<u64, Entries>, data: Data) -> io::Result<()> {
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
        let mut placed = HashMap::new();
        let mut seen = HashSet::new();
        let root = self.model.root;
        self.restore_dir(table, root, &self.backing, data, &mut placed, &mut seen)?;
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
            set_xattrs(&path, self.model.xattrs.get(&id))?;
            placed.insert(id, path);
        }
        Ok(())
    }

    /// Writes the disk this crash leaves, under `names` and `data`, into the directory `dest`
    /// (created; it must not exist yet).
    pub fn write_image(&self, dest: &Path, names: Names, data: Data) -> io::Result<()> {
        let table = self.tables(names);
        let mut seen = HashSet::new();
        self.write_dir(&table, self.model.root, dest, data, &mut seen)
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
                set_xattrs(&path, self.model.xattrs.get(&id))?;
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

/// The `user.` extended attributes of `path` (what the model tracks).
pub fn user_xattrs(path: &Path) -> io::Result<Xattrs> {
    let mut names = vec![0u8; 1 << 16];
    let n = rustix::fs::llistxattr(path, &mut names[..])?;
    let mut out = Xattrs::new();
    for name in names[..n].split(|&b| b == 0) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let name = OsStr::from_bytes(name);
        let mut value = vec![0u8; 1 << 16];
        let len = rustix::fs::lgetxattr(path, name, &mut value[..])?;
        value.truncate(len);
        out.insert(name.to_os_string(), value);
    }
    Ok(out)
}

/// Makes the `user.` extended attributes of `path` exactly `durable` (none when absent).
fn set_xattrs(path: &Path, durable: Option<&Xattrs>) -> io::Result<()> {
    let empty = Xattrs::new();
    let durable = durable.unwrap_or(&empty);
    for name in user_xattrs(path)?.keys() {
        if !durable.contains_key(name) {
            rustix::fs::lremovexattr(path, name.as_os_str())?;
        }
    }
    for (name, value) in durable {
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::lsetxattr(path, name.as_os_str(), value, flags)?;
    }
    Ok(())
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
