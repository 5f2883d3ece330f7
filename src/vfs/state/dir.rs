//! The database's directory, found when a capture or a heal needs it instead of held
//! from the open. A directory descriptor per database (one per directory, and many applications
//! keep each database in a directory of its own) was the guard's second descriptor beyond
//! stock's; a live generation needs none.
//!
//! At the open the guard records the directory's identity (one `stat`) and SQLite's descriptor
//! of the main file. At the retirement — or whenever a capture or a heal first needs it — the
//! directory is found and held from then on: by its pathname when that is still the same
//! directory, else through the main file's descriptor (`/proc/self/fd/<n>` names the file where
//! it is now: it follows a rename of the directory, and keeps naming the directory that held an
//! unlinked or replaced file), checked against the recorded identity either way. When neither
//! leads to it, the directory was deleted (or moved away with the main file moved out of it,
//! which the guard cannot tell apart): the deleted-directory rules apply (`retry.rs`).
//!
//! For a VFS the shim cannot see into (no descriptor to follow) the directory is held from the
//! open, as before.

use std::ffi::OsStr;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::super::retry;
use super::ConnectionState;
use crate::filesystem::Filesystem;
use crate::identity::FileId;
use crate::paths::DirHandle;

/// The database's directory: its identity and filesystem at the open, and where it is now.
pub(super) struct Directory {
    /// Where it is, as far as the guard knows.
    pub(super) slot: Mutex<DirSlot>,
    /// Its identity at the open (shared with the connections opened beside this one,
    /// `state/open_here.rs`).
    pub(super) id: Option<FileId>,
    /// The filesystem the database is on (found once per mount).
    pub(super) filesystem: Option<Filesystem>,
}

impl Directory {
    /// [`DirSlot::at_open`], with the identity and filesystem found at the open.
    pub(super) fn at_open(
        db_path: &Path,
        main_fd: Option<RawFd>,
        id: Option<FileId>,
        filesystem: Option<Filesystem>,
    ) -> Directory {
        Directory {
            slot: Mutex::new(DirSlot::at_open(db_path, main_fd, id)),
            id,
            filesystem,
        }
    }

    /// Whether the database is on a local filesystem (inotify sees every change there).
    pub(super) fn on_local_filesystem(&self) -> bool {
        self.filesystem.as_ref().is_some_and(|f| f.local)
    }
}

/// Where the database's directory is, as far as the guard knows it.
pub(crate) enum DirSlot {
    /// Not needed yet: the directory's identity at the open and SQLite's descriptor of the main
    /// file, to find it by when it is.
    Unresolved { id: FileId, main_fd: RawFd },
    /// Held: since the open (a VFS the shim cannot see into), or since it was first needed.
    Held(Arc<DirHandle>),
    /// No name leads to the directory any more: deleted.
    Gone,
    /// No directory descriptor can be had (a relative name, or it could not be opened): a
    /// capture opens the directory by path.
    ByPath,
}

impl DirSlot {
    /// The slot of a database opened at `db_path`, SQLite's descriptor of it `main_fd` when the
    /// shim can see into the wrapped file.
    /// `dir_id`: the directory's identity, `stat`ed at the open.
    pub(crate) fn at_open(
        db_path: &Path,
        main_fd: Option<RawFd>,
        dir_id: Option<FileId>,
    ) -> DirSlot {
        let Some(parent) = db_path.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return DirSlot::ByPath;
        };
        if let (Some(main_fd), Some(id)) = (main_fd, dir_id) {
            return DirSlot::Unresolved { id, main_fd };
        }
        match DirHandle::open_shared(parent) {
            Ok(dir) => DirSlot::Held(dir),
            Err(e) => {
                log::warn!(
                    "hermes-guard: cannot open the directory {} of {}: {e}; a capture will be \
                     written by path, and not at all if the directory is moved away",
                    parent.display(),
                    db_path.display()
                );
                DirSlot::ByPath
            }
        }
    }
}

/// The directory `main_fd` (SQLite's descriptor of the main file) is in now, as the kernel names
/// it: `/proc/self/fd/<n>`, less the ` (deleted)` it appends for an unlinked file.
fn parent_of_descriptor(main_fd: RawFd) -> Option<PathBuf> {
    let link = std::fs::read_link(format!("/proc/self/fd/{main_fd}")).ok()?;
    let bytes = link.as_os_str().as_bytes();
    let bytes = bytes.strip_suffix(b" (deleted)").unwrap_or(bytes);
    Path::new(OsStr::from_bytes(bytes))
        .parent()
        .filter(|p| p.is_absolute())
        .map(Path::to_path_buf)
}

