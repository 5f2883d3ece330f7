//! The permissions of everything the guard creates for a database: a capture's directory and its
//! files (staged under `.partial`), a set-aside WAL's capture, `healed.json`, a heal's staged WAL,
//! a rebuild's new file and the directory that keeps the torn one.
//!
//! SQLite's unix VFS gives every file it creates for a database (its `-wal`, `-shm`, `-journal`)
//! the database's permission bits and, when the process is root, the database's owner and group
//! (`findCreateFileMode`, `robustFchown` in os_unix.c). The guard's copies follow the same rule,
//! so a copy is never readable by anyone the database itself is not readable by:
//!
//! - a file gets the database's bits (`st_mode & 0777`);
//! - a directory the same bits plus search (`x`) wherever read is allowed, and the owner's `rwx`
//!   (the guard fills it): 0600 → 0700, 0640 → 0750, 0644 → 0755;
//! - a root process (`geteuid() == 0`) gives either the database's owner and group;
//! - a database whose mode cannot be read: the most private, 0600 (0700), the creator's owner.
//!
//! Set at creation, never after the bytes are written: `openat`/`mkdirat` with the mode, then on
//! the fresh (still empty) descriptor `fchown` when root and — the umask may have stripped bits
//! of the creation mode, as SQLite's `robust_open` also finds — `fchmod` to the exact mode. The
//! umask only ever removes bits, so the object is never more open than the database at any point.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};

/// The most private bits, for a database whose own cannot be read.
const MOST_PRIVATE: u32 = 0o600;

/// A creation that could not be given its database's permissions. Whatever was created is
/// removed again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PermissionsError {
    /// `openat`/`mkdirat` itself failed.
    #[error("creating {} (mode {mode:04o}): {source}", path.display())]
    Create {
        /// The name created, relative to the directory it was created in.
        path: PathBuf,
        /// The mode asked for.
        mode: u32,
        /// What the operating system said.
        #[source]
        source: rustix::io::Errno,
    },
    /// The new object could not be given its database's owner.
    #[error("giving {} its database's owner {uid}:{gid}: {source}", path.display())]
    Chown {
        /// The name created.
        path: PathBuf,
        /// The database's owner.
        uid: u32,
        /// The database's group.
        gid: u32,
        /// What the operating system said.
        #[source]
        source: rustix::io::Errno,
    },
    /// The new object could not be given its exact mode (after the umask stripped bits), or its
    /// descriptor could not be opened or read.
    #[error("giving {} its database's mode {mode:04o}: {source}", path.display())]
    Mode {
        /// The name created.
        path: PathBuf,
        /// The mode wanted.
        mode: u32,
        /// What the operating system said.
        #[source]
        source: rustix::io::Errno,
    },
}

impl PermissionsError {
    /// The system's error number.
    pub(crate) fn errno(&self) -> rustix::io::Errno {
        match self {
            PermissionsError::Create { source, .. }
            | PermissionsError::Chown { source, .. }
            | PermissionsError::Mode { source, .. } => *source,
        }
    }
}

impl From<PermissionsError> for io::Error {
    fn from(e: PermissionsError) -> io::Error {
        io::Error::new(io::Error::from(e.errno()).kind(), e)
    }
}

/// The operating system's error number of `e`, seen through a [`PermissionsError`] it carries.
pub(crate) fn os_error(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()?
            .downcast_ref::<PermissionsError>()
            .map(|p| p.errno().raw_os_error())
    })
}

/// The permissions everything created for one database gets: its bits, and its owner when the
/// process is root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Permissions {
    bits: u32,
    owner: Option<(u32, u32)>,
}

impl Permissions {
    /// The permissions of the database `database` (`stat`, following a symlink as SQLite does);
    /// the most private when it cannot be read.
    pub(crate) fn of_database(database: &Path) -> Permissions {
        Self::from_stat(database, rustix::fs::stat(database))
    }

    /// The permissions of the database named `database`'s file name in the directory `dir` (held
    /// open: wherever the directory is now); the most private when it cannot be read.
    pub(crate) fn of_database_in(dir: BorrowedFd<'_>, database: &Path) -> Permissions {
        let Some(name) = database.file_name() else {
            return Self::from_stat(database, Err(rustix::io::Errno::INVAL));
        };
        Self::from_stat(database, rustix::fs::statat(dir, name, AtFlags::empty()))
    }

    fn from_stat(database: &Path, st: rustix::io::Result<rustix::fs::Stat>) -> Permissions {
        match st {
            Ok(st) => Permissions::new(
                st.st_mode & 0o777,
                rustix::process::geteuid()
                    .is_root()
                    .then_some((st.st_uid, st.st_gid)),
            ),
            Err(e) => {
                log::debug!(
                    "hermes-guard: the mode of {} cannot be read ({e}): what is created for it \
                     gets mode {MOST_PRIVATE:04o}",
                    database.display()
                );
                Permissions::most_private()
            }
        }
    }

    /// `bits` (of `0o777`) and, for a root process, the owner to give.
    pub(crate) fn new(bits: u32, owner: Option<(u32, u32)>) -> Permissions {
        Permissions {
            bits: bits & 0o777,
            owner,
        }
    }

    /// 0600 (0700), the creator's owner: for a database whose own permissions cannot be read.
    pub(crate) fn most_private() -> Permissions {
        Permissions::new(MOST_PRIVATE, None)
    }

    /// A file's mode.
    pub(crate) fn file_mode(&self) -> u32 {
        self.bits
    }

    /// A directory's mode: the bits, search wherever read is allowed, and the owner's `rwx`.
    pub(crate) fn dir_mode(&self) -> u32 {
        self.bits | ((self.bits & 0o444) >> 2) | 0o700
    }

