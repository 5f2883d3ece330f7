//! The filesystem's state: the backing directory, the ids of its files, the open handles, the
//! durable [`Model`] and the steps seen; what [`crate::fs`] serves from.

use std::collections::HashMap;
use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::model::{Entries, Model};

/// The state shared between the FUSE thread and [`crate::LazyFs`].
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) backing: PathBuf,
    /// Where unlinked (and renamed-over) files are kept, as `<id>`, so that a power cut that
    /// undoes the unlink brings back the same inode, as a disk would: `<backing>.lazyfs-unlinked`.
    pub(crate) graveyard: PathBuf,
    /// The files in the graveyard (their `st_nlink` reads 0).
    pub(crate) buried: HashMap<u64, PathBuf>,
    pub(crate) model: Model,
    /// Backing inode number to id, for the files alive in the backing directory.
    pub(crate) ids: HashMap<u64, u64>,
    /// Id to path relative to the backing directory ("" for the root).
    pub(crate) paths: HashMap<u64, PathBuf>,
    pub(crate) next_id: u64,
    pub(crate) handles: HashMap<u64, Handle>,
    pub(crate) next_fh: u64,
    /// The durable steps performed, in order.
    pub(crate) steps: Vec<String>,
    /// The number of the step not to perform (1-based): the crash point.
    pub(crate) crash_before: Option<usize>,
    /// Set at the crash point: every operation fails with EIO from then on.
    pub(crate) frozen: bool,
}

#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) id: u64,
    pub(crate) file: File,
    pub(crate) sync_writes: bool,
}

impl Inner {
    /// The state of `backing`, everything in it durable.
    pub fn new(backing: PathBuf, crash_before: Option<usize>) -> std::io::Result<Self> {
        let mut name = backing.file_name().unwrap_or_default().to_os_string();
        name.push(".lazyfs-unlinked");
        let graveyard = backing.with_file_name(name);
        std::fs::create_dir_all(&graveyard)?;
        let mut inner = Inner {
            backing,
            graveyard,
            buried: HashMap::new(),
            model: Model::default(),
            ids: HashMap::new(),
            paths: HashMap::new(),
            next_id: 2,
            handles: HashMap::new(),
            next_fh: 1,
            steps: Vec::new(),
            crash_before,
            frozen: false,
        };
        let root_ino = std::fs::metadata(&inner.backing)?.ino();
        inner.ids.insert(root_ino, 1);
        inner.paths.insert(1, PathBuf::new());
        inner.model.root = 1;
        inner.model.dirs.insert(1);
        inner.baseline(1, PathBuf::new())?;
        Ok(inner)
    }

    pub(crate) fn baseline(&mut self, dir: u64, rel: PathBuf) -> std::io::Result<()> {
        let entries = self.listing(dir)?;
        for (name, &id) in &entries {
            let path = rel.join(name);
            if self.model.dirs.contains(&id) {
                self.baseline(id, path)?;
            } else {
                let bytes = std::fs::read(self.backing.join(&path))?;
                self.model.file_synced(id, bytes);
            }
        }
        self.model.dir_synced(dir, entries);
        Ok(())
    }

    /// The current entries of the directory `dir`, registering each.
    pub(crate) fn listing(&mut self, dir: u64) -> std::io::Result<Entries> {
        let rel = self
            .paths
            .get(&dir)
            .cloned()
            .ok_or(std::io::ErrorKind::NotFound)?;
        let mut entries = Entries::new();
        for entry in std::fs::read_dir(self.backing.join(&rel))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            let id = self.register(&meta, rel.join(entry.file_name()), false);
            entries.insert(entry.file_name(), id);
        }
        Ok(entries)
    }

    /// The id of a backing file (a fresh one when `created`, its inode number may be reused).
    pub(crate) fn register(&mut self, meta: &Metadata, rel: PathBuf, created: bool) -> u64 {
        let id = match self.ids.get(&meta.ino()) {
            Some(&id) if !created => id,
            _ => {
                let id = self.next_id;
                self.next_id += 1;
                self.ids.insert(meta.ino(), id);
                if meta.is_dir() {
                    self.model.dirs.insert(id);
                    self.model.strict.entry(id).or_default();
                    self.model.ordered.entry(id).or_default();
                }
                id
            }
        };
        self.paths.insert(id, rel);
        id
    }

    /// Where the file `ino` is in the backing filesystem now (the graveyard once unlinked).
    pub(crate) fn located(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        match self.buried.get(&ino.0) {
            Some(grave) => Ok(grave.clone()),
            None => Ok(self.backing.join(self.path(ino)?)),
        }
    }

    pub(crate) fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    pub(crate) fn attr(&self, id: u64, meta: &Metadata) -> FileAttr {
        let time = |secs: i64, nsecs: i64| {
            UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs.clamp(0, 999_999_999) as u32)
        };
        FileAttr {
            ino: INodeNo(id),
            size: meta.size(),
            blocks: meta.blocks(),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: SystemTime::UNIX_EPOCH,
            kind: FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: if self.buried.contains_key(&id) {
                0
            } else {
                meta.nlink() as u32
            },
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Counts a durable step; false when it is the crash point (then it must not be performed).
    pub(crate) fn step(&mut self, what: String) -> bool {
        if self.crash_before == Some(self.steps.len() + 1) {
            self.frozen = true;
            return false;
        }
        self.steps.push(what);
        true
    }

    pub(crate) fn name_of(&self, id: u64) -> String {
        match self.paths.get(&id) {
            Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
            Some(_) => ".".to_string(),
            None => format!("<id {id}>"),
        }
    }

    pub(crate) fn snapshot(&mut self, id: u64, file: &File) -> std::io::Result<()> {
        let len = file.metadata()?.len() as usize;
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, 0)?;
        self.model.file_synced(id, bytes);
        Ok(())
    }
}

impl Inner {
    /// Moves the file at `rel` (its last link) into the graveyard instead of freeing it; other
    /// links or a directory are removed for real.
    pub(crate) fn bury_or_remove(&mut self, rel: &Path) -> std::io::Result<()> {
        let path = self.backing.join(rel);
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            return std::fs::remove_dir(&path);
        }
        match self.ids.get(&meta.ino()) {
            Some(&id) if meta.nlink() == 1 => {
                let grave = self.graveyard.join(id.to_string());
                std::fs::rename(&path, &grave)?;
                self.buried.insert(id, grave);
                Ok(())
            }
            _ => std::fs::remove_file(&path),
        }
    }

    pub(crate) fn add_handle(&mut self, id: u64, file: File, flags: i32) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        let sync_writes = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        self.handles.insert(
            fh,
            Handle {
                id,
                file,
                sync_writes,
            },
        );
        fh
    }
}

/// Opens a backing file with the caller's access mode; `create` (a mode) for a creation.
pub(crate) fn open_backing(path: &Path, flags: i32, create: Option<u32>) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => options.read(true).write(true), // read: the fsync snapshot
        libc::O_RDWR => options.read(true).write(true),
        _ => options.read(true),
    };
    if let Some(mode) = create {
        options.mode(mode);
        if flags & libc::O_EXCL != 0 {
            options.create_new(true);
        } else {
            options.create(true);
        }
        if flags & libc::O_TRUNC != 0 {
            options.truncate(true);
        }
    }
    let passed = libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    options.custom_flags(flags & passed);
    options.open(path)
}
