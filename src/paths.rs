//! Paths as the bytes they are, and the database's directory held open. Public: only
//! [`sidecar`], for the CLI and the tests.
//!
//! A Unix path is a byte string. SQLite hands the guard a C string; it is turned into a `Path`
//! byte for byte (never through UTF-8), and where a path is written into JSON it goes as a
//! display string plus, only when the bytes are not UTF-8, the exact bytes in hex.
//!
//! `DirHandle` (crate-private) is a descriptor of a database's directory, held once a capture or
//! a heal needs it: captures are written relative to it, so one lands beside the database even
//! after the whole directory was renamed away. One descriptor per directory is shared by every
//! connection of the process. Read-only when the process may list the directory, else `O_PATH`
//! (a service user's directory it may create in but not list: `open_dir_to_write_in` and
//! `sync_dir`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags, CWD};

use crate::identity::{identity_of_fd, FileId};

/// `<database>` + suffix, e.g. `state.db-wal`: the path of a database's sidecar (`-wal`, `-shm`,
/// `-journal`), byte for byte.
pub fn sidecar(database: &Path, suffix: &str) -> PathBuf {
    let mut s = database.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// A string to show for `path`: the path itself when it is UTF-8, else with each invalid
/// sequence replaced by U+FFFD. Never to be turned back into a path: see [`path_hex`].
pub(crate) fn path_display(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The exact bytes of `path` in lowercase hex, only when they are not UTF-8 (when they are, the
/// display string is the path).
pub(crate) fn path_hex(path: &Path) -> Option<String> {
    path.to_str()
        .is_none()
        .then(|| hex(path.as_os_str().as_bytes()))
}

/// A path's exact bytes in hex that are not hex (an odd length, or a digit that is not one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed hex path bytes for {display:?}")]
pub(crate) struct MalformedPathHex {
    /// The path's display string.
    pub(crate) display: String,
    /// The hex as given.
    pub(crate) hex: String,
}

/// The path from its display string and, when present, its exact bytes in hex.
pub(crate) fn path_from_parts(
    display: String,
    hex: Option<&str>,
) -> Result<PathBuf, MalformedPathHex> {
    match hex {
        None => Ok(PathBuf::from(display)),
        Some(h) => unhex(h)
            .map(|bytes| PathBuf::from(OsString::from_vec(bytes)))
            .ok_or_else(|| MalformedPathHex {
                display,
                hex: h.to_owned(),
            }),
    }
}

/// Lowercase hex, two digits per byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The bytes of lowercase or uppercase hex, two digits per byte; `None` when malformed.
pub(crate) fn unhex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A descriptor of a directory (`O_DIRECTORY|O_CLOEXEC`), shared by every connection of the
/// process whose database is in it: read-only, so it can be `fsync`ed, or `O_PATH` when the
/// process may not read (list) the directory ([`open_dir_to_write_in`]). Holding it takes no lock
/// (SQLite's POSIX locks are on the database file).
#[derive(Debug)]
pub(crate) struct DirHandle {
    fd: OwnedFd,
    /// Its identity.
    id: FileId,
    /// The path it was opened by, for when `/proc` cannot say where it is now.
    opened_as: PathBuf,
    /// Reached through a detached copy of a mount (see [`DirHandle::hidden`]): `/proc` names it
    /// inside that copy, so its path is the one it was opened by.
    detached: bool,
}

static SHARED: Mutex<Option<HashMap<FileId, Weak<DirHandle>>>> = Mutex::new(None);

impl DirHandle {
    /// Opens `dir`, or joins the descriptor another connection of this process holds on the same
    /// directory (same `(dev, ino)`).
    pub(crate) fn open_shared(dir: &Path) -> io::Result<Arc<DirHandle>> {
        let fd = open_dir_to_write_in(CWD, dir)?;
        let id = identity_of_fd(&fd)?;
        let mut shared = SHARED.lock();
        let map = shared.get_or_insert_with(HashMap::new);
        if let Some(held) = map.get(&id).and_then(Weak::upgrade) {
            // Ours is closed on return; the held one is the same directory.
            return Ok(held);
        }
        map.retain(|_, w| w.strong_count() > 0);
        let handle = Arc::new(DirHandle {
            fd,
            id,
            opened_as: dir.to_path_buf(),
            detached: false,
        });
        map.insert(id, Arc::downgrade(&handle));
        Ok(handle)
    }

    /// The directory `dir` whose identity is `id`, hidden since under a mount (a mount over it
    /// or over a directory above it): reached through a copy of the mount it is on, taken
    /// without the mounts above it (`open_tree(OPEN_TREE_CLONE)`, which needs `CAP_SYS_ADMIN`).
    /// Not shared; `None` when no ancestor's copy leads to it.
    pub(crate) fn hidden(dir: &Path, id: FileId) -> Option<Arc<DirHandle>> {
        use rustix::mount::{open_tree, OpenTreeFlags};
        let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
        dir.ancestors().skip(1).find_map(|above| {
            let tree = open_tree(CWD, above, flags).ok()?;
            let inside = dir.strip_prefix(above).ok()?;
            let fd = open_dir(&tree, inside).ok()?;
            (identity_of_fd(&fd).ok()? == id).then(|| {
                Arc::new(DirHandle {
                    fd,
                    id,
                    opened_as: dir.to_path_buf(),
                    detached: true,
                })
            })
        })
    }

    /// The directory's identity.
    pub(crate) fn id(&self) -> FileId {
        self.id
    }

    /// The descriptor.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Where the directory is now, byte for byte (`/proc/self/fd/N`); the path it was opened by
    /// when `/proc` cannot say.
    pub(crate) fn current_path(&self) -> PathBuf {
        if self.detached {
            return self.opened_as.clone();
        }
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .ok()
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| self.opened_as.clone())
    }
}

/// Opens the directory `path` (relative to `at`) read-only, `O_DIRECTORY|O_CLOEXEC`.
pub(crate) fn open_dir<Fd: AsFd>(at: Fd, path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        at,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `path` (relative to `at`) for the `*at` calls a capture or a heal makes in
/// it (`openat`, `mkdirat`, `renameat`, `unlinkat`, `fstatat`): read-only when the process may read
/// it, else — `EACCES`: a directory it may search and write but not list, such as a service user's
/// mode-0773 directory owned by root — `O_PATH`, which needs no permission on the directory itself.
/// Creating a name needs search and write permission on the directory, never read: the `*at` calls
/// take an `O_PATH` descriptor. What it cannot do is list the directory (`getdents`) or be
/// `fsync`ed: see [`sync_dir`].
pub(crate) fn open_dir_to_write_in<Fd: AsFd>(at: Fd, path: &Path) -> io::Result<OwnedFd> {
    match open_dir(&at, path) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => Ok(rustix::fs::openat(
            at,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?),
        other => other,
    }
}

/// Whether `dir` was opened `O_PATH` ([`open_dir_to_write_in`]): it can neither be listed nor
/// `fsync`ed.
pub(crate) fn is_path_only(dir: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_getfl(dir).is_ok_and(|flags| flags.contains(OFlags::PATH))
}

/// Makes the names created, renamed or removed in the directory `dir` durable: `fsync(dir)`.
///
/// A directory opened `O_PATH` (one this process may write in but not read,
/// [`open_dir_to_write_in`]) cannot be `fsync`ed (`EBADF`), and no readable descriptor of it can
/// be had. Its filesystem is synced instead, through `witness`, a readable descriptor of a file
/// made in (or opened from) that very directory — the capture's staging directory, a heal's
/// staging file, the pinned WAL: `syncfs` writes back every dirty inode of the filesystem,
/// the directory's among them, and on a journaling filesystem commits the journal that holds
/// its entries; since Linux 5.8 it reports a writeback error as `fsync` does. Costlier than one
/// directory's `fsync` (the whole filesystem's dirty data), and only ever taken on this path. A
/// witness on another device than the directory is refused: it would sync the wrong filesystem.
pub(crate) fn sync_dir(dir: BorrowedFd<'_>, witness: BorrowedFd<'_>) -> io::Result<()> {
    match rustix::fs::fsync(dir) {
        Err(rustix::io::Errno::BADF) if is_path_only(dir) => {
            let (d, w) = (rustix::fs::fstat(dir)?, rustix::fs::fstat(witness)?);
            if d.st_dev != w.st_dev {
                return Err(io::Error::other(
                    "the directory cannot be read (so not fsynced) and the file to sync its \
                     filesystem through is on another device",
                ));
            }
            Ok(rustix::fs::syncfs(witness)?)
        }
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn a_utf8_path_has_no_hex() {
        assert_eq!(path_hex(Path::new("/srv/state.db")), None);
    }

    #[test]
    fn a_non_utf8_path_round_trips_through_display_and_hex() {
        let path = Path::new(OsStr::from_bytes(b"/srv/st\xffate\x80.db"));
        let hex = path_hex(path).expect("not UTF-8");
        assert_eq!(hex, "2f7372762f7374ff617465802e6462");
        let back = path_from_parts(path_display(path), Some(&hex)).unwrap();
        assert_eq!(back, path);
    }

    #[test]
    fn malformed_hex_is_an_error() {
        assert!(path_from_parts("x".into(), Some("abc")).is_err());
        let e = path_from_parts("x".into(), Some("zz")).unwrap_err();
        assert_eq!(e.to_string(), r#"malformed hex path bytes for "x""#);
        assert_eq!(e.hex, "zz");
    }

    #[test]
    fn two_opens_of_one_directory_share_one_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let a = DirHandle::open_shared(dir.path()).unwrap();
        let b = DirHandle::open_shared(&dir.path().join(".")).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.current_path(), dir.path().canonicalize().unwrap());
    }

    /// A directory held `O_PATH` (one this process may write in but not list) cannot be `fsync`ed;
    /// it is synced through a readable descriptor of something made in it, never through one on
    /// another filesystem.
    #[test]
    fn a_directory_held_o_path_is_synced_through_its_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let path_only = rustix::fs::openat(
            CWD,
            dir.path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        assert!(is_path_only(path_only.as_fd()));
        assert_eq!(rustix::fs::fsync(&path_only), Err(rustix::io::Errno::BADF));
        rustix::fs::mkdirat(&path_only, "inside", Mode::from_raw_mode(0o755)).unwrap();
        let inside = open_dir(&path_only, Path::new("inside")).unwrap();
        sync_dir(path_only.as_fd(), inside.as_fd()).unwrap();
        let elsewhere = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(sync_dir(path_only.as_fd(), elsewhere.as_fd()).is_err());
        // A readable directory is fsynced itself, whatever the witness.
        let readable = open_dir(CWD, dir.path()).unwrap();
        assert!(!is_path_only(readable.as_fd()));
        sync_dir(readable.as_fd(), elsewhere.as_fd()).unwrap();
    }

    #[test]
    fn a_moved_directory_reports_where_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let before = dir.path().join("before");
        std::fs::create_dir(&before).unwrap();
        let handle = DirHandle::open_shared(&before).unwrap();
        let after = dir.path().join("after");
        std::fs::rename(&before, &after).unwrap();
        assert_eq!(handle.current_path(), after.canonicalize().unwrap());
    }
}