    /// Creates the file `name` in `dir` (it must not exist: `O_EXCL`, never through a symlink),
    /// opened with `access` (`WRONLY` or `RDWR`), with these permissions.
    pub(crate) fn create_file<P: AsRef<Path>>(
        &self,
        dir: BorrowedFd<'_>,
        name: P,
        access: OFlags,
    ) -> Result<OwnedFd, PermissionsError> {
        let name = name.as_ref();
        let mode = self.file_mode();
        let flags = access | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd =
            rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode)).map_err(|source| {
                PermissionsError::Create {
                    path: name.to_path_buf(),
                    mode,
                    source,
                }
            })?;
        match self.settle(fd.as_fd(), name, mode) {
            Ok(()) => Ok(fd),
            Err(e) => {
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                Err(e)
            }
        }
    }

    /// Creates the directory `name` in `dir` (it must not exist) with these permissions and
    /// returns it opened read-only.
    pub(crate) fn create_dir<P: AsRef<Path>>(
        &self,
        dir: BorrowedFd<'_>,
        name: P,
    ) -> Result<OwnedFd, PermissionsError> {
        let name = name.as_ref();
        let mode = self.dir_mode();
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)).map_err(|source| {
            PermissionsError::Create {
                path: name.to_path_buf(),
                mode,
                source,
            }
        })?;
        let opened = rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| PermissionsError::Mode {
            path: name.to_path_buf(),
            mode,
            source,
        })
        .and_then(|fd| self.settle(fd.as_fd(), name, mode).map(|()| fd));
        if opened.is_err() {
            let _ = rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR);
        }
        opened
    }

    /// On a fresh, empty object: the database's owner first (root only), then the exact mode
    /// when the umask stripped bits of it — widening only once the owner is right.
    fn settle(&self, fd: BorrowedFd<'_>, name: &Path, mode: u32) -> Result<(), PermissionsError> {
        if let Some((uid, gid)) = self.owner {
            rustix::fs::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(
                |source| PermissionsError::Chown {
                    path: name.to_path_buf(),
                    uid,
                    gid,
                    source,
                },
            )?;
        }
        let mode_err = |source| PermissionsError::Mode {
            path: name.to_path_buf(),
            mode,
            source,
        };
        let st = rustix::fs::fstat(fd).map_err(mode_err)?;
        if st.st_mode & 0o777 != mode {
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(mode_err)?;
        }
        Ok(())
    }
}

/// [`Permissions::create_dir`] by path: `path`'s parent opened for the creation.
pub(crate) fn create_dir_at_path(
    permissions: &Permissions,
    path: &Path,
) -> Result<OwnedFd, PermissionsError> {
    let (dir, name) = parent_of(path, permissions.dir_mode())?;
    permissions.create_dir(dir.as_fd(), name)
}

/// [`Permissions::create_file`] by path (`WRONLY`).
pub(crate) fn create_file_at_path(
    permissions: &Permissions,
    path: &Path,
) -> Result<OwnedFd, PermissionsError> {
    let (dir, name) = parent_of(path, permissions.file_mode())?;
    permissions.create_file(dir.as_fd(), name, OFlags::WRONLY)
}

/// `path`'s parent directory (`.` for a bare name), opened to create in, and the name to create
/// there; a failure is the creation's of `path` with `mode`.
fn parent_of(path: &Path, mode: u32) -> Result<(OwnedFd, &OsStr), PermissionsError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or(path.as_os_str());
    let dir = crate::paths::open_dir_to_write_in(rustix::fs::CWD, parent).map_err(|e| {
        PermissionsError::Create {
            path: path.to_path_buf(),
            mode,
            source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
        }
    })?;
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_directory_adds_search_where_read_is_allowed() {
        assert_eq!(Permissions::new(0o600, None).dir_mode(), 0o700);
        assert_eq!(Permissions::new(0o640, None).dir_mode(), 0o750);
        assert_eq!(Permissions::new(0o644, None).dir_mode(), 0o755);
        assert_eq!(Permissions::new(0o660, None).dir_mode(), 0o770);
    }

    #[test]
    fn a_database_that_cannot_be_read_gives_the_most_private() {
        let p = Permissions::of_database(Path::new("/nonexistent/hermes-guard/state.db"));
        assert_eq!(p, Permissions::most_private());
        assert_eq!((p.file_mode(), p.dir_mode()), (0o600, 0o700));
    }

    #[test]
    fn a_created_file_and_directory_get_the_exact_mode_whatever_the_umask_stripped() {
        // 0o666 under any umask of the test process (022 usually strips the group's and others'
        // write): the fchmod on the fresh descriptor restores it.
        let dir = tempfile::tempdir().unwrap();
        let at = crate::paths::open_dir(rustix::fs::CWD, dir.path()).unwrap();
        let p = Permissions::new(0o666, None);
        drop(p.create_file(at.as_fd(), "f", OFlags::WRONLY).unwrap());
        drop(p.create_dir(at.as_fd(), "d").unwrap());
        let mode = |n: &str| std::fs::metadata(dir.path().join(n)).unwrap().mode() & 0o777;
        assert_eq!((mode("f"), mode("d")), (0o666, 0o777));
    }

    #[test]
    fn an_existing_name_is_never_opened_or_changed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let at = crate::paths::open_dir(rustix::fs::CWD, dir.path()).unwrap();
        let e = Permissions::new(0o644, None)
            .create_file(at.as_fd(), "f", OFlags::WRONLY)
            .unwrap_err();
        assert_eq!(e.errno(), rustix::io::Errno::EXIST);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"x");
    }
}