/// Finds the directory whose identity was `id` at the open: at `db_path`'s parent, else where
/// `main_fd` says the main file is now.
///
/// Deleted ([`DirSlot::Gone`]) only on evidence: every name tried is gone or another directory, and
/// the main file has no link left (`rm -r` unlinks it too; a directory moved away with its database
/// keeps the file linked). A directory the process may write in but not read (a service user's
/// mode-0773 directory) is held `O_PATH` (`paths::open_dir_to_write_in`): a capture and a heal need
/// no read permission. A failure to look — out of descriptors (`EMFILE`, `ENFILE`), memory, no
/// search permission on the way (`EACCES`), an interrupted call — proves nothing: the directory
/// stays unresolved, to be looked for again, and a capture meanwhile goes by path or to the
/// fallback directory, never let go; a heal with no capture goes in place.
fn resolve(db_path: &Path, id: FileId, main_fd: RawFd) -> DirSlot {
    let by_name = db_path.parent().map(Path::to_path_buf);
    let candidates = [by_name, parent_of_descriptor(main_fd)];
    let mut failed = None;
    for candidate in candidates.iter().flatten() {
        match DirHandle::open_shared(candidate) {
            Ok(dir) if dir.id() == id => return DirSlot::Held(dir),
            Ok(_) => {}
            Err(e) if no_such_directory(&e) => {}
            Err(e) => failed = Some((candidate.clone(), e)),
        }
    }
    // Hidden under a mount since the open: the capture goes into the hidden directory, beside
    // the database, as a descriptor held since the open would have it.
    if let Some(dir) = candidates
        .iter()
        .flatten()
        .find_map(|candidate| DirHandle::hidden(candidate, id))
    {
        return DirSlot::Held(dir);
    }
    let unresolved = DirSlot::Unresolved { id, main_fd };
    if let Some((candidate, e)) = failed {
        log::info!(
            "hermes-guard: cannot open the directory {} of {} ({e}): not taken for deleted; \
             looked for again when next needed",
            candidate.display(),
            db_path.display()
        );
        return unresolved;
    }
    // The link count of the file SQLite's descriptor reaches (a `stat` through the descriptor's
    // link: the file itself, whatever its name now).
    if let Ok(st) = std::fs::metadata(format!("/proc/self/fd/{main_fd}")) {
        if std::os::unix::fs::MetadataExt::nlink(&st) > 0 {
            log::info!(
                "hermes-guard: the directory of {} ({id}) is not at its name, but the database \
                 file is still linked: not taken for deleted",
                db_path.display()
            );
            return unresolved;
        }
    }
    log::info!(
        "hermes-guard: the directory of {} ({id}) is no longer reachable by any name and the \
         database file has no link left: deleted",
        db_path.display()
    );
    DirSlot::Gone
}

/// The errors that say a name leads to no directory (rather than that it could not be looked at).
fn no_such_directory(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

impl ConnectionState {
    /// The database's directory, found now if it was not needed before (and held from now on);
    /// `None` when it is gone or only reachable by path.
    pub(crate) fn dir(&self) -> Option<Arc<DirHandle>> {
        let mut slot = self.directory.slot.lock();
        if let DirSlot::Unresolved { id, main_fd } = *slot {
            *slot = resolve(&self.paths.db, id, main_fd);
        }
        match &*slot {
            DirSlot::Held(dir) => Some(dir.clone()),
            _ => None,
        }
    }

    /// Whether the database's directory was deleted (finding it first if need be).
    pub(crate) fn directory_deleted(&self) -> bool {
        let held = self.dir();
        match held {
            Some(dir) => retry::directory_deleted(&dir),
            None => matches!(*self.directory.slot.lock(), DirSlot::Gone),
        }
    }

    /// Whether the directory is held now (for the tests).
    #[cfg(test)]
    pub(crate) fn holds_dir(&self) -> bool {
        matches!(*self.directory.slot.lock(), DirSlot::Held(_))
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::os::fd::AsRawFd;

    use super::*;

    /// A database in a directory of its own under a temporary directory, opened (`File` standing
    /// in for SQLite's descriptor), and its state.
    fn opened(base: &Path) -> (PathBuf, File, Arc<ConnectionState>) {
        let dir = base.join("tenant");
        fs::create_dir(&dir).unwrap();
        let db = dir.join("state.db");
        fs::write(&db, b"main image").unwrap();
        let main = File::open(&db).unwrap();
        let state = ConnectionState::new(db, Some(main.as_raw_fd()));
        (dir, main, state)
    }

    #[test]
    fn a_database_opened_through_a_descriptor_holds_no_directory() {
        let base = tempfile::tempdir().unwrap();
        let (_dir, _main, state) = opened(base.path());
        assert!(!state.holds_dir());
    }

    #[test]
    fn a_directory_renamed_away_is_found_through_the_main_files_descriptor() {
        let base = tempfile::tempdir().unwrap();
        let (dir, _main, state) = opened(base.path());
        let moved = base.path().join("moved");
        fs::rename(&dir, &moved).unwrap();
        fs::create_dir(&dir).unwrap(); // another directory at the old name
        let found = state.dir().expect("found");
        assert_eq!(found.current_path(), moved.canonicalize().unwrap());
        assert!(!state.directory_deleted());
    }

    #[test]
    fn a_directory_renamed_away_after_its_main_file_was_replaced_is_still_found() {
        let base = tempfile::tempdir().unwrap();
        let (dir, _main, state) = opened(base.path());
        let db = dir.join("state.db");
        fs::write(dir.join("copy"), b"newer").unwrap();
        fs::rename(dir.join("copy"), &db).unwrap();
        let moved = base.path().join("moved");
        fs::rename(&dir, &moved).unwrap();
        let found = state.dir().expect("found");
        assert_eq!(found.current_path(), moved.canonicalize().unwrap());
    }

    #[test]
    fn a_deleted_directory_is_found_deleted() {
        let base = tempfile::tempdir().unwrap();
        let (dir, _main, state) = opened(base.path());
        fs::remove_dir_all(&dir).unwrap();
        assert!(state.directory_deleted());
        assert!(state.dir().is_none());
    }

    #[test]
    fn a_deleted_directory_replaced_by_a_new_one_at_its_name_is_found_deleted() {
        let base = tempfile::tempdir().unwrap();
        let (dir, _main, state) = opened(base.path());
        // Held open, the deleted directory's inode cannot be reused by the new one.
        let _old = File::open(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        fs::create_dir(&dir).unwrap();
        assert!(state.directory_deleted());
        assert!(state.dir().is_none());
    }
}
