//! File identities: the `(st_dev, st_ino)` pair that names one generation of a file, and the WAL
//! descriptor the guard keeps so a retired generation stays readable after its name is gone.

use std::fmt;
use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::AsFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The identity of one inode: what a pathname resolved to when the guard pinned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "[u64; 2]", into = "[u64; 2]")]
pub struct FileId {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
}

impl From<[u64; 2]> for FileId {
    fn from([dev, ino]: [u64; 2]) -> Self {
        FileId { dev, ino }
    }
}

impl From<FileId> for [u64; 2] {
    fn from(id: FileId) -> Self {
        [id.dev, id.ino]
    }
}

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dev {} ino {}", self.dev, self.ino)
    }
}

impl FileId {
    // st_dev / st_ino are narrower than u64 on some platforms.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn of(st: &rustix::fs::Stat) -> FileId {
        FileId {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }
}

/// The identity of the file `path` resolves to now (symbolic links followed); `Ok(None)` when
/// nothing is there.
pub fn identity_of_path(path: &Path) -> io::Result<Option<FileId>> {
    match rustix::fs::stat(path) {
        Ok(st) => Ok(Some(FileId::of(&st))),
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A file's identity and what changes whenever it is written: its size and its modification
/// and status-change times (the kernel sets both at every write; `st_ctime` cannot be set back
/// by anyone). Equal stamps taken at two moments mean no write in between, to the granularity of
/// the filesystem's timestamps (fine-grained once queried, on kernels with multigrain
/// timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// The inode.
    pub id: FileId,
    /// `st_size`.
    pub size: u64,
    /// `st_mtime`, seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// `st_ctime`, seconds and nanoseconds.
    pub ctime: (i64, i64),
    /// `st_nlink`: how many names the file has (a hard link is a second one).
    pub links: u64,
}

impl FileStamp {
    #[allow(clippy::unnecessary_cast)] // the fields' widths differ between platforms
    fn of(st: &rustix::fs::Stat) -> FileStamp {
        FileStamp {
            id: FileId::of(st),
            size: st.st_size as u64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
            links: st.st_nlink as u64,
        }
    }
}

/// The stamp of what `path` names now; `Ok(None)` when nothing does.
pub fn stamp_of_path(path: &Path) -> io::Result<Option<FileStamp>> {
    match rustix::fs::stat(path) {
        Ok(st) => Ok(Some(FileStamp::of(&st))),
        Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The identity of the file `name` names in the directory `dir` (not following a symbolic
/// link), and how many names (hard links) it has.
#[allow(clippy::unnecessary_cast)] // st_nlink's width differs between platforms
pub(crate) fn links_at<F: AsFd>(dir: F, name: &std::ffi::OsStr) -> io::Result<(FileId, u64)> {
    let st = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
    Ok((FileId::of(&st), st.st_nlink as u64))
}

/// What an open descriptor refers to.
pub fn identity_of_fd<F: AsFd>(fd: F) -> io::Result<FileId> {
    Ok(FileId::of(&rustix::fs::fstat(fd)?))
}

/// The WAL inode a generation is pinned to, and a descriptor that reaches it.
///
/// Where the guard can see into the wrapped file (the unix VFS), the descriptor is SQLite's own
/// (borrowed: no descriptor of the guard's while the generation is live); the guard takes one of
/// its own (a `dup`, [`PinnedWal::own`]) when the generation retires and again, at the latest,
/// before SQLite closes the WAL, so a retired generation stays readable after SQLite let go. For
/// a VFS it cannot see into, a read-only descriptor of its own from the start.
///
/// SQLite takes no POSIX lock on the WAL, so holding and closing a descriptor of our own on it
/// cannot drop a lock anybody relies on (unlike a second descriptor on the main file or `-shm`).
#[derive(Debug)]
pub struct PinnedWal {
    file: WalDescriptor,
    id: FileId,
}

/// Whose descriptor a [`PinnedWal`] reads through.
#[derive(Debug)]
pub enum WalDescriptor {
    /// The guard's own: closed when the pin is dropped.
    Own(File),
    /// SQLite's, never closed by the guard: valid only until SQLite closes the WAL, which the
    /// shim never lets happen before the pin is dropped or made [`PinnedWal::own`].
    Sqlite(ManuallyDrop<File>),
}

impl PinnedWal {
    /// Opens `path` read-only and pins whatever inode it resolves to now.
    pub fn open(path: &Path) -> io::Result<PinnedWal> {
        let file = File::open(path)?;
        let id = identity_of_fd(&file)?;
        Ok(PinnedWal {
            file: WalDescriptor::Own(file),
            id,
        })
    }

    /// Pins the inode `file` (SQLite's descriptor of the WAL, see [`WalDescriptor::Sqlite`]) refers
    /// to, if it is the file `path` names: else `None`, and the caller pins by path. `seen`: what
    /// `path` named just before SQLite opened it, when that was looked at; the same inode behind
    /// the descriptor means the open found it there, and the path is not asked again: an open makes
    /// no `stat` it does not need (what it names later is every later check's business).
    pub fn borrowed(
        file: ManuallyDrop<File>,
        path: &Path,
        seen: Option<FileId>,
    ) -> io::Result<Option<PinnedWal>> {
        let id = identity_of_fd(&*file)?;
        let at_path = match seen {
            Some(seen) if seen == id => Some(seen),
            _ => identity_of_path(path)?,
        };
        Ok((at_path == Some(id)).then_some(PinnedWal {
            file: WalDescriptor::Sqlite(file),
            id,
        }))
    }

    /// The pinned identity.
    pub fn id(&self) -> FileId {
        self.id
    }

    /// Makes the descriptor the guard's own: a `dup` (close-on-exec) of SQLite's, which outlives
    /// SQLite's close of the WAL. Nothing to do when it already is.
    pub fn own(&mut self) -> io::Result<()> {
        if let WalDescriptor::Sqlite(sqlite) = &self.file {
            self.file = WalDescriptor::Own(sqlite.try_clone()?);
        }
        Ok(())
    }

    /// The descriptor: reads through it reach the pinned inode whatever its name is now.
    pub fn file(&self) -> &File {
        match &self.file {
            WalDescriptor::Own(file) => file,
            WalDescriptor::Sqlite(file) => file,
        }
    }

    /// The pinned WAL's size now.
    pub fn size(&self) -> io::Result<u64> {
        Ok(self.file().metadata()?.len())
    }
}
